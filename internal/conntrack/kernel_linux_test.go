//go:build linux

package conntrack

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"sort"
	"sync/atomic"
	"testing"
	"time"

	"github.com/mdlayher/netlink"
	ticonntrack "github.com/ti-mo/conntrack"
	"golang.org/x/sys/unix"
)

var nsCounter atomic.Int32

// newNetNS creates a network namespace for the test and returns an open fd
// of it; the namespace is deleted when the test ends. It skips when not
// root or when nf_conntrack is unavailable.
func newNetNS(tb testing.TB) (fd int, name string) {
	tb.Helper()
	if os.Geteuid() != 0 {
		tb.Skip("needs root: creates a network namespace and conntrack entries in it")
	}
	if err := Available("/proc"); err != nil {
		tb.Skipf("needs nf_conntrack: %v", err)
	}
	if _, err := exec.LookPath("ip"); err != nil {
		tb.Skip("needs iproute2 (ip)")
	}
	name = fmt.Sprintf("rmd-ct-%d-%d", os.Getpid(), nsCounter.Add(1))
	if out, err := exec.Command("ip", "netns", "add", name).CombinedOutput(); err != nil {
		tb.Fatalf("ip netns add %s: %v: %s", name, err, out)
	}
	f, err := os.Open("/run/netns/" + name)
	if err != nil {
		_ = exec.Command("ip", "netns", "del", name).Run()
		tb.Fatalf("open netns: %v", err)
	}
	tb.Cleanup(func() {
		f.Close()
		if out, err := exec.Command("ip", "netns", "del", name).CombinedOutput(); err != nil {
			tb.Errorf("ip netns del %s: %v: %s", name, err, out)
		}
	})
	return int(f.Fd()), name
}

// natFlow builds a DNATed flow: client -> vip, answered by backend.
func natFlow(proto uint8, client, vip, backend netip.AddrPort) Flow {
	return Flow{Proto: proto, OrigSrc: client, OrigDst: vip, ReplySrc: backend, ReplyDst: client}
}

func tiFlow(f Flow) ticonntrack.Flow {
	var t ticonntrack.Flow
	t.Timeout = 300
	t.TupleOrig.IP.SourceAddress = f.OrigSrc.Addr()
	t.TupleOrig.IP.DestinationAddress = f.OrigDst.Addr()
	t.TupleOrig.Proto.Protocol = f.Proto
	t.TupleOrig.Proto.SourcePort = f.OrigSrc.Port()
	t.TupleOrig.Proto.DestinationPort = f.OrigDst.Port()
	t.TupleReply.IP.SourceAddress = f.ReplySrc.Addr()
	t.TupleReply.IP.DestinationAddress = f.ReplyDst.Addr()
	t.TupleReply.Proto.Protocol = f.Proto
	t.TupleReply.Proto.SourcePort = f.ReplySrc.Port()
	t.TupleReply.Proto.DestinationPort = f.ReplyDst.Port()
	return t
}

// key is a comparable identity for set comparisons.
func key(f Flow) string {
	return fmt.Sprintf("%d %s %s %s", f.Proto, f.OrigSrc, f.OrigDst, f.ReplySrc)
}

// tableKeys dumps the namespace's table with ti-mo (an independent decoder)
// and returns the sorted keys.
func tableKeys(t *testing.T, c *ticonntrack.Conn) []string {
	t.Helper()
	flows, err := c.Dump(nil)
	if err != nil {
		t.Fatalf("ti-mo dump: %v", err)
	}
	var out []string
	for _, tf := range flows {
		out = append(out, key(Flow{
			Proto:    tf.TupleOrig.Proto.Protocol,
			OrigSrc:  netip.AddrPortFrom(tf.TupleOrig.IP.SourceAddress, tf.TupleOrig.Proto.SourcePort),
			OrigDst:  netip.AddrPortFrom(tf.TupleOrig.IP.DestinationAddress, tf.TupleOrig.Proto.DestinationPort),
			ReplySrc: netip.AddrPortFrom(tf.TupleReply.IP.SourceAddress, tf.TupleReply.Proto.SourcePort),
		}))
	}
	sort.Strings(out)
	return out
}

type scenario struct {
	dead      []Flow // UDP, reply source deadIP:53
	deadOther []Flow // UDP, reply source deadIP:5353
	tcpDead   []Flow // TCP to the dead backend: must stay
	otherUDP  []Flow // UDP to another backend: must stay
	v6        []Flow // IPv6 UDP to another family: must stay
}

func (s scenario) all() []Flow {
	var out []Flow
	for _, l := range [][]Flow{s.dead, s.deadOther, s.tcpDead, s.otherUDP, s.v6} {
		out = append(out, l...)
	}
	return out
}

var (
	deadIP  = netip.MustParseAddr("10.0.1.1")
	aliveIP = netip.MustParseAddr("10.0.1.2")
	vip     = netip.MustParseAddrPort("10.96.0.10:53")
)

func buildScenario() scenario {
	var s scenario
	for i := 0; i < 40; i++ {
		c := netip.AddrPortFrom(netip.MustParseAddr("10.0.0.5"), uint16(20000+i))
		s.dead = append(s.dead, natFlow(ProtoUDP, c, vip, netip.AddrPortFrom(deadIP, 53)))
	}
	for i := 0; i < 7; i++ {
		c := netip.AddrPortFrom(netip.MustParseAddr("10.0.0.6"), uint16(21000+i))
		s.deadOther = append(s.deadOther, natFlow(ProtoUDP, c, netip.MustParseAddrPort("10.96.0.11:5353"), netip.AddrPortFrom(deadIP, 5353)))
	}
	for i := 0; i < 9; i++ {
		c := netip.AddrPortFrom(netip.MustParseAddr("10.0.0.7"), uint16(22000+i))
		s.tcpDead = append(s.tcpDead, natFlow(ProtoTCP, c, vip, netip.AddrPortFrom(deadIP, 53)))
	}
	for i := 0; i < 11; i++ {
		c := netip.AddrPortFrom(netip.MustParseAddr("10.0.0.8"), uint16(23000+i))
		s.otherUDP = append(s.otherUDP, natFlow(ProtoUDP, c, vip, netip.AddrPortFrom(aliveIP, 53)))
	}
	for i := 0; i < 3; i++ {
		c := netip.AddrPortFrom(netip.MustParseAddr("fd00::5"), uint16(24000+i))
		s.v6 = append(s.v6, natFlow(ProtoUDP, c, netip.MustParseAddrPort("[fd00:96::10]:53"), netip.MustParseAddrPort("[fd00:1::1]:53")))
	}
	return s
}

func keysOf(lists ...[]Flow) []string {
	var out []string
	for _, l := range lists {
		for _, f := range l {
			out = append(out, key(f))
		}
	}
	sort.Strings(out)
	return out
}

func equalKeys(t *testing.T, what string, got, want []string) {
	t.Helper()
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("%s:\n got %d entries %v\nwant %d entries %v", what, len(got), got, len(want), want)
	}
}

// setupTable creates the scenario in a fresh namespace with ti-mo's Create
// (an independent encoder) and returns the adapter and a ti-mo conn.
func setupTable(t *testing.T) (*Real, *ticonntrack.Conn, scenario) {
	fd, _ := newNetNS(t)
	c, err := ticonntrack.Dial(&netlink.Config{NetNS: fd})
	if err != nil {
		t.Fatalf("ti-mo dial: %v", err)
	}
	t.Cleanup(func() { c.Close() })
	s := buildScenario()
	for _, f := range s.all() {
		if err := c.Create(tiFlow(f)); err != nil {
			t.Fatalf("create %s: %v", f, err)
		}
	}
	return New(Config{NetNS: fd, DeleteBatch: 8}), c, s
}

func TestKernelUsageAndStats(t *testing.T) {
	r, _, s := setupTable(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	u, err := r.Usage(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if u.Count != uint64(len(s.all())) {
		t.Errorf("Count = %d, want %d (entries of the test namespace only)", u.Count, len(s.all()))
	}
	realMax, err := r.Max(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if u.Max != realMax || u.Max == 0 {
		t.Errorf("Max = %d, want nf_conntrack_max %d", u.Max, realMax)
	}
	st, err := r.Stats(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if st.CPUs < 1 {
		t.Errorf("Stats summed %d CPUs", st.CPUs)
	}
}

func TestKernelCountAndDeleteByBackendPort(t *testing.T) {
	t.Run("kernel-filter", func(t *testing.T) { testCountAndDelete(t, true) })
	// The path for kernels whose reply CTA_FILTER is missing or broken:
	// the whole family is streamed and matched in user space.
	t.Run("unfiltered", func(t *testing.T) { testCountAndDelete(t, false) })
}

func testCountAndDelete(t *testing.T, kernelFilter bool) {
	r, c, s := setupTable(t)
	r.cfg.NoKernelFilter = !kernelFilter
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	b := Backend{IP: deadIP, Port: 53}

	n, err := r.CountUDPByReplySource(ctx, b, 0)
	if err != nil || n != len(s.dead) {
		t.Fatalf("Count = %d, %v; want %d", n, err, len(s.dead))
	}
	if n, _ := r.CountUDPByReplySource(ctx, b, 5); n != 6 {
		t.Fatalf("Count with limit 5 = %d, want 6 (limit+1 says 'more')", n)
	}
	equalKeys(t, "count must not change the table", tableKeys(t, c), keysOf(s.all()))

	// Bounded: at most 15 this run.
	res, err := r.DeleteUDPByReplySource(ctx, b, 15)
	if err != nil {
		t.Fatal(err)
	}
	if res.Matched != 15 || res.Deleted != 15 || !res.Truncated {
		t.Fatalf("bounded delete = %+v, want 15 matched and deleted, truncated", res)
	}
	if res.KernelFiltered != kernelFilter {
		t.Errorf("KernelFiltered = %v, want %v: %+v", res.KernelFiltered, kernelFilter, res)
	}
	if n, _ := r.CountUDPByReplySource(ctx, b, 0); n != len(s.dead)-15 {
		t.Fatalf("after bounded delete %d remain, want %d", n, len(s.dead)-15)
	}
	res, err = r.DeleteUDPByReplySource(ctx, b, 1000)
	if err != nil {
		t.Fatal(err)
	}
	if res.Deleted != len(s.dead)-15 || res.Truncated || kernelFilter != (res.Scanned == res.Matched) {
		t.Fatalf("second delete = %+v, want %d deleted, scanned == matched only with the kernel filter", res, len(s.dead)-15)
	}
	equalKeys(t, "table after delete by backend IP:port", tableKeys(t, c),
		keysOf(s.deadOther, s.tcpDead, s.otherUDP, s.v6))

	// Without a port the other port of the same backend goes too.
	res, err = r.DeleteUDPByReplySource(ctx, Backend{IP: deadIP}, 1000)
	if err != nil || res.Deleted != len(s.deadOther) {
		t.Fatalf("delete by IP = %+v, %v; want %d deleted", res, err, len(s.deadOther))
	}
	equalKeys(t, "table after delete by backend IP", tableKeys(t, c), keysOf(s.tcpDead, s.otherUDP, s.v6))
}

func TestKernelDeleteIPv6(t *testing.T) {
	r, c, s := setupTable(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	res, err := r.DeleteUDPByReplySource(ctx, Backend{IP: netip.MustParseAddr("fd00:1::1")}, 100)
	if err != nil || res.Deleted != len(s.v6) {
		t.Fatalf("delete v6 = %+v, %v; want %d", res, err, len(s.v6))
	}
	equalKeys(t, "table after v6 delete", tableKeys(t, c), keysOf(s.dead, s.deadOther, s.tcpDead, s.otherUDP))
}

func TestKernelDeleteHonoursContext(t *testing.T) {
	r, c, s := setupTable(t)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := r.DeleteUDPByReplySource(ctx, Backend{IP: deadIP}, 100); err == nil {
		t.Fatal("delete with a cancelled context: want error")
	}
	equalKeys(t, "cancelled delete changed the table", tableKeys(t, c), keysOf(s.all()))
}

// A delete names the entry's CTA_ID: an entry that is not the one seen (here:
// same tuple, other id, as after the original expired and a new flow reused
// the tuple) is not deleted and counts as vanished.
func TestKernelDeleteChecksEntryID(t *testing.T) {
	r, c, s := setupTable(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	sock, err := openSock(r.cfg.NetNS)
	if err != nil {
		t.Fatal(err)
	}
	defer sock.Close()
	var seen []Flow
	if _, err := sock.dumpByReplySource(ctx, Backend{IP: deadIP, Port: 53}, true, func(f *Flow) error {
		seen = append(seen, *f)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if len(seen) != len(s.dead) {
		t.Fatalf("dump saw %d, want %d", len(seen), len(s.dead))
	}
	stale := seen[:3]
	stale[1].ID++ // not the entry the kernel holds under that tuple
	del, err := openSock(r.cfg.NetNS)
	if err != nil {
		t.Fatal(err)
	}
	defer del.Close()
	deleted, vanished, err := del.deleteBatch(ctx, stale)
	if err != nil || deleted != 2 || vanished != 1 {
		t.Fatalf("deleteBatch = %d deleted, %d vanished, %v; want 2, 1, nil", deleted, vanished, err)
	}
	if got := len(tableKeys(t, c)); got != len(s.all())-2 {
		t.Fatalf("table has %d entries, want %d", got, len(s.all())-2)
	}
}

// ScanProtocol returns exactly the entries of one family and protocol,
// filtered in the kernel by the original tuple's protocol (when the kernel
// filter is trusted) and unfiltered otherwise, and stops at its limit.
func TestKernelScanProtocol(t *testing.T) {
	r, _, s := setupTable(t)
	for _, kernelFilter := range []bool{true, false} {
		r.cfg.NoKernelFilter = !kernelFilter
		for _, tc := range []struct {
			v6    bool
			proto uint8
			want  []string
		}{
			{false, ProtoUDP, keysOf(s.dead, s.deadOther, s.otherUDP)},
			{false, ProtoTCP, keysOf(s.tcpDead)},
			{true, ProtoUDP, keysOf(s.v6)},
			{true, ProtoTCP, nil},
		} {
			var got []string
			res, err := r.ScanProtocol(context.Background(), tc.v6, tc.proto, 1000, func(f *Flow) error {
				got = append(got, key(*f))
				return nil
			})
			if err != nil {
				t.Fatal(err)
			}
			sort.Strings(got)
			equalKeys(t, fmt.Sprintf("filter=%v v6=%v proto=%d", kernelFilter, tc.v6, tc.proto), got, tc.want)
			if res.Scanned != len(tc.want) || res.Truncated {
				t.Errorf("filter=%v v6=%v proto=%d: %+v", kernelFilter, tc.v6, tc.proto, res)
			}
			if kernelFilter && len(tc.want) > 0 && !res.KernelFiltered && kernelFilterWorks(unameRelease(t)) {
				t.Errorf("filter=%v v6=%v proto=%d: the kernel did not mark the dump filtered", kernelFilter, tc.v6, tc.proto)
			}
		}
	}
	r.cfg.NoKernelFilter = false
	res, err := r.ScanProtocol(context.Background(), false, ProtoUDP, 10, func(*Flow) error { return nil })
	if err != nil || res.Scanned != 10 || !res.Truncated {
		t.Fatalf("limited scan: %+v, %v", res, err)
	}
}

func unameRelease(t *testing.T) string {
	var uts unix.Utsname
	if err := unix.Uname(&uts); err != nil {
		t.Fatal(err)
	}
	return unix.ByteSliceToString(uts.Release[:])
}
