package detect

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	clocktesting "k8s.io/utils/clock/testing"

	"github.com/remediate-dev/remediate/internal/conntrack"
	"github.com/remediate-dev/remediate/internal/conntrack/conntracktest"
	"github.com/remediate-dev/remediate/internal/finding"
	"github.com/remediate-dev/remediate/internal/node"
)

func defaultCTParams() ConntrackExhaustionParams {
	t, _ := Lookup(ConntrackExhaustionName)
	return *t.NewParams().(*ConntrackExhaustionParams)
}

func TestConntrackParamsValidate(t *testing.T) {
	ok := defaultCTParams()
	if errs := ok.Validate(); len(errs) != 0 {
		t.Fatalf("defaults invalid: %v", errs)
	}
	for _, tc := range []struct {
		name  string
		mut   func(p *ConntrackExhaustionParams)
		field string
	}{
		{"zero utilization", func(p *ConntrackExhaustionParams) { p.UtilizationThreshold = 0 }, "utilizationThreshold"},
		{"utilization above 1", func(p *ConntrackExhaustionParams) { p.UtilizationThreshold = 1.5 }, "utilizationThreshold"},
		{"critical below warning", func(p *ConntrackExhaustionParams) { p.CriticalUtilization = 0.5 }, "criticalUtilization"},
		{"critical above 1", func(p *ConntrackExhaustionParams) { p.CriticalUtilization = 2 }, "criticalUtilization"},
		{"negative drop rate", func(p *ConntrackExhaustionParams) { p.DropRateThreshold = -1 }, "dropRateThreshold"},
		{"negative insert_failed rate", func(p *ConntrackExhaustionParams) { p.InsertFailedRateThreshold = -0.1 }, "insertFailedRateThreshold"},
		{"topN 0", func(p *ConntrackExhaustionParams) { p.TopN = 0 }, "topN"},
		{"topN 21", func(p *ConntrackExhaustionParams) { p.TopN = 21 }, "topN"},
		{"tiny breakdown limit", func(p *ConntrackExhaustionParams) { p.BreakdownMaxEntries = 10 }, "breakdownMaxEntries"},
	} {
		p := defaultCTParams()
		tc.mut(&p)
		errs := p.Validate()
		if len(errs) != 1 || errs[0].Field != tc.field {
			t.Errorf("%s: errors %v, want one on %s", tc.name, errs, tc.field)
		}
	}
}

func TestConntrackRates(t *testing.T) {
	t0 := time.Unix(1000, 0)
	s := func(at time.Time, drop, early, ins uint64) ctSample {
		return ctSample{at: at, stats: conntrack.Stats{Drop: drop, EarlyDrop: early, InsertFailed: ins}}
	}
	prev := s(t0, 10, 20, 30)
	for _, tc := range []struct {
		name string
		prev *ctSample
		cur  ctSample
		want ctRates
		ok   bool
	}{
		{"first sample", nil, s(t0, 1, 1, 1), ctRates{}, false},
		{"no time elapsed", &prev, s(t0, 20, 20, 30), ctRates{}, false},
		{"counter reset", &prev, s(t0.Add(10*time.Second), 5, 20, 30), ctRates{}, false},
		{"rates", &prev, s(t0.Add(10*time.Second), 30, 25, 130), ctRates{Drop: 2, EarlyDrop: 0.5, InsertFailed: 10}, true},
		{"idle", &prev, s(t0.Add(time.Minute), 10, 20, 30), ctRates{}, true},
	} {
		got, ok := conntrackRates(tc.prev, tc.cur)
		if ok != tc.ok || got != tc.want {
			t.Errorf("%s: got %+v %v, want %+v %v", tc.name, got, ok, tc.want, tc.ok)
		}
	}
}

func TestJudgeConntrack(t *testing.T) {
	p := defaultCTParams()
	u := func(c, m uint64) conntrack.Usage { return conntrack.Usage{Count: c, Max: m} }
	for _, tc := range []struct {
		name      string
		u         conntrack.Usage
		r         ctRates
		haveRates bool
		reasons   int
		sev       finding.Severity
	}{
		{"healthy", u(1000, 262144), ctRates{}, true, 0, ""},
		{"just below", u(79, 100), ctRates{}, false, 0, ""},
		{"at threshold", u(80, 100), ctRates{}, false, 1, finding.Warning},
		{"critical", u(96, 100), ctRates{}, false, 1, finding.Critical},
		{"max unknown", u(96, 0), ctRates{}, false, 0, ""},
		{"drops make it critical", u(10, 100), ctRates{EarlyDrop: 0.2}, true, 1, finding.Critical},
		{"drops ignored without rates", u(10, 100), ctRates{EarlyDrop: 5}, false, 0, ""},
		{"insert_failed warns", u(10, 100), ctRates{InsertFailed: 3}, true, 1, finding.Warning},
		{"small insert_failed ok", u(10, 100), ctRates{InsertFailed: 0.5}, true, 0, ""},
		{"all", u(99, 100), ctRates{Drop: 1, InsertFailed: 5}, true, 3, finding.Critical},
	} {
		reasons, sev := judgeConntrack(p, tc.u, tc.r, tc.haveRates)
		if len(reasons) != tc.reasons || sev != tc.sev {
			t.Errorf("%s: reasons %q severity %q, want %d reasons, %q", tc.name, reasons, sev, tc.reasons, tc.sev)
		}
	}
	off := p
	off.DropRateThreshold, off.InsertFailedRateThreshold = 0, 0
	if r, _ := judgeConntrack(off, u(1, 100), ctRates{Drop: 100, InsertFailed: 100}, true); len(r) != 0 {
		t.Errorf("disabled rate checks still report %q", r)
	}
}

func newCTDetector(t *testing.T, f *conntrack.Fake, clk *clocktesting.FakePassiveClock) Detector {
	t.Helper()
	typ, _ := Lookup(ConntrackExhaustionName)
	n := conntracktest.Node(f)
	n.Clock = clk
	d, err := typ.New(typ.NewParams(), n)
	if err != nil {
		t.Fatal(err)
	}
	return d
}

func TestConntrackExhaustionDetect(t *testing.T) {
	ctx := context.Background()
	clk := clocktesting.NewFakePassiveClock(time.Unix(1_800_000_000, 0))
	f := conntrack.NewFake(1000, 250)
	d := newCTDetector(t, f, clk)

	// Healthy, first cycle.
	f.ExtraCount = 100
	if got, err := d.Detect(ctx); err != nil || len(got) != 0 {
		t.Fatalf("healthy: %v, %v", got, err)
	}
	// Filling up, drops start: 30 early drops in 30 s = 1/s.
	f.ExtraCount = 900
	f.StatsValue.EarlyDrop = 30
	clk.SetTime(clk.Now().Add(30 * time.Second))
	got, err := d.Detect(ctx)
	if err != nil || len(got) != 1 {
		t.Fatalf("full: %v, %v", got, err)
	}
	fd := got[0]
	if fd.Target != ConntrackTableTarget || fd.Severity != finding.Critical || fd.Evidence["max"] != uint64(1000) ||
		fd.Evidence["utilization"] != 0.9 || fd.Evidence["earlyDropRate"] != 1.0 {
		t.Fatalf("finding = %+v", fd)
	}
	// Drops stopped, still above threshold: warning.
	clk.SetTime(clk.Now().Add(30 * time.Second))
	got, _ = d.Detect(ctx)
	if len(got) != 1 || got[0].Severity != finding.Warning || got[0].Evidence["dropRate"] != 0.0 {
		t.Fatalf("no more drops: %+v", got)
	}
}

func TestConntrackExhaustionDrift(t *testing.T) {
	ctx := context.Background()
	clk := clocktesting.NewFakePassiveClock(time.Unix(1_800_000_000, 0))
	f := conntrack.NewFake(131072, 32768)
	d := newCTDetector(t, f, clk)
	if err := f.SetMax(ctx, 262144); err != nil { // what RaiseConntrackMax did
		t.Fatal(err)
	}
	if got, _ := d.Detect(ctx); len(got) != 0 {
		t.Fatalf("no drift yet: %+v", got)
	}
	f.Do(func(f *conntrack.Fake) { f.MaxValue = 131072 }) // kube-proxy restarted
	got, err := d.Detect(ctx)
	if err != nil || len(got) != 1 || got[0].Target != ConntrackDriftTarget || got[0].Evidence["lastSetMax"] != uint64(262144) {
		t.Fatalf("drift: %+v, %v", got, err)
	}
	// A record that cannot be read does not hide the rest.
	f.InjectError("LastSetMax", errors.New("corrupt"))
	if got, err := d.Detect(ctx); err != nil || len(got) != 0 {
		t.Fatalf("unreadable record: %+v, %v", got, err)
	}
}

func TestConntrackExhaustionSkipsAndErrors(t *testing.T) {
	clk := clocktesting.NewFakePassiveClock(time.Now())
	_, err := newCTDetector(t, nil, clk).Detect(context.Background())
	if reason, ok := finding.IsSkip(err); !ok || reason != "nf_conntrack is not loaded" {
		t.Fatalf("nil adapter: %v", err)
	}
	f := conntrack.NewFake(100, 25)
	f.InjectError("Usage", errors.New("netlink: EPERM"))
	if _, err := newCTDetector(t, f, clk).Detect(context.Background()); err == nil {
		t.Fatal("usage error must be an error (could not tell)")
	}
}

// The breakdown is computed only when the table is at or above the
// threshold (an idle table is never dumped), names what fills it, and a
// failed dump leaves the finding without it.
func TestConntrackExhaustionBreakdown(t *testing.T) {
	ctx := context.Background()
	clk := clocktesting.NewFakePassiveClock(time.Unix(1_800_000_000, 0))
	f := conntrack.NewFake(100, 25)
	d := newCTDetector(t, f, clk)
	add := func(n int, proto uint8, client, dst string, state uint8) {
		f.Flows = append(f.Flows, conntracktest.Flows(n, conntracktest.Spec{Proto: proto, Client: client, Dst: dst,
			Status: conntrack.StatusSeenReply, TCPState: state})...)
	}
	add(30, conntrack.ProtoUDP, "10.1.0.1:40000", "10.96.0.10:53", 0)
	add(10, conntrack.ProtoTCP, "10.1.0.2:40000", "10.96.0.1:443", conntrack.TCPStateTimeWait)
	if got, err := d.Detect(ctx); err != nil || len(got) != 0 || f.Calls["ScanTable"] != 0 {
		t.Fatalf("40%% full: %v, %v; %d dumps (want none)", got, err, f.Calls["ScanTable"])
	}
	add(50, conntrack.ProtoUDP, "10.1.0.3:40000", "10.96.0.10:53", 0)
	got, err := d.Detect(ctx)
	if err != nil || len(got) != 1 || f.Calls["ScanTable"] != 1 {
		t.Fatalf("90%% full: %v, %v; %d dumps", got, err, f.Calls["ScanTable"])
	}
	comp, ok, err := conntrack.DecodeComposition(got[0].Evidence)
	if err != nil || !ok {
		t.Fatalf("no breakdown in %+v: %v", got[0].Evidence, err)
	}
	if comp.Total != 90 || comp.Count(conntrack.ClassUDPStream) != 80 || comp.TopDestinations[0].Endpoint.String() != "udp/10.96.0.10:53" {
		t.Errorf("breakdown %+v", comp)
	}
	if want := "filled by udp/stream 89%, tcp/TIME_WAIT 11%; top destination udp/10.96.0.10:53 (80 entries, 89%)"; !strings.Contains(got[0].Message, want) {
		t.Errorf("message %q lacks %q", got[0].Message, want)
	}
	f.InjectError("ScanTable", errors.New("netlink: boom"))
	got, err = d.Detect(ctx)
	if err != nil || len(got) != 1 || got[0].Evidence["breakdownError"] != "conntrack breakdown: netlink: boom" {
		t.Fatalf("failed dump: %+v, %v", got, err)
	}
	if _, ok, _ := conntrack.DecodeComposition(got[0].Evidence); ok {
		t.Error("a failed dump still gave a breakdown")
	}
	f.InjectError("ScanTable", nil)
	p := defaultCTParams()
	p.Breakdown = false
	d2, err := newConntrackExhaustion(&p, &node.Node{Conntrack: f, Clock: clk})
	if err != nil {
		t.Fatal(err)
	}
	before := f.Calls["ScanTable"]
	if got, _ := d2.Detect(ctx); len(got) != 1 || f.Calls["ScanTable"] != before {
		t.Errorf("breakdown: false still dumped (%d -> %d)", before, f.Calls["ScanTable"])
	}
}

// A dump slower than half the detector's deadline gives a partial
// breakdown (said so), never a detector that times out and loses the
// finding.
func TestConntrackExhaustionBreakdownDeadline(t *testing.T) {
	clk := clocktesting.NewFakePassiveClock(time.Unix(1_800_000_000, 0))
	f := conntrack.NewFake(100, 25)
	f.Flows = conntracktest.Flows(95, conntracktest.Spec{Proto: conntrack.ProtoUDP, Client: "10.1.0.1:40000", Dst: "10.96.0.10:53", Status: conntrack.StatusSeenReply})
	f.ScanHook = func(n int) {
		if n == 10 {
			time.Sleep(300 * time.Millisecond) // past half of the 400 ms below
		}
	}
	d := newCTDetector(t, f, clk)
	ctx, cancel := context.WithTimeout(context.Background(), 400*time.Millisecond)
	defer cancel()
	got, err := d.Detect(ctx)
	if err != nil || len(got) != 1 {
		t.Fatalf("detect: %v, %v", got, err)
	}
	comp, ok, _ := conntrack.DecodeComposition(got[0].Evidence)
	if !ok || !comp.Truncated || comp.Total != 10 || comp.Count(conntrack.ClassUDPStream) != 10 {
		t.Fatalf("partial breakdown %+v (%v)", comp, ok)
	}
	if e, _ := got[0].Evidence["breakdownError"].(string); !strings.Contains(e, "stopped after 10 entries") ||
		!strings.Contains(got[0].Message, "filled by (first 10 entries) udp/stream 100%") {
		t.Errorf("evidence %q, message %q", e, got[0].Message)
	}
}
