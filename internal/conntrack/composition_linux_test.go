//go:build linux

package conntrack

import (
	"context"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// statusConfirmed (IPS_CONFIRMED) must be in a created entry's CTA_STATUS
// when it carries one: on 6.18 the new entry is already confirmed when its
// status is changed, and a status that clears the bit is refused (EBUSY).
const statusConfirmed = 1 << 3

// One AF_UNSPEC dump of a real table gives every entry of both families,
// with the status bits and TCP states the kernel keeps: the breakdown's
// classes and top destination are exact on a table with few keys.
func TestKernelComposition(t *testing.T) {
	fd, _ := newNetNS(t)
	s, err := openSock(fd)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	dns := netip.MustParseAddrPort("10.96.0.10:53")
	var flows []Flow
	for i := 0; i < 300; i++ { // UDP streams to one destination
		c := netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, 1, byte(i >> 8), byte(i)}), 40000)
		f := natFlow(ProtoUDP, c, dns, netip.MustParseAddrPort("10.0.1.1:53"))
		f.Status = StatusSeenReply | statusConfirmed
		flows = append(flows, f)
	}
	for i := 0; i < 40; i++ { // unreplied UDP
		c := netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, 2, 0, byte(i)}), 40000)
		flows = append(flows, natFlow(ProtoUDP, c, netip.MustParseAddrPort("10.96.0.11:514"), netip.MustParseAddrPort("10.0.1.2:514")))
	}
	for i := 0; i < 50; i++ { // TCP TIME_WAIT
		c := netip.AddrPortFrom(netip.MustParseAddr("10.3.0.1"), uint16(30000+i))
		f := natFlow(ProtoTCP, c, netip.MustParseAddrPort("10.96.0.1:443"), netip.MustParseAddrPort("10.0.1.3:6443"))
		f.Status, f.TCPState = StatusSeenReply|StatusAssured|statusConfirmed, TCPStateTimeWait
		flows = append(flows, f)
	}
	for i := 0; i < 10; i++ { // IPv6 UDP
		c := netip.AddrPortFrom(netip.MustParseAddr("fd00:1::9"), uint16(20000+i))
		flows = append(flows, natFlow(ProtoUDP, c, netip.MustParseAddrPort("[fd00:96::a]:53"), netip.MustParseAddrPort("[fd00:2::1]:53")))
	}
	for i := 0; i < len(flows); i += 100 {
		if err := s.createBatch(context.Background(), flows[i:min(i+100, len(flows))], 300); err != nil {
			t.Fatal(err)
		}
	}
	r := New(Config{NetNS: fd})
	comp, err := Compose(context.Background(), r, 3, 10_000)
	if err != nil {
		t.Fatal(err)
	}
	if comp.Total != 400 || comp.Truncated {
		t.Fatalf("composition %+v", comp)
	}
	for cl, n := range map[Class]uint64{ClassUDPStream: 300, ClassUDPUnreplied: 50, ClassTCPTimeWait: 50} {
		if got := comp.Count(cl); got != n {
			t.Errorf("%s: %d entries, want %d (%+v)", cl, got, n, comp.Classes)
		}
	}
	if h := comp.TopDestinations[0]; h.Endpoint.String() != "udp/10.96.0.10:53" || h.Count != 300 || h.MaxOvercount != 0 {
		t.Errorf("top destination %+v", h)
	}
	if h := comp.TopSources[0]; h.Endpoint.String() != "10.3.0.1" || h.Count != 50 {
		t.Errorf("top source %+v", h)
	}
	comp, err = Compose(context.Background(), r, 3, 100)
	if err != nil || comp.Total != 100 || !comp.Truncated {
		t.Errorf("limited composition %+v, %v", comp, err)
	}
}

// The timeouts are read and written in the adapter's namespace, never the
// host's: the namespace's file changes (read by a process inside it), the
// daemon's own does not.
func TestKernelTimeoutsInNetNS(t *testing.T) {
	fd, name := newNetNS(t)
	host, err := New(Config{}).Timeouts(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	r := New(Config{NetNS: fd})
	cur, err := r.Timeouts(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if cur.UDP == 0 || cur.UDPStream == 0 || cur.TCPTimeWait == 0 {
		t.Fatalf("timeouts %+v", cur)
	}
	if err := r.SetTimeouts(context.Background(), Timeouts{UDPStream: 37 * time.Second, TCPTimeWait: 41 * time.Second}); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command("ip", "netns", "exec", name, "cat", "/proc/sys/net/netfilter/nf_conntrack_udp_timeout_stream",
		"/proc/sys/net/netfilter/nf_conntrack_tcp_timeout_time_wait", "/proc/sys/net/netfilter/nf_conntrack_udp_timeout").CombinedOutput()
	if err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	if got, want := strings.Fields(string(out)), []string{"37", "41", itoa(cur.UDP)}; strings.Join(got, " ") != strings.Join(want, " ") {
		t.Errorf("in the namespace: %v, want %v", got, want)
	}
	after, err := New(Config{}).Timeouts(context.Background())
	if err != nil || after != host {
		t.Errorf("host timeouts changed: %+v -> %+v (%v)", host, after, err)
	}
	// No thread of the process is left in the namespace.
	proc, err := os.Readlink("/proc/self/ns/net")
	if err != nil {
		t.Fatal(err)
	}
	tasks, _ := os.ReadDir("/proc/self/task")
	for _, task := range tasks {
		if ns, err := os.Readlink("/proc/self/task/" + task.Name() + "/ns/net"); err == nil && ns != proc {
			t.Errorf("thread %s is in %s, the process in %s", task.Name(), ns, proc)
		}
	}
}

func itoa(d time.Duration) string {
	return strings.TrimSuffix((d / time.Second * time.Second).String(), "s")
}

// inNetNS runs fn on a thread inside the namespace fd (sockets created
// there stay in it), then returns the thread to the process's namespace.
func inNetNS(t *testing.T, fd int, fn func()) {
	t.Helper()
	done := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		orig, err := os.Open("/proc/thread-self/ns/net")
		if err != nil {
			runtime.UnlockOSThread()
			done <- err
			return
		}
		defer orig.Close()
		if err := unix.Setns(fd, unix.CLONE_NEWNET); err != nil {
			runtime.UnlockOSThread()
			done <- err
			return
		}
		fn()
		if err := unix.Setns(int(orig.Fd()), unix.CLONE_NEWNET); err == nil {
			runtime.UnlockOSThread()
		}
		done <- nil
	}()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

// Entries the kernel made from real traffic (not set over netlink): UDP
// conversations over the namespace's loopback that were answered are
// udp/stream, datagrams to a closed port udp/unreplied, and the top
// destination is the server.
func TestKernelCompositionRealUDPTraffic(t *testing.T) {
	fd, name := newNetNS(t)
	if _, err := exec.LookPath("nft"); err != nil {
		if os.Getenv("REMEDIATE_E2E_REQUIRED") != "" {
			t.Fatalf("REMEDIATE_E2E_REQUIRED is set but nft is missing: %v", err)
		}
		t.Skip("needs nft: a conntrack expression makes the namespace track its traffic")
	}
	for _, args := range [][]string{{"ip", "link", "set", "lo", "up"}, {"nft", "add table ip t"},
		{"nft", "add chain ip t out { type filter hook output priority 0; }"}, {"nft", "add rule ip t out ct state new counter"}} {
		if out, err := exec.Command("ip", append([]string{"netns", "exec", name}, args...)...).CombinedOutput(); err != nil {
			t.Fatalf("%v: %v: %s", args, err, out)
		}
	}
	var srv *net.UDPConn
	var clients []*net.UDPConn
	var closed *net.UDPAddr
	inNetNS(t, fd, func() {
		var err error
		if srv, err = net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)}); err != nil {
			t.Error(err)
			return
		}
		c, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)}) // bound, then closed: a closed port
		if err != nil {
			t.Error(err)
			return
		}
		closed = c.LocalAddr().(*net.UDPAddr)
		c.Close()
		for i := 0; i < 30; i++ {
			c, err := net.DialUDP("udp4", nil, srv.LocalAddr().(*net.UDPAddr))
			if err != nil {
				t.Error(err)
				return
			}
			clients = append(clients, c)
		}
		for i := 0; i < 7; i++ {
			c, err := net.DialUDP("udp4", nil, closed)
			if err != nil {
				t.Error(err)
				return
			}
			clients = append(clients, c)
		}
	})
	if t.Failed() {
		return
	}
	defer srv.Close()
	for _, c := range clients {
		defer c.Close()
	}
	go func() { // echo
		b := make([]byte, 64)
		for {
			n, from, err := srv.ReadFromUDP(b)
			if err != nil {
				return
			}
			_, _ = srv.WriteToUDP(b[:n], from)
		}
	}()
	for i, c := range clients {
		if _, err := c.Write([]byte("ping")); err != nil {
			t.Fatal(err)
		}
		if i < 30 {
			_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
			if _, err := c.Read(make([]byte, 64)); err != nil {
				t.Fatalf("client %d: %v", i, err)
			}
		}
	}
	comp, err := Compose(context.Background(), New(Config{NetNS: fd}), 3, 10_000)
	if err != nil {
		t.Fatal(err)
	}
	if comp.Count(ClassUDPStream) != 30 || comp.Count(ClassUDPUnreplied) != 7 {
		t.Errorf("classes %+v, want 30 udp/stream and 7 udp/unreplied", comp.Classes)
	}
	if h := comp.TopDestinations[0]; h.Endpoint.String() != "udp/"+srv.LocalAddr().String() || h.Count != 30 {
		t.Errorf("top destination %+v, want udp/%s x30", h, srv.LocalAddr())
	}
}
