package detect

import (
	"context"
	"net/netip"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/remediate-dev/remediate/internal/cluster"
	"github.com/remediate-dev/remediate/internal/cluster/clustertest"
	"github.com/remediate-dev/remediate/internal/finding"
	"github.com/remediate-dev/remediate/internal/node"
	"github.com/remediate-dev/remediate/internal/probe"
	"github.com/remediate-dev/remediate/internal/probe/probetest"
	"github.com/remediate-dev/remediate/policy"
)

const (
	spAPIVIP     = "10.96.0.1:443"
	spAPIBackend = "192.168.0.10:6443"
)

func spKubernetes() (cluster.Service, cluster.Endpoint) {
	return cluster.Service{Namespace: "default", Name: "kubernetes", ClusterIPs: []string{"10.96.0.1"},
			Ports: []cluster.ServicePort{{Name: "https", Protocol: "TCP", Port: 443}}},
		cluster.Endpoint{Address: "192.168.0.10", Port: 6443, Protocol: "TCP", PortName: "https", Ready: true, Serving: true}
}

func spCanary(ns, name, vip string, backends ...string) (cluster.Service, []cluster.Endpoint) {
	s := cluster.Service{Namespace: ns, Name: name, ClusterIPs: []string{vip},
		Ports: []cluster.ServicePort{{Name: "dns", Protocol: "UDP", Port: 53}, {Name: "http", Protocol: "TCP", Port: 80}}}
	var eps []cluster.Endpoint
	for _, b := range backends {
		eps = append(eps, cluster.Endpoint{Address: b, Port: 8080, Protocol: "TCP", PortName: "http", Ready: true, Serving: true, NodeName: "node2"})
	}
	return s, eps
}

type spFixture struct {
	view  *clustertest.Fake
	dial  *probetest.Fake
	clock *clocktesting.FakeClock
	n     *node.Node
}

func newSPFixture() *spFixture {
	clk := clocktesting.NewFakeClock(time.Unix(1_800_000_000, 0))
	f := &spFixture{view: clustertest.New(clk.Now()), dial: probetest.New(), clock: clk}
	s, e := spKubernetes()
	f.view.SetService(s, e)
	f.n = &node.Node{Name: "node1", Clock: clk, Log: zap.NewNop(), Cluster: f.view, Probe: f.dial}
	return f
}

func (f *spFixture) detector(t *testing.T, tweak func(*ServicePathProbeParams)) *servicePath {
	t.Helper()
	d := newDetector(t, ServicePathProbeName, f.n, func(p any) {
		if tweak != nil {
			tweak(p.(*ServicePathProbeParams))
		}
	}).(*servicePath)
	d.pause = func(context.Context, time.Duration) error { return nil }
	return d
}

func (f *spFixture) run(t *testing.T, d Detector) []finding.Finding {
	t.Helper()
	fs, err := d.Detect(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return fs
}

func addrs(ss ...string) []netip.AddrPort {
	var out []netip.AddrPort
	for _, s := range ss {
		out = append(out, netip.MustParseAddrPort(s))
	}
	return out
}

func sameAddrs(t *testing.T, what string, got []netip.AddrPort, want ...string) {
	t.Helper()
	w := addrs(want...)
	if len(got) != len(w) {
		t.Fatalf("%s: connects %v, want %v", what, got, w)
	}
	for i := range w {
		if got[i] != w[i] {
			t.Fatalf("%s: connects %v, want %v", what, got, w)
		}
	}
}

func TestServicePathHealthy(t *testing.T) {
	f := newSPFixture()
	d := f.detector(t, nil)
	if fs := f.run(t, d); len(fs) != 0 {
		t.Fatalf("healthy: %+v", fs)
	}
	sameAddrs(t, "healthy", f.dial.Calls(), spAPIVIP) // one connect, no direct one
	if j := d.Judged(); !strings.Contains(j, "1 of 1 Service paths answer") || !strings.Contains(j, "default/kubernetes 10.96.0.1:443 connected") {
		t.Fatalf("judged %q", j)
	}
	// Again within minPeriod: no connect, the last judgement.
	f.clock.Step(5 * time.Second)
	if fs := f.run(t, d); len(fs) != 0 {
		t.Fatalf("within minPeriod: %+v", fs)
	}
	sameAddrs(t, "within minPeriod", f.dial.Calls())
	if j := d.Judged(); !strings.Contains(j, "1 of 1 Service paths answer") || !strings.Contains(j, "probed 5s ago; not again within minPeriod 10s") {
		t.Fatalf("judged %q", j)
	}
}

// The Service path dropped while the backend answers: critical, judged in
// one run of a fresh detector (as --once), naming the Service, the backend
// and both results.
func TestServicePathDataplaneFault(t *testing.T) {
	f := newSPFixture()
	f.dial.Set(spAPIVIP, probe.Timeout)
	d := f.detector(t, nil)
	fs := f.run(t, d)
	sameAddrs(t, "fault", f.dial.Calls(), spAPIVIP, spAPIVIP, spAPIBackend)
	if len(fs) != 1 {
		t.Fatalf("findings %+v", fs)
	}
	g := fs[0]
	if g.Severity != finding.Critical || g.Target != "service-path/IPv4/default/kubernetes:443" || g.Detector != ServicePathProbeName {
		t.Fatalf("finding %+v", g)
	}
	for _, want := range []string{"default/kubernetes", "10.96.0.1:443", "timeout after 2s", "2 consecutive", spAPIBackend + " connected in 1ms"} {
		if !strings.Contains(g.Message, want) {
			t.Errorf("message lacks %q: %s", want, g.Message)
		}
	}
	if g.Evidence["verdict"] != "dataplane" || g.Evidence["consecutiveFailures"] != 2 || g.Evidence["backendsUsable"] != 1 {
		t.Fatalf("evidence %v", g.Evidence)
	}
	if sr := g.Evidence["serviceResult"].(spResultEvidence); sr.Outcome != "timeout" || sr.Addr != spAPIVIP || sr.LatencyMs != 2000 {
		t.Fatalf("service result %+v", sr)
	}

	// Next run (after minPeriod): already confirmed, one Service connect
	// and the direct one.
	f.clock.Step(10 * time.Second)
	if fs := f.run(t, d); len(fs) != 1 || fs[0].Severity != finding.Critical {
		t.Fatalf("second run %+v", fs)
	}
	sameAddrs(t, "confirmed", f.dial.Calls(), spAPIVIP, spAPIBackend)

	// Sooner than minPeriod: the same finding, no connect.
	f.clock.Step(3 * time.Second)
	if fs := f.run(t, d); len(fs) != 1 || fs[0].Severity != finding.Critical {
		t.Fatalf("within minPeriod %+v", fs)
	}
	sameAddrs(t, "within minPeriod", f.dial.Calls())

	// Fixed: clears at the next run.
	f.clock.Step(10 * time.Second)
	f.dial.Set(spAPIVIP, probe.Connected)
	if fs := f.run(t, d); len(fs) != 0 {
		t.Fatalf("fixed: %+v", fs)
	}
	sameAddrs(t, "fixed", f.dial.Calls(), spAPIVIP)
}

func TestServicePathBackendDown(t *testing.T) {
	f := newSPFixture()
	f.dial.Set(spAPIVIP, probe.Refused)
	f.dial.Set(spAPIBackend, probe.Refused)
	fs := f.run(t, f.detector(t, nil))
	if len(fs) != 1 || fs[0].Severity != finding.Warning || fs[0].Evidence["verdict"] != "backend" {
		t.Fatalf("both fail: %+v", fs)
	}
	if m := fs[0].Message; !strings.Contains(m, "a backend problem, not the Service dataplane") || !strings.Contains(m, spAPIBackend+" refused") {
		t.Fatalf("message %s", m)
	}
}

// One lost connect is not a finding: the confirming connect answers.
func TestServicePathOneFailureConfirmedAway(t *testing.T) {
	f := newSPFixture()
	f.dial.Sequence(spAPIVIP, probe.Timeout)
	d := f.detector(t, nil)
	if fs := f.run(t, d); len(fs) != 0 {
		t.Fatalf("%+v", fs)
	}
	sameAddrs(t, "recovered", f.dial.Calls(), spAPIVIP, spAPIVIP)
	if !strings.Contains(d.Judged(), "answered after 1 failed connect") {
		t.Fatalf("judged %q", d.Judged())
	}
	// failures: 1 judges the first failing connect.
	f.dial.Sequence(spAPIVIP, probe.Timeout)
	fs := f.run(t, f.detector(t, func(p *ServicePathProbeParams) { p.Failures = 1 }))
	if len(fs) != 1 || fs[0].Severity != finding.Critical {
		t.Fatalf("failures 1: %+v", fs)
	}
}

// Never more than maxConnects per run; the paths that do not fit are
// probed first in the next run, and a judged finding stays reported while
// its path waits.
func TestServicePathBudgetAndRotation(t *testing.T) {
	f := newSPFixture()
	for _, c := range []struct{ name, vip, be string }{{"a", "10.96.1.1", "10.244.1.1"}, {"b", "10.96.1.2", "10.244.1.2"}} {
		s, eps := spCanary("team", c.name, c.vip, c.be)
		f.view.SetService(s, eps...)
		f.dial.Set(c.vip+":80", probe.Timeout)
	}
	f.dial.Set(spAPIVIP, probe.Timeout)
	d := f.detector(t, func(p *ServicePathProbeParams) { p.Canaries = []string{"team/a", "team/b/http"} })
	runs := [][]string{
		{spAPIVIP, spAPIVIP, spAPIBackend, "10.96.1.1:80"},                     // kubernetes judged; a: 1 failure
		{"10.96.1.1:80", "10.244.1.1:8080", "10.96.1.2:80"},                    // a judged (2nd failure); b: 1 failure, no room to confirm
		{"10.96.1.2:80", "10.244.1.2:8080", spAPIVIP, spAPIBackend},            // b judged, kubernetes again
		{"10.96.1.1:80", "10.244.1.1:8080", "10.96.1.2:80", "10.244.1.2:8080"}, // a, b
	}
	wantTargets := [][]string{
		{"service-path/IPv4/default/kubernetes:443"},
		{"service-path/IPv4/default/kubernetes:443", "service-path/IPv4/team/a:80"},
		{"service-path/IPv4/default/kubernetes:443", "service-path/IPv4/team/a:80", "service-path/IPv4/team/b:80"},
		{"service-path/IPv4/default/kubernetes:443", "service-path/IPv4/team/a:80", "service-path/IPv4/team/b:80"},
	}
	for i, want := range runs {
		fs := f.run(t, d)
		calls := f.dial.Calls()
		if len(calls) > 4 {
			t.Fatalf("run %d: %d connects > maxConnects", i, len(calls))
		}
		sameAddrs(t, "run "+string(rune('1'+i)), calls, want...)
		if got := strings.Join(targets(fs), " "); got != strings.Join(wantTargets[i], " ") {
			t.Fatalf("run %d: targets %s", i+1, got)
		}
		if i == 1 {
			// The kubernetes finding, not probed in this run, says
			// how old it is.
			if fs[0].Evidence["probedAgo"] != "10s" {
				t.Fatalf("run 2: kubernetes finding evidence %v", fs[0].Evidence)
			}
		}
		f.clock.Step(10 * time.Second)
	}
}

func TestServicePathDualStack(t *testing.T) {
	f := newSPFixture()
	s := cluster.Service{Namespace: "team", Name: "web", ClusterIPs: []string{"10.96.2.2", "fd00:96::2"},
		Ports: []cluster.ServicePort{{Name: "http", Protocol: "TCP", Port: 80}}}
	f.view.SetService(s,
		cluster.Endpoint{Address: "10.244.2.2", Port: 8080, Protocol: "TCP", PortName: "http", Ready: true},
		cluster.Endpoint{Address: "fd00:244::2", Port: 8080, Protocol: "TCP", PortName: "http", Ready: true})
	f.dial.Set("[fd00:96::2]:80", probe.Timeout)
	d := f.detector(t, func(p *ServicePathProbeParams) {
		p.Kubernetes, p.Canaries, p.MaxConnects = false, []string{"team/web"}, 8
	})
	fs := f.run(t, d)
	sameAddrs(t, "dual-stack", f.dial.Calls(), "10.96.2.2:80", "[fd00:96::2]:80", "[fd00:96::2]:80", "[fd00:244::2]:8080")
	if len(fs) != 1 || fs[0].Target != "service-path/IPv6/team/web:80" || !strings.Contains(fs[0].Message, "[fd00:244::2]:8080 connected") ||
		fs[0].Evidence["clusterIP"] != "[fd00:96::2]:80" {
		t.Fatalf("%+v", fs)
	}
	// IPv4 only.
	d = f.detector(t, func(p *ServicePathProbeParams) {
		p.Kubernetes, p.Canaries, p.Families = false, []string{"team/web"}, []string{"IPv4"}
	})
	if fs := f.run(t, d); len(fs) != 0 {
		t.Fatalf("IPv4 only: %+v", fs)
	}
	sameAddrs(t, "IPv4 only", f.dial.Calls(), "10.96.2.2:80")
}

// Several backends: kube-proxy picks one at random, so a dead one explains
// a failing Service path; all must answer for the dataplane verdict.
func TestServicePathSeveralBackends(t *testing.T) {
	f := newSPFixture()
	s, eps := spCanary("team", "web", "10.96.3.3", "10.244.3.1", "10.244.3.2", "10.244.3.3")
	f.view.SetService(s, eps...)
	f.dial.Set("10.96.3.3:80", probe.Timeout)
	f.dial.Set("10.244.3.2:8080", probe.Timeout)
	d := f.detector(t, func(p *ServicePathProbeParams) {
		p.Kubernetes, p.Canaries, p.MaxConnects = false, []string{"team/web"}, 5
	})
	fs := f.run(t, d)
	if len(fs) != 1 || fs[0].Severity != finding.Warning || fs[0].Evidence["verdict"] != "backend" || !strings.Contains(fs[0].Message, "1 of 3 backends checked fail") {
		t.Fatalf("one backend down: %+v", fs)
	}
	// All answer, but the budget (4) leaves room for 2 of 3 in the first
	// run: a warning; the next run checks all 3: critical.
	f.dial.Set("10.244.3.2:8080", probe.Connected)
	d = f.detector(t, func(p *ServicePathProbeParams) { p.Kubernetes, p.Canaries = false, []string{"team/web"} })
	fs = f.run(t, d)
	if len(fs) != 1 || fs[0].Severity != finding.Warning || fs[0].Evidence["verdict"] != "dataplane-partial" {
		t.Fatalf("partial: %+v", fs)
	}
	f.dial.Calls()
	f.clock.Step(10 * time.Second)
	fs = f.run(t, d)
	sameAddrs(t, "all backends", f.dial.Calls(), "10.96.3.3:80", "10.244.3.1:8080", "10.244.3.2:8080", "10.244.3.3:8080")
	if len(fs) != 1 || fs[0].Severity != finding.Critical || !strings.Contains(fs[0].Message, "all 3 backends answer") {
		t.Fatalf("all answer: %+v", fs)
	}
}

func TestServicePathNotProbedAndSkips(t *testing.T) {
	f := newSPFixture()
	// internalTrafficPolicy Local: only this node's endpoints count.
	s, eps := spCanary("team", "local", "10.96.4.4", "10.244.4.4")
	s.InternalPolicyLocal = true
	f.view.SetService(s, eps...)
	ext := cluster.Service{Namespace: "team", Name: "ext", Type: "ExternalName"}
	f.view.SetService(ext)
	udp := cluster.Service{Namespace: "team", Name: "dns", ClusterIPs: []string{"10.96.0.10"}, Ports: []cluster.ServicePort{{Name: "dns", Protocol: "UDP", Port: 53}}}
	f.view.SetService(udp)
	d := f.detector(t, func(p *ServicePathProbeParams) {
		p.Canaries = []string{"team/local", "team/ext", "team/dns/dns", "team/missing", "team/dns"}
	})
	if fs := f.run(t, d); len(fs) != 0 {
		t.Fatalf("%+v", fs)
	}
	sameAddrs(t, "only kubernetes", f.dial.Calls(), spAPIVIP)
	for _, want := range []string{"internalTrafficPolicy Local and no ready endpoint on this node", "ExternalName", "port 53 is UDP",
		"team/missing: not in the cluster view", "team/dns: no such TCP port"} {
		if !strings.Contains(d.Judged(), want) {
			t.Errorf("judged lacks %q: %s", want, d.Judged())
		}
	}
	// The local endpoint on this node makes it probed.
	eps[0].NodeName = "node1"
	f.view.SetEndpoints("team", "local", eps...)
	f.clock.Step(10 * time.Second)
	f.run(t, d)
	sameAddrs(t, "local endpoint", f.dial.Calls(), spAPIVIP, "10.96.4.4:80")

	// Nothing at all to probe, no view, not synced, no prober: skips.
	skip := func(what string, n *node.Node, want string) {
		t.Helper()
		d := newDetector(t, ServicePathProbeName, n, nil)
		_, err := d.Detect(context.Background())
		if r, ok := finding.IsSkip(err); !ok || !strings.Contains(r, want) {
			t.Errorf("%s: %v", what, err)
		}
	}
	empty := clustertest.New(f.clock.Now())
	skip("no kubernetes Service", &node.Node{Clock: f.clock, Cluster: empty, Probe: f.dial}, "default/kubernetes: not in the cluster view")
	skip("no view", &node.Node{Clock: f.clock, Probe: f.dial, Unavailable: map[string]string{"kubernetes": "no cluster access"}}, "no cluster access")
	unsynced := clustertest.New(f.clock.Now())
	unsynced.SetFreshness(cluster.Freshness{})
	skip("unsynced", &node.Node{Clock: f.clock, Cluster: unsynced, Probe: f.dial}, "not synced")
	skip("no prober", &node.Node{Clock: f.clock, Cluster: f.view}, "probe is not configured")
}

// A connect the detector's deadline would cut is not started, and an
// aborted one is not a failure.
func TestServicePathDeadline(t *testing.T) {
	f := newSPFixture()
	f.dial.Set(spAPIVIP, probe.Timeout)
	d := f.detector(t, nil)
	ctx, cancel := context.WithTimeout(context.Background(), time.Second) // < connectTimeout 2s
	defer cancel()
	fs, err := d.Detect(ctx)
	if err != nil || len(fs) != 0 {
		t.Fatalf("%+v %v", fs, err)
	}
	sameAddrs(t, "deadline", f.dial.Calls())
	if !strings.Contains(d.Judged(), "the detector's deadline") {
		t.Fatalf("judged %q", d.Judged())
	}
	// Cancelled during the pause before the confirming connect: one
	// failure counted, nothing judged, the next run starts there.
	d = f.detector(t, nil)
	d.pause = func(context.Context, time.Duration) error { return context.DeadlineExceeded }
	fs, err = d.Detect(context.Background())
	if err != nil || len(fs) != 0 || !strings.Contains(d.Judged(), "the detector's deadline") {
		t.Fatalf("%+v %v %q", fs, err, d.Judged())
	}
	sameAddrs(t, "pause cut", f.dial.Calls(), spAPIVIP)
	d.pause = func(context.Context, time.Duration) error { return nil }
	f.clock.Step(10 * time.Second)
	if fs := f.run(t, d); len(fs) != 1 || fs[0].Evidence["consecutiveFailures"] != 2 {
		t.Fatalf("next run: %+v", fs)
	}
	sameAddrs(t, "after the cut", f.dial.Calls(), spAPIVIP, spAPIBackend)
}

func TestServicePathParams(t *testing.T) {
	var def ServicePathProbeParams
	def.SetDefaults()
	if errs := def.Validate(); len(errs) != 0 {
		t.Fatalf("defaults invalid: %v", errs)
	}
	for _, c := range []struct {
		tweak func(*ServicePathProbeParams)
		field string
	}{
		{func(p *ServicePathProbeParams) { p.Kubernetes = false }, "canaries"},
		{func(p *ServicePathProbeParams) { p.Canaries = []string{"onlyname"} }, "canaries[0]"},
		{func(p *ServicePathProbeParams) { p.Canaries = []string{"a/b/c/d"} }, "canaries[0]"},
		{func(p *ServicePathProbeParams) { p.Canaries = []string{"a/B"} }, "canaries[0]"},
		{func(p *ServicePathProbeParams) { p.Canaries = []string{"a/b/0"} }, "canaries[0]"},
		{func(p *ServicePathProbeParams) { p.Canaries = []string{"a/b/70000"} }, "canaries[0]"},
		{func(p *ServicePathProbeParams) { p.Canaries = []string{"a/b/Http_x"} }, "canaries[0]"},
		{func(p *ServicePathProbeParams) { p.Canaries = []string{"a/b", "a/b"} }, "canaries[1]"},
		{func(p *ServicePathProbeParams) { p.Canaries = make([]string, 17) }, "canaries"},
		{func(p *ServicePathProbeParams) { p.MaxConnects = 1 }, "maxConnects"},
		{func(p *ServicePathProbeParams) { p.MaxConnects = 17 }, "maxConnects"},
		{func(p *ServicePathProbeParams) { p.ConnectTimeout = policy.D(time.Millisecond) }, "connectTimeout"},
		{func(p *ServicePathProbeParams) { p.ConnectTimeout = policy.D(time.Minute) }, "connectTimeout"},
		{func(p *ServicePathProbeParams) { p.MinPeriod = policy.D(0) }, "minPeriod"},
		{func(p *ServicePathProbeParams) { p.Failures = 0 }, "failures"},
		{func(p *ServicePathProbeParams) { p.Failures = 6 }, "failures"},
		{func(p *ServicePathProbeParams) { p.Families = []string{"IPv5"} }, "families[0]"},
	} {
		p := def
		c.tweak(&p)
		found := false
		for _, e := range p.Validate() {
			found = found || e.Field == c.field
		}
		if !found {
			t.Errorf("%+v: no error on %s: %v", p, c.field, p.Validate())
		}
	}
	for _, ok := range []string{"a/b", "kube-system/kube-dns/53", "team/web/http"} {
		if _, err := probe.ParseCanary(ok); err != nil {
			t.Errorf("%s: %v", ok, err)
		}
	}
}

// An IPv6 single-stack cluster: the `kubernetes` Service's ClusterIP and
// endpoint are IPv6. It is probed with bracketed addresses, and a policy
// whose families leave IPv6 out says why nothing is probed instead of
// skipping with an empty reason.
func TestServicePathIPv6SingleStack(t *testing.T) {
	f := newSPFixture()
	f.view.SetService(cluster.Service{Namespace: "default", Name: "kubernetes", ClusterIPs: []string{"fd00:10:96::1"},
		Ports: []cluster.ServicePort{{Name: "https", Protocol: "TCP", Port: 443}}},
		cluster.Endpoint{Address: "fd00:200::1", Port: 6443, Protocol: "TCP", PortName: "https", Ready: true, Serving: true})
	f.dial.Set("[fd00:10:96::1]:443", probe.Timeout)
	d := f.detector(t, nil)
	fs := f.run(t, d)
	sameAddrs(t, "IPv6", f.dial.Calls(), "[fd00:10:96::1]:443", "[fd00:10:96::1]:443", "[fd00:200::1]:6443")
	if len(fs) != 1 || fs[0].Target != "service-path/IPv6/default/kubernetes:443" || fs[0].Severity != finding.Critical ||
		!strings.Contains(fs[0].Message, "(IPv6 ClusterIP [fd00:10:96::1]:443)") || !strings.Contains(fs[0].Message, "([fd00:200::1]:6443 connected") ||
		fs[0].Evidence["clusterIP"] != "[fd00:10:96::1]:443" {
		t.Fatalf("%+v", fs)
	}
	if ev := fs[0].Evidence["backendsChecked"].([]spResultEvidence); len(ev) != 1 || ev[0].Addr != "[fd00:200::1]:6443" {
		t.Fatalf("backendsChecked %+v", ev)
	}

	// families: [IPv4] on this cluster: nothing to probe, and the skip
	// says which Service and why.
	d = f.detector(t, func(p *ServicePathProbeParams) { p.Families = []string{"IPv4"} })
	_, err := d.Detect(context.Background())
	r, ok := finding.IsSkip(err)
	if want := "default/kubernetes: its ClusterIP fd00:10:96::1 is IPv6, not in families [IPv4]"; !ok || !strings.Contains(r, want) {
		t.Fatalf("families [IPv4] on an IPv6 cluster: %v, want a skip saying %q", err, want)
	}
	if calls := f.dial.Calls(); len(calls) != 0 {
		t.Fatalf("connects %v", calls)
	}
	// A ClusterIP that is no address (a hostile or broken view) is named
	// too, not dropped silently.
	f.view.SetService(cluster.Service{Namespace: "default", Name: "kubernetes", ClusterIPs: []string{"[fd00:10:96::1]"},
		Ports: []cluster.ServicePort{{Name: "https", Protocol: "TCP", Port: 443}}})
	f.clock.Step(time.Minute)
	_, err = d.Detect(context.Background())
	if r, ok := finding.IsSkip(err); !ok || !strings.Contains(r, `default/kubernetes: ClusterIP "[fd00:10:96::1]" is not an IP address`) {
		t.Fatalf("bad ClusterIP: %v", err)
	}
}
