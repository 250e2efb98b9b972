//go:build linux

package conntrack

import (
	"context"
	"net/netip"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"
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
