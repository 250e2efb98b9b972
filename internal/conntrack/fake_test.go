package conntrack

import (
	"context"
	"errors"
	"net/netip"
	"slices"
	"testing"
)

// fakeTable: 5 UDP replies from backend A, 2 from B, 1 TCP from A, 1 IPv6
// UDP from A6, interleaved so that deletions must keep the order of the
// rest.
func fakeTable() (f *Fake, a, b, a6 Backend) {
	a = Backend{IP: netip.MustParseAddr("10.244.1.5"), Port: 53}
	b = Backend{IP: netip.MustParseAddr("10.244.1.6")}
	a6 = Backend{IP: netip.MustParseAddr("fd00::5"), Port: 53}
	flow := func(proto uint8, client byte, be Backend, port uint16) Flow {
		c := netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, 1, 0, client}), 40000)
		dst := netip.MustParseAddrPort("10.96.0.10:53")
		if be.IP.Is6() {
			c = netip.AddrPortFrom(netip.MustParseAddr("fd00:1::1"), 40000)
			dst = netip.MustParseAddrPort("[fd00:96::10]:53")
		}
		return Flow{Proto: proto, OrigSrc: c, OrigDst: dst, ReplySrc: netip.AddrPortFrom(be.IP, port), ReplyDst: c, ID: uint32(client)}
	}
	f = NewFake(1000, 250)
	f.Flows = []Flow{
		flow(ProtoUDP, 1, a, 53), flow(ProtoUDP, 2, b, 53), flow(ProtoUDP, 3, a, 53), flow(ProtoTCP, 4, a, 53),
		flow(ProtoUDP, 5, a, 53), flow(ProtoUDP, 6, b, 5353), flow(ProtoUDP, 7, a, 53), flow(ProtoUDP, 8, a, 53),
		flow(ProtoUDP, 9, a6, 53),
	}
	return f, a, b, a6
}

func ids(flows []Flow) []uint32 {
	var out []uint32
	for _, f := range flows {
		out = append(out, f.ID)
	}
	return out
}

func TestFakeCountUDPByReplySource(t *testing.T) {
	ctx := context.Background()
	f, a, b, a6 := fakeTable()
	for _, tc := range []struct {
		name  string
		b     Backend
		limit int
		want  int
	}{
		{"all of A", a, 0, 5},
		{"A, limit 3: stops at limit+1", a, 3, 4},
		{"A, limit 5", a, 5, 5},
		{"B any port", b, 0, 2},
		{"B port 5353", Backend{IP: b.IP, Port: 5353}, 0, 1},
		{"IPv6", a6, 0, 1},
		{"none", Backend{IP: netip.MustParseAddr("10.244.9.9")}, 0, 0},
	} {
		if n, err := f.CountUDPByReplySource(ctx, tc.b, tc.limit); err != nil || n != tc.want {
			t.Errorf("%s: %d, %v; want %d", tc.name, n, err, tc.want)
		}
	}
	if _, err := f.CountUDPByReplySource(ctx, Backend{}, 0); err == nil {
		t.Error("invalid backend counted")
	}
	if len(f.Flows) != 9 {
		t.Errorf("counting changed the table: %v", ids(f.Flows))
	}
}

func TestFakeDeleteUDPByReplySource(t *testing.T) {
	ctx := context.Background()
	f, a, b, _ := fakeTable()
	res, err := f.DeleteUDPByReplySource(ctx, a, 3)
	if err != nil || res != (DeleteResult{Scanned: 5, Matched: 3, Deleted: 3, Truncated: true, KernelFiltered: true}) {
		t.Fatalf("limit 3: %+v, %v", res, err)
	}
	if got, want := ids(f.Flows), []uint32{2, 4, 6, 7, 8, 9}; !slices.Equal(got, want) {
		t.Fatalf("after deleting 3 of A: %v, want %v", got, want)
	}
	res, err = f.DeleteUDPByReplySource(ctx, b, 10)
	if err != nil || res != (DeleteResult{Scanned: 2, Matched: 2, Deleted: 2, KernelFiltered: true}) {
		t.Fatalf("B: %+v, %v", res, err)
	}
	if got, want := ids(f.Flows), []uint32{4, 7, 8, 9}; !slices.Equal(got, want) {
		t.Fatalf("after deleting B: %v, want %v", got, want)
	}
	if _, err := f.DeleteUDPByReplySource(ctx, a, 0); err == nil {
		t.Error("a delete without a limit ran")
	}
	f.InjectError("DeleteUDPByReplySource", errors.New("EPERM"))
	if _, err := f.DeleteUDPByReplySource(ctx, a, 10); err == nil || len(f.Flows) != 4 {
		t.Errorf("injected error: %v, table %v", err, ids(f.Flows))
	}
}

func TestFakeScans(t *testing.T) {
	ctx := context.Background()
	f, _, _, _ := fakeTable()
	collect := func(limit int, scan func(ctx context.Context, limit int, fn func(*Flow) error) (ScanResult, error)) ([]uint32, ScanResult, error) {
		var got []uint32
		res, err := scan(ctx, limit, func(fl *Flow) error {
			got = append(got, fl.ID)
			fl.ID = 999 // a copy: the table keeps its own
			return nil
		})
		return got, res, err
	}
	udp4 := func(ctx context.Context, limit int, fn func(*Flow) error) (ScanResult, error) {
		return f.ScanProtocol(ctx, false, ProtoUDP, limit, fn)
	}
	got, res, err := collect(100, udp4)
	if err != nil || !slices.Equal(got, []uint32{1, 2, 3, 5, 6, 7, 8}) || res != (ScanResult{Scanned: 7, KernelFiltered: true}) {
		t.Errorf("UDP/IPv4: %v %+v %v", got, res, err)
	}
	got, res, err = collect(7, udp4)
	if err != nil || len(got) != 7 || res.Truncated {
		t.Errorf("UDP/IPv4 at exactly the limit: %v %+v %v", got, res, err)
	}
	got, res, err = collect(3, udp4)
	if err != nil || !slices.Equal(got, []uint32{1, 2, 3}) || res != (ScanResult{Scanned: 3, Truncated: true, KernelFiltered: true}) {
		t.Errorf("UDP/IPv4 limit 3: %v %+v %v", got, res, err)
	}
	got, res, err = collect(100, func(ctx context.Context, limit int, fn func(*Flow) error) (ScanResult, error) {
		return f.ScanProtocol(ctx, true, ProtoUDP, limit, fn)
	})
	if err != nil || !slices.Equal(got, []uint32{9}) || res.Scanned != 1 {
		t.Errorf("UDP/IPv6: %v %+v %v", got, res, err)
	}
	got, res, err = collect(100, f.ScanTable)
	if err != nil || !slices.Equal(got, []uint32{1, 2, 3, 4, 5, 6, 7, 8, 9}) || res != (ScanResult{Scanned: 9}) {
		t.Errorf("table: %v %+v %v", got, res, err)
	}
	if !slices.Equal(ids(f.Flows), []uint32{1, 2, 3, 4, 5, 6, 7, 8, 9}) {
		t.Errorf("scans changed the table: %v", ids(f.Flows))
	}
	if _, _, err := collect(0, f.ScanTable); err == nil {
		t.Error("a scan without a limit ran")
	}

	// fn's error and a cancelled context stop the scan; the hook runs
	// before each entry handed out, unlocked (it may use the fake).
	boom := errors.New("boom")
	n := 0
	res, err = f.ScanTable(ctx, 100, func(*Flow) error {
		if n++; n == 2 {
			return boom
		}
		return nil
	})
	if !errors.Is(err, boom) || res.Scanned != 2 {
		t.Errorf("fn error: %+v %v", res, err)
	}
	cctx, cancel := context.WithCancel(ctx)
	var hooked []int
	f.ScanHook = func(i int) {
		hooked = append(hooked, i)
		if i == 3 {
			cancel()
		}
		_, _ = f.Max(ctx) // unlocked: no deadlock
	}
	res, err = f.ScanTable(cctx, 100, func(*Flow) error { return nil })
	if !errors.Is(err, context.Canceled) || res.Scanned != 3 || len(hooked) != 4 {
		t.Errorf("cancelled: %+v %v, hook calls %v", res, err, hooked)
	}
}
