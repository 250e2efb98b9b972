package action

import (
	"context"
	"errors"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/remediate-dev/remediate/detect"
	"github.com/remediate-dev/remediate/internal/conntrack"
	"github.com/remediate-dev/remediate/internal/conntrack/conntracktest"
	"github.com/remediate-dev/remediate/internal/finding"
	"github.com/remediate-dev/remediate/policy"
)

func defaultCTTimeoutParams() SetConntrackTimeoutsParams {
	t, _ := Lookup(SetConntrackTimeoutsName)
	return *t.NewParams().(*SetConntrackTimeoutsParams)
}

// composition builds a breakdown with n entries per class and one top
// destination.
func composition(classes map[conntrack.Class]uint64) conntrack.Composition {
	c := conntrack.Composition{SketchCapacity: 64}
	for cl, n := range classes {
		c.Total += n
		c.Classes = append(c.Classes, conntrack.ClassCount{Class: cl, Count: n})
	}
	c.TopDestinations = []conntrack.HeavyHitter{{Endpoint: conntrack.Endpoint{Proto: conntrack.ProtoUDP, Addr: netip.MustParseAddr("10.96.0.10"), Port: 53}, Count: c.Total / 2}}
	return c
}

func TestSetConntrackTimeoutsParamsValidate(t *testing.T) {
	def := defaultCTTimeoutParams()
	if errs := def.Validate(); len(errs) != 0 {
		t.Fatalf("defaults invalid: %v", errs)
	}
	for _, tc := range []struct {
		name  string
		mut   func(p *SetConntrackTimeoutsParams)
		field string
	}{
		{"udp below floor", func(p *SetConntrackTimeoutsParams) { p.UDPStreamTimeout = policy.D(29 * time.Second) }, "udpStreamTimeout"},
		{"time_wait below floor", func(p *SetConntrackTimeoutsParams) { p.TCPTimeWaitTimeout = policy.D(10 * time.Second) }, "tcpTimeWaitTimeout"},
		{"fractional seconds", func(p *SetConntrackTimeoutsParams) { p.UDPStreamTimeout = policy.D(45500 * time.Millisecond) }, "udpStreamTimeout"},
		{"above an hour", func(p *SetConntrackTimeoutsParams) { p.TCPTimeWaitTimeout = policy.D(2 * time.Hour) }, "tcpTimeWaitTimeout"},
		{"nothing to do", func(p *SetConntrackTimeoutsParams) {
			p.UDPStreamTimeout, p.TCPTimeWaitTimeout = policy.D(0), policy.D(0)
		}, "udpStreamTimeout"},
		{"minShare too low", func(p *SetConntrackTimeoutsParams) { p.MinShare = 0.1 }, "minShare"},
		{"minShare above 1", func(p *SetConntrackTimeoutsParams) { p.MinShare = 1.5 }, "minShare"},
	} {
		p := defaultCTTimeoutParams()
		tc.mut(&p)
		if errs := p.Validate(); len(errs) != 1 || errs[0].Field != tc.field {
			t.Errorf("%s: errors %v, want one on %s", tc.name, errs, tc.field)
		}
	}
}

func TestConntrackTimeoutChange(t *testing.T) {
	s := func(n int) time.Duration { return time.Duration(n) * time.Second }
	kernel := conntrack.Timeouts{UDP: s(30), UDPStream: s(120), TCPTimeWait: s(120)}
	p := defaultCTTimeoutParams() // 60 s, 60 s, minShare 0.5
	only := func(udp, tw int) SetConntrackTimeoutsParams {
		q := p
		q.UDPStreamTimeout, q.TCPTimeWaitTimeout = policy.D(s(udp)), policy.D(s(tw))
		return q
	}
	for _, tc := range []struct {
		name    string
		comp    conntrack.Composition
		cur     conntrack.Timeouts
		p       SetConntrackTimeoutsParams
		want    conntrack.Timeouts
		ok      bool
		whyHas  string
		restore string
	}{
		{name: "udp streams dominate", comp: composition(map[conntrack.Class]uint64{conntrack.ClassUDPStream: 800, "tcp/ESTABLISHED": 200}),
			cur: kernel, p: p, want: conntrack.Timeouts{UDPStream: s(60)}, ok: true,
			restore: "sysctl -w net.netfilter.nf_conntrack_udp_timeout_stream=120"},
		{name: "time_wait dominates", comp: composition(map[conntrack.Class]uint64{conntrack.ClassTCPTimeWait: 600, conntrack.ClassUDPStream: 400}),
			cur: kernel, p: p, want: conntrack.Timeouts{TCPTimeWait: s(60)}, ok: true,
			restore: "sysctl -w net.netfilter.nf_conntrack_tcp_timeout_time_wait=120"},
		{name: "both at a low minShare", comp: composition(map[conntrack.Class]uint64{conntrack.ClassTCPTimeWait: 450, conntrack.ClassUDPStream: 550}),
			cur: kernel, p: func() SetConntrackTimeoutsParams { q := p; q.MinShare = 0.4; return q }(), want: conntrack.Timeouts{UDPStream: s(60), TCPTimeWait: s(60)}, ok: true,
			restore: "sysctl -w net.netfilter.nf_conntrack_udp_timeout_stream=120 net.netfilter.nf_conntrack_tcp_timeout_time_wait=120"},
		{name: "nothing dominates", comp: composition(map[conntrack.Class]uint64{conntrack.ClassUDPStream: 400, conntrack.ClassTCPTimeWait: 300, "tcp/ESTABLISHED": 300}),
			cur: kernel, p: p, whyHas: "udp/stream holds 40% of the table (below minShare 50%)"},
		{name: "unreplied UDP is not a stream: udp_timeout_stream would not help", comp: composition(map[conntrack.Class]uint64{conntrack.ClassUDPUnreplied: 900, conntrack.ClassUDPStream: 100}),
			cur: kernel, p: p, whyHas: "udp/stream holds 10%"},
		{name: "established TCP: no timeout of ours", comp: composition(map[conntrack.Class]uint64{"tcp/ESTABLISHED": 1000}),
			cur: kernel, p: p, whyHas: "no class whose timeout this action tunes dominates"},
		{name: "already low: never raised", comp: composition(map[conntrack.Class]uint64{conntrack.ClassUDPStream: 1000}),
			cur: conntrack.Timeouts{UDP: s(30), UDPStream: s(45), TCPTimeWait: s(120)}, p: p, whyHas: "already 45s"},
		{name: "equal: nothing to do", comp: composition(map[conntrack.Class]uint64{conntrack.ClassUDPStream: 1000}),
			cur: conntrack.Timeouts{UDP: s(30), UDPStream: s(60), TCPTimeWait: s(120)}, p: p, whyHas: "already 1m0s"},
		{name: "never below the unreplied timeout", comp: composition(map[conntrack.Class]uint64{conntrack.ClassUDPStream: 1000}),
			cur: conntrack.Timeouts{UDP: s(90), UDPStream: s(180), TCPTimeWait: s(120)}, p: p, want: conntrack.Timeouts{UDPStream: s(90)}, ok: true,
			restore: "sysctl -w net.netfilter.nf_conntrack_udp_timeout_stream=180"},
		{name: "floor even when the policy is hand-made below it", comp: composition(map[conntrack.Class]uint64{conntrack.ClassUDPStream: 1000}),
			cur: kernel, p: only(5, 0), want: conntrack.Timeouts{UDPStream: s(30)}, ok: true},
		{name: "class off in the policy", comp: composition(map[conntrack.Class]uint64{conntrack.ClassUDPStream: 1000}),
			cur: kernel, p: only(0, 60), whyHas: "tcp/TIME_WAIT holds 0% of the table"},
		{name: "no breakdown", comp: conntrack.Composition{}, cur: kernel, p: p, whyHas: "has no breakdown"},
		{name: "partial breakdown too small", comp: func() conntrack.Composition {
			c := composition(map[conntrack.Class]uint64{conntrack.ClassUDPStream: 9000})
			c.Truncated = true
			return c
		}(), cur: kernel, p: p, whyHas: "too small a sample"},
		{name: "partial breakdown large enough", comp: func() conntrack.Composition {
			c := composition(map[conntrack.Class]uint64{conntrack.ClassUDPStream: 20000})
			c.Truncated = true
			return c
		}(), cur: kernel, p: p, want: conntrack.Timeouts{UDPStream: s(60)}, ok: true},
	} {
		set, why, ok := ConntrackTimeoutChange(tc.comp, tc.cur, tc.p)
		if ok != tc.ok || set != tc.want || !strings.Contains(why, tc.whyHas) {
			t.Errorf("%s: got %+v %q %v, want %+v (reason with %q) %v", tc.name, set, why, ok, tc.want, tc.whyHas, tc.ok)
		}
		if ok && tc.restore != "" {
			if got := previousOf(tc.cur, set).RestoreCommand(); got != tc.restore {
				t.Errorf("%s: restore %q, want %q", tc.name, got, tc.restore)
			}
		}
	}
}

func newCTTimeouts(t *testing.T, f *conntrack.Fake) Action {
	t.Helper()
	ty, _ := Lookup(SetConntrackTimeoutsName)
	a, err := ty.New(ty.NewParams(), conntracktest.Node(f))
	if err != nil {
		t.Fatal(err)
	}
	return a
}

func udpFullFinding() finding.Finding {
	fd := finding.Finding{Detector: detect.ConntrackExhaustionName, Target: detect.ConntrackTableTarget, Evidence: map[string]any{"max": 1000, "count": 950}}
	composition(map[conntrack.Class]uint64{conntrack.ClassUDPStream: 900, "tcp/ESTABLISHED": 50}).PutEvidence(fd.Evidence)
	return withRefs(fd)
}

// Plan changes nothing; Execute lowers, reads back and journals the undo;
// a second run finds nothing to do; refusals are skips, not failures.
func TestSetConntrackTimeoutsPlanExecute(t *testing.T) {
	ctx := context.Background()
	f := conntrack.NewFake(1000, 250)
	a := newCTTimeouts(t, f)
	p, err := a.Plan(ctx, udpFullFinding())
	if err != nil || p.Summary != "lower nf_conntrack_udp_timeout_stream 2m0s -> 1m0s (undo: sysctl -w net.netfilter.nf_conntrack_udp_timeout_stream=120)" {
		t.Fatalf("plan %+v, %v", p, err)
	}
	if p.Details["restoreCommand"] != "sysctl -w net.netfilter.nf_conntrack_udp_timeout_stream=120" || p.Details["topDestination"] != "udp/10.96.0.10:53" ||
		p.Details["previousUDPStreamSeconds"] != int64(120) || p.Details["udpStreamShare"] != 0.947 {
		t.Errorf("plan details %+v", p.Details)
	}
	if f.Calls["SetTimeouts"] != 0 || f.TimeoutsValue.UDPStream != 120*time.Second {
		t.Fatalf("plan changed something: %+v", f.TimeoutsValue)
	}
	res, err := a.Execute(ctx, udpFullFinding())
	if err != nil || f.TimeoutsValue.UDPStream != 60*time.Second || f.TimeoutsValue.TCPTimeWait != 120*time.Second || res.Details["udpStreamSeconds"] != int64(60) {
		t.Fatalf("execute %+v, %v; timeouts %+v", res, err, f.TimeoutsValue)
	}
	if _, err := a.Execute(ctx, udpFullFinding()); err == nil {
		t.Error("a second run changed something again")
	} else if why, ok := finding.IsSkip(err); !ok || !strings.Contains(why, "already 1m0s") {
		t.Errorf("second run: %v", err)
	}

	// The kernel does not take the write: verification fails.
	f = conntrack.NewFake(1000, 250)
	f.IgnoreSetTimeouts = true
	if _, err := newCTTimeouts(t, f).Execute(ctx, udpFullFinding()); err == nil || !strings.Contains(err.Error(), "did not take") {
		t.Errorf("unverified write: %v", err)
	}
	f = conntrack.NewFake(1000, 250)
	f.InjectError("SetTimeouts", errors.New("EACCES"))
	if _, err := newCTTimeouts(t, f).Execute(ctx, udpFullFinding()); err == nil || !strings.Contains(err.Error(), "undo: sysctl -w") {
		t.Errorf("failed write: %v", err)
	}

	for name, fd := range map[string]finding.Finding{
		"drift finding": {Detector: detect.ConntrackExhaustionName, Target: detect.ConntrackDriftTarget, Evidence: map[string]any{}},
		"no breakdown":  {Detector: detect.ConntrackExhaustionName, Target: detect.ConntrackTableTarget, Evidence: map[string]any{"max": 1000}},
		"bad breakdown": {Detector: detect.ConntrackExhaustionName, Target: detect.ConntrackTableTarget, Evidence: map[string]any{conntrack.EvidenceComposition: "garbage"}},
	} {
		f := conntrack.NewFake(1000, 250)
		if _, err := newCTTimeouts(t, f).Plan(ctx, withRefs(fd)); err == nil {
			t.Errorf("%s: planned", name)
		} else if _, ok := finding.IsSkip(err); !ok {
			t.Errorf("%s: %v is not a skip", name, err)
		}
		if f.Calls["SetTimeouts"] != 0 {
			t.Errorf("%s: wrote", name)
		}
	}
	if _, err := newCTTimeouts(t, nil).Plan(ctx, udpFullFinding()); err == nil {
		t.Error("planned without conntrack")
	}
}
