package action

import (
	"context"
	"encoding/json"
	"errors"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/remediate-dev/remediate/detect"
	"github.com/remediate-dev/remediate/internal/conntrack"
	"github.com/remediate-dev/remediate/internal/finding"
	"github.com/remediate-dev/remediate/internal/node"
)

func defaultRaiseParams() RaiseConntrackMaxParams {
	t, _ := Lookup(RaiseConntrackMaxName)
	return *t.NewParams().(*RaiseConntrackMaxParams)
}

func TestRaiseConntrackMaxParamsValidate(t *testing.T) {
	if errs := (&RaiseConntrackMaxParams{Factor: 2, Ceiling: 1 << 20, MemoryFraction: 0.05, BytesPerEntry: 320}).Validate(); len(errs) != 0 {
		t.Fatalf("valid params rejected: %v", errs)
	}
	for _, tc := range []struct {
		mut   func(p *RaiseConntrackMaxParams)
		field string
	}{
		{func(p *RaiseConntrackMaxParams) { p.Factor = 1 }, "factor"},
		{func(p *RaiseConntrackMaxParams) { p.Factor = 100 }, "factor"},
		{func(p *RaiseConntrackMaxParams) { p.Ceiling = 10 }, "ceiling"},
		{func(p *RaiseConntrackMaxParams) { p.Ceiling = 1 << 40 }, "ceiling"},
		{func(p *RaiseConntrackMaxParams) { p.MemoryFraction = 0 }, "memoryFraction"},
		{func(p *RaiseConntrackMaxParams) { p.MemoryFraction = 0.9 }, "memoryFraction"},
		{func(p *RaiseConntrackMaxParams) { p.BytesPerEntry = 8 }, "bytesPerEntry"},
	} {
		p := defaultRaiseParams()
		tc.mut(&p)
		if errs := p.Validate(); len(errs) != 1 || errs[0].Field != tc.field {
			t.Errorf("errors %v, want one on %s", errs, tc.field)
		}
	}
	// A step makes the factor irrelevant.
	p := defaultRaiseParams()
	p.Factor, p.Step = 0, 65536
	if errs := p.Validate(); len(errs) != 0 {
		t.Errorf("step-only params rejected: %v", errs)
	}
	if errs := (&FlushConntrackParams{MaxEntries: 0}).Validate(); len(errs) != 1 {
		t.Errorf("maxEntries 0 accepted")
	}
}

func TestPlanConntrackMax(t *testing.T) {
	p := defaultRaiseParams() // ceiling 1Mi, 5% memory, 320 B
	const gib = 1 << 30
	for _, tc := range []struct {
		name             string
		cur, target, mem uint64
		hash             uint64
		wantNew, wantH   uint64
		ok               bool
	}{
		{"double", 131072, 262144, 16 * gib, 32768, 262144, 65536, true},
		{"ceiling caps", 786432, 1572864, 64 * gib, 196608, 1 << 20, 1 << 18, true},
		// 1 GiB * 5% / 320 B = 167772 entries.
		{"memory caps", 131072, 262144, gib, 32768, 167772, 41943, true},
		{"memory below current: refuse, never lower", 262144, 524288, gib, 65536, 0, 0, false},
		{"at ceiling", 1 << 20, 1 << 21, 64 * gib, 1 << 18, 0, 0, false},
		{"target not above current", 262144, 200000, 64 * gib, 65536, 0, 0, false},
		{"hashsize never lowered", 131072, 262144, 16 * gib, 100000, 262144, 100000, true},
	} {
		mp, reason, ok := planConntrackMax(p, tc.cur, tc.target, tc.mem, tc.hash)
		if ok != tc.ok {
			t.Errorf("%s: ok = %v (%s), want %v", tc.name, ok, reason, tc.ok)
			continue
		}
		if !ok {
			if reason == "" {
				t.Errorf("%s: refusal without a reason", tc.name)
			}
			continue
		}
		if mp.New != tc.wantNew || mp.HashNew != tc.wantH || mp.New <= tc.cur || mp.HashNew < tc.hash {
			t.Errorf("%s: new %d hash %d, want %d %d", tc.name, mp.New, mp.HashNew, tc.wantNew, tc.wantH)
		}
	}
	noHash := p
	noHash.RaiseHashsize = false
	if mp, _, _ := planConntrackMax(noHash, 131072, 262144, 16*gib, 32768); mp.RaiseHash || mp.HashNew != 32768 {
		t.Errorf("raiseHashsize false still changes hashsize: %+v", mp)
	}
}

func newRaise(t *testing.T, f *conntrack.Fake, mem uint64, mut func(p *RaiseConntrackMaxParams)) Action {
	t.Helper()
	typ, _ := Lookup(RaiseConntrackMaxName)
	p := typ.NewParams().(*RaiseConntrackMaxParams)
	if mut != nil {
		mut(p)
	}
	a, err := typ.New(p, &node.Node{Conntrack: f})
	if err != nil {
		t.Fatal(err)
	}
	a.(*raiseConntrackMax).memTotal = func(context.Context) (uint64, error) { return mem, nil }
	return a
}

func tableFinding(max uint64) finding.Finding {
	return withRefs(finding.Finding{Detector: detect.ConntrackExhaustionName, Target: detect.ConntrackTableTarget,
		Evidence: map[string]any{"max": max, "count": max}})
}

func TestRaiseConntrackMaxPlanThenExecute(t *testing.T) {
	ctx := context.Background()
	f := conntrack.NewFake(131072, 32768)
	a := newRaise(t, f, 16<<30, nil)
	fd := tableFinding(131072)

	p, err := a.Plan(ctx, fd)
	if err != nil || !strings.Contains(p.Summary, "raise nf_conntrack_max from 131072 to 262144") {
		t.Fatalf("plan = %+v, %v", p, err)
	}
	if f.MaxValue != 131072 || f.Calls["SetMax"] != 0 {
		t.Fatal("Plan changed something")
	}
	r, err := a.Execute(ctx, fd)
	if err != nil {
		t.Fatal(err)
	}
	if f.MaxValue != 262144 || f.HashSizeValue != 65536 || r.Details["previousMax"] != uint64(131072) || r.Details["previousHashSize"] != uint64(32768) {
		t.Fatalf("after execute: max %d hash %d details %v", f.MaxValue, f.HashSizeValue, r.Details)
	}
	if rec, ok, _ := f.LastSetMax(ctx); !ok || rec.Max != 262144 {
		t.Fatalf("record = %+v %v", rec, ok)
	}
	// The same (now stale) finding again: someone already raised it.
	if _, err := a.Execute(ctx, fd); !isSkip(err) || f.MaxValue != 262144 {
		t.Fatalf("stale finding: err %v, max %d", err, f.MaxValue)
	}
}

func TestRaiseConntrackMaxStepAndBounds(t *testing.T) {
	ctx := context.Background()
	f := conntrack.NewFake(1000000, 250000)
	a := newRaise(t, f, 64<<30, func(p *RaiseConntrackMaxParams) { p.Step = 100000 })
	r, err := a.Execute(ctx, tableFinding(1000000))
	if err != nil || f.MaxValue != 1<<20 || !strings.Contains(r.Summary, "capped") {
		t.Fatalf("step capped at ceiling: %+v, %v, max %d", r, err, f.MaxValue)
	}
	if _, err := a.Execute(ctx, tableFinding(1<<20)); !isSkip(err) {
		t.Fatalf("at ceiling: want skip, got %v", err)
	}
}

func TestRaiseConntrackMaxRestoresAfterDrift(t *testing.T) {
	ctx := context.Background()
	f := conntrack.NewFake(131072, 32768)
	a := newRaise(t, f, 16<<30, nil)
	drift := withRefs(finding.Finding{Target: detect.ConntrackDriftTarget, Evidence: map[string]any{"max": uint64(131072), "lastSetMax": uint64(393216)}})
	r, err := a.Execute(ctx, drift)
	if err != nil || f.MaxValue != 393216 || !strings.Contains(r.Summary, "restoring") {
		t.Fatalf("restore: %+v, %v, max %d", r, err, f.MaxValue)
	}
	if _, err := a.Plan(ctx, finding.Finding{Target: detect.ConntrackDriftTarget}); !isSkip(err) {
		t.Fatalf("drift without evidence: %v", err)
	}
}

func TestRaiseConntrackMaxFailures(t *testing.T) {
	ctx := context.Background()
	f := conntrack.NewFake(131072, 32768)
	f.InjectError("SetMax", errors.New("permission denied"))
	a := newRaise(t, f, 16<<30, nil)
	if _, err := a.Execute(ctx, tableFinding(131072)); err == nil || isSkip(err) {
		t.Fatalf("write failure must fail: %v", err)
	}
	f.InjectError("SetMax", nil)
	f.InjectError("SetHashSize", errors.New("read-only file system"))
	r, err := a.Execute(ctx, tableFinding(131072))
	if err != nil || f.MaxValue != 262144 || r.Details["hashSizeError"] == nil || !strings.Contains(r.Summary, "hashsize NOT changed") {
		t.Fatalf("hashsize failure: %+v, %v", r, err)
	}
	typ, _ := Lookup(RaiseConntrackMaxName)
	na, _ := typ.New(typ.NewParams(), &node.Node{Unavailable: map[string]string{"conntrack": "no nf_conntrack"}})
	if _, err := na.Plan(ctx, tableFinding(1)); !isSkip(err) {
		t.Fatalf("nil adapter: %v", err)
	}
}

func isSkip(err error) bool { _, ok := finding.IsSkip(err); return ok }

func udpFlow(client, backend string) conntrack.Flow {
	c := netip.MustParseAddrPort(client)
	return conntrack.Flow{Proto: conntrack.ProtoUDP, OrigSrc: c, OrigDst: netip.MustParseAddrPort("10.96.0.10:53"),
		ReplySrc: netip.MustParseAddrPort(backend), ReplyDst: c}
}

// TestBackendOf: FlushConntrack reads the backend from the finding's
// typed reference (decoded here from evidence as its detector writes it)
// and refuses a TCP one, a finding with none, and an invalid backend.
func TestBackendOf(t *testing.T) {
	var num json.Number = "53"
	for _, tc := range []struct {
		ev   map[string]any
		want string
		err  bool
	}{
		{map[string]any{"backendIP": "10.0.1.1"}, "10.0.1.1", false},
		{map[string]any{"backendIP": "10.0.1.1", "backendPort": 53}, "10.0.1.1:53", false},
		{map[string]any{"backendIP": "10.0.1.1", "backendPort": float64(53)}, "10.0.1.1:53", false},
		{map[string]any{"backendIP": "10.0.1.1", "backendPort": num}, "10.0.1.1:53", false},
		{map[string]any{"backendIP": "10.0.1.1", "backendPort": "53", "protocol": "UDP"}, "10.0.1.1:53", false},
		{map[string]any{"backendIP": "fd00::1", "backendPort": uint16(53)}, "[fd00::1]:53", false},
		{map[string]any{"backendIP": "::ffff:10.0.1.1"}, "10.0.1.1", false},
		{map[string]any{"backendIP": "10.0.1.1", "protocol": "TCP"}, "", true},
		{map[string]any{}, "", true},
		{map[string]any{"backendIP": 42}, "", true},
		{map[string]any{"backendIP": "not-an-ip"}, "", true},
		{map[string]any{"backendIP": "0.0.0.0"}, "", true},
		{map[string]any{"backendIP": "10.0.1.1", "backendPort": 70000}, "", true},
		{map[string]any{"backendIP": "10.0.1.1", "backendPort": -1}, "", true},
		{map[string]any{"backendIP": "10.0.1.1", "backendPort": 53.5}, "", true},
	} {
		b, err := backendOf(withRefs(finding.Finding{Evidence: tc.ev}))
		if (err != nil) != tc.err || (!tc.err && b.String() != tc.want) {
			t.Errorf("%v: got %s, %v; want %s (error %v)", tc.ev, b, err, tc.want, tc.err)
		}
	}
	zero := finding.Finding{Subject: finding.Subject{Refs: []finding.Ref{conntrack.BackendRef{Backend: conntrack.Backend{IP: netip.MustParseAddr("0.0.0.0")}}}}}
	if _, err := backendOf(zero); err == nil {
		t.Error("an unspecified backend address in the reference is accepted")
	}
	if _, err := backendOf(finding.Finding{Evidence: map[string]any{"backendIP": "10.0.1.1"}}); err == nil || !strings.Contains(err.Error(), "no backend reference") {
		t.Errorf("evidence without a reference: %v, want refused", err)
	}
}

func TestFlushConntrackPlanAndExecute(t *testing.T) {
	ctx := context.Background()
	f := conntrack.NewFake(262144, 65536)
	for i := 0; i < 5; i++ {
		f.Flows = append(f.Flows, udpFlow("10.0.0.5:2000"+string(rune('0'+i)), "10.0.1.1:53"))
	}
	f.Flows = append(f.Flows, udpFlow("10.0.0.6:3000", "10.0.1.2:53"), udpFlow("10.0.0.6:3001", "10.0.1.1:5353"))
	tcp := udpFlow("10.0.0.7:4000", "10.0.1.1:53")
	tcp.Proto = conntrack.ProtoTCP
	f.Flows = append(f.Flows, tcp)

	typ, _ := Lookup(FlushConntrackName)
	a, err := typ.New(&FlushConntrackParams{MaxEntries: 3}, &node.Node{Conntrack: f})
	if err != nil {
		t.Fatal(err)
	}
	fd := withRefs(finding.Finding{Target: "ipvs-rs/UDP/10.96.0.10:53/10.0.1.1:53", Evidence: map[string]any{"backendIP": "10.0.1.1", "backendPort": 53}})
	p, err := a.Plan(ctx, fd)
	if err != nil || !strings.Contains(p.Summary, "delete 3") || !strings.Contains(p.Summary, "more than 3") || len(f.Flows) != 8 {
		t.Fatalf("plan = %+v, %v (table %d)", p, err, len(f.Flows))
	}
	r, err := a.Execute(ctx, fd)
	if err != nil || r.Details["deleted"] != 3 || r.Details["truncated"] != true || len(f.Flows) != 5 {
		t.Fatalf("first run = %+v, %v (table %d)", r, err, len(f.Flows))
	}
	r, err = a.Execute(ctx, fd)
	if err != nil || r.Details["deleted"] != 2 || r.Details["truncated"] != false || len(f.Flows) != 3 {
		t.Fatalf("second run = %+v, %v (table %d)", r, err, len(f.Flows))
	}
	// What is left: the other backend, the other port, the TCP entry.
	for _, fl := range f.Flows {
		if fl.Proto == conntrack.ProtoUDP && fl.ReplySrc == netip.MustParseAddrPort("10.0.1.1:53") {
			t.Fatalf("entry of the dead backend left: %s", fl)
		}
	}
	if _, err := a.Plan(ctx, fd); !isSkip(err) {
		t.Fatalf("nothing left: plan should skip, got %v", err)
	}
	// A finding that carries its detector's count of this cycle
	// (ConntrackStaleServiceEntries' Subject.Conntrack.Entries) is planned
	// from it: the table is not dumped a second time.
	counts := f.Calls["CountUDPByReplySource"]
	seen := withRefs(finding.Finding{Detector: "ConntrackStaleServiceEntries", Evidence: map[string]any{"backendIP": "10.0.1.2", "backendPort": 53},
		Subject: finding.Subject{Kind: finding.KindConntrackBackend, Conntrack: &finding.Conntrack{Entries: 1}}})
	if p, err := a.Plan(ctx, seen); err != nil || !strings.Contains(p.Summary, "1 seen by ConntrackStaleServiceEntries this cycle") || p.Details["seenByDetector"] != 1 {
		t.Fatalf("plan from the detector's count = %+v, %v", p, err)
	}
	if f.Calls["CountUDPByReplySource"] != counts {
		t.Fatal("planning from the detector's count dumped the table")
	}
	if _, err := a.Execute(ctx, withRefs(finding.Finding{Evidence: map[string]any{"backendIP": "10.0.1.1", "protocol": "tcp"}})); !isSkip(err) || len(f.Flows) != 3 {
		t.Fatalf("TCP finding: %v", err)
	}
	// The node's own address (a hostNetwork backend) needs a port.
	a.(*flushConntrack).isLocal = func(ip netip.Addr) (bool, error) { return ip == netip.MustParseAddr("10.0.1.2"), nil }
	if _, err := a.Execute(ctx, withRefs(finding.Finding{Evidence: map[string]any{"backendIP": "10.0.1.2"}})); !isSkip(err) || len(f.Flows) != 3 {
		t.Fatalf("node address without port: %v (table %d)", err, len(f.Flows))
	}
	if r, err := a.Execute(ctx, withRefs(finding.Finding{Evidence: map[string]any{"backendIP": "10.0.1.2", "backendPort": 53}})); err != nil || r.Details["deleted"] != 1 {
		t.Fatalf("node address with port: %+v, %v", r, err)
	}
	if _, err := localAddr(netip.MustParseAddr("127.0.0.1")); err != nil {
		t.Fatal(err)
	}
	if l, _ := localAddr(netip.MustParseAddr("127.0.0.1")); !l {
		t.Fatal("loopback is local")
	}
	f.InjectError("DeleteUDPByReplySource", errors.New("netlink: EPERM"))
	if _, err := a.Execute(ctx, withRefs(finding.Finding{Evidence: map[string]any{"backendIP": "10.0.1.3"}})); err == nil || isSkip(err) {
		t.Fatalf("adapter error must fail: %v", err)
	}
}

// Node memory is read through the configured proc root.
func TestHostMemTotalUsesProcRoot(t *testing.T) {
	root := t.TempDir()
	if err := os.WriteFile(filepath.Join(root, "meminfo"), []byte("MemTotal:        2048000 kB\nMemFree:         1024000 kB\nMemAvailable:    1500000 kB\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	got, err := hostMemTotal(root)(context.Background())
	if err != nil || got != 2048000*1024 {
		t.Fatalf("MemTotal = %d, %v; want %d", got, err, 2048000*1024)
	}
}
