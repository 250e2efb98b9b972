package dataplane

import (
	"fmt"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/remediate-dev/remediate/internal/cluster"
	"github.com/remediate-dev/remediate/internal/cluster/clustertest"
	"github.com/remediate-dev/remediate/internal/iptables"
)

// bigCluster returns a view of services Services with eps endpoints each
// and the iptables-save text kube-proxy v1.34 writes for them (cluster IP,
// a masquerade rule and one KUBE-SEP chain of two rules per endpoint).
func bigCluster(services, eps int) (*clustertest.Fake, string) {
	v := clustertest.New(time.Now())
	var b strings.Builder
	b.WriteString("*filter\n:KUBE-SERVICES - [0:0]\n:KUBE-EXTERNAL-SERVICES - [0:0]\nCOMMIT\n*nat\n:KUBE-SERVICES - [0:0]\n:KUBE-MARK-MASQ - [0:0]\n")
	var rules strings.Builder
	for i := 0; i < services; i++ {
		name := fmt.Sprintf("s%d", i)
		vip := fmt.Sprintf("10.96.%d.%d", i/250, i%250+1)
		svcChain := fmt.Sprintf("KUBE-SVC-%08d", i)
		fmt.Fprintf(&b, ":%s - [0:0]\n", svcChain)
		fmt.Fprintf(&rules, "-A KUBE-SERVICES -d %s/32 -p tcp -m comment --comment \"ns/%s:http cluster IP\" -m tcp --dport 80 -j %s\n", vip, name, svcChain)
		fmt.Fprintf(&rules, "-A %s ! -s 10.244.0.0/16 -d %s/32 -p tcp -m comment --comment \"ns/%s:http cluster IP\" -m tcp --dport 80 -j KUBE-MARK-MASQ\n", svcChain, vip, name)
		var list []cluster.Endpoint
		for j := 0; j < eps; j++ {
			k := i*eps + j
			addr := fmt.Sprintf("10.%d.%d.%d", 100+k/62500, (k/250)%250, k%250+1)
			sep := fmt.Sprintf("KUBE-SEP-%08d", k)
			fmt.Fprintf(&b, ":%s - [0:0]\n", sep)
			fmt.Fprintf(&rules, "-A %s -m comment --comment \"ns/%s:http -> %s:8080\" -m statistic --mode random --probability 0.2 -j %s\n", svcChain, name, addr, sep)
			fmt.Fprintf(&rules, "-A %s -s %s/32 -m comment --comment ns/%s:http -j KUBE-MARK-MASQ\n", sep, addr, name)
			fmt.Fprintf(&rules, "-A %s -p tcp -m comment --comment ns/%s:http -m tcp -j DNAT --to-destination %s:8080\n", sep, name, addr)
			list = append(list, cluster.Endpoint{Address: addr, Port: 8080, Protocol: "TCP", PortName: "http", NodeName: "n1", Ready: true, Serving: true})
		}
		v.SetService(cluster.Service{Namespace: "ns", Name: name, ClusterIPs: []string{vip}, Ports: []cluster.ServicePort{{Name: "http", Protocol: "TCP", Port: 80}}}, list...)
	}
	b.WriteString(rules.String())
	b.WriteString("COMMIT\n")
	return v, b.String()
}

func TestBigClusterInSync(t *testing.T) {
	v, text := bigCluster(50, 5)
	rs, err := iptables.ParseString(text)
	if err != nil {
		t.Fatal(err)
	}
	if ds := Compare(FromIPTables(rs, IPv4, "x"), Desire(v, IPv4, "n1"), false); len(ds) != 0 {
		t.Fatalf("generated cluster not in sync: %v", diffLines(ds))
	}
}

// One comparison at 10,000 Services / 50,000 endpoints (a 160k-rule nat
// table): programmed model from the already-parsed save (the rules
// detector's shared snapshot), desired state from the view, Compare. The
// budget is 100 ms CPU.
func BenchmarkCompare10kServices50kEndpoints(b *testing.B) {
	fake, text := bigCluster(10000, 5)
	v := snapshotView(fake)
	rs, err := iptables.ParseString(text)
	if err != nil {
		b.Fatal(err)
	}
	b.ReportMetric(float64(rs.RuleCount()), "natRules")
	runtime.GC()
	b.ResetTimer()
	cpu0 := cpuTime()
	defer func() { b.ReportMetric(float64((cpuTime()-cpu0).Milliseconds())/float64(b.N), "cpu-ms/op") }()
	for i := 0; i < b.N; i++ {
		got := FromIPTables(rs, IPv4, "iptables-legacy")
		want := Desire(v, IPv4, "n1")
		if ds := Compare(got, want, false); len(ds) != 0 {
			b.Fatalf("%d diffs", len(ds))
		}
	}
}

// cpuTime is this process's user+system CPU time (GC workers included),
// the budget's unit: wall time on a shared 2-core machine is noise.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// staticView is a view whose Services and Endpoints are precomputed, as
// kube.View's cached snapshot and per-Service index make them; the
// benchmark measures the comparison, not clustertest's sorting.
type staticView struct {
	svcs []cluster.Service
	eps  map[[2]string][]cluster.Endpoint
}

func snapshotView(v cluster.View) *staticView {
	s := &staticView{svcs: v.Services(), eps: map[[2]string][]cluster.Endpoint{}}
	for _, svc := range s.svcs {
		s.eps[[2]string{svc.Namespace, svc.Name}] = v.Endpoints(svc.Namespace, svc.Name)
	}
	return s
}

func (s *staticView) Services() []cluster.Service { return s.svcs }
func (s *staticView) Endpoints(ns, name string) []cluster.Endpoint {
	return s.eps[[2]string{ns, name}]
}
func (s *staticView) Freshness() cluster.Freshness {
	return cluster.Freshness{Synced: true, Connected: true}
}

// genView is a staticView with a generation counter (as kube.View has).
type genView struct {
	*staticView
	gen uint64
}

func (g *genView) Generation() uint64 { return g.gen }

// TestCachedDerivationsFollowTheirInputs: the cached variants return the
// very same result for the same save and view generation, and compute
// again when the generation moves or the save is another one.
func TestCachedDerivationsFollowTheirInputs(t *testing.T) {
	fake, text := bigCluster(20, 2)
	v := &genView{staticView: snapshotView(fake)}
	rs, err := iptables.ParseString(text)
	if err != nil {
		t.Fatal(err)
	}
	want1 := DesireCached(v, IPv4, "n1")
	if DesireCached(v, IPv4, "n1") != want1 {
		t.Error("same generation computed again")
	}
	if DesireCached(v, IPv6, "n1") == want1 || DesireCached(v, IPv4, "n2") == want1 {
		t.Error("another family or node shared the result")
	}
	// The view changes: one Service loses its endpoints.
	svc := v.svcs[0]
	v.eps[[2]string{svc.Namespace, svc.Name}] = nil
	if d := DesireCached(v, IPv4, "n1"); d != want1 {
		t.Error("computed again at the same generation: the memo is not keyed on it?")
	}
	v.gen++
	want2 := DesireCached(v, IPv4, "n1")
	if want2 == want1 {
		t.Fatal("generation moved, result shared")
	}
	got := FromIPTablesCached(rs, IPv4, "x")
	if FromIPTablesCached(rs, IPv4, "x") != got {
		t.Error("same save converted again")
	}
	if len(CompareCached(got, want1, false)) != 0 {
		t.Errorf("in sync before the change: %v", diffLines(CompareCached(got, want1, false)))
	}
	if ds := CompareCached(got, want2, false); len(ds) == 0 {
		t.Error("the Service without endpoints is not a difference")
	}
	rs2, _ := iptables.ParseString(text)
	if FromIPTablesCached(rs2, IPv4, "x") == got {
		t.Error("another save shared the result")
	}
	// A view without generations is computed every time.
	a := DesireCached(v.staticView, IPv4, "n1")
	if b := DesireCached(v.staticView, IPv4, "n1"); a == b {
		t.Error("a view without generations was cached")
	}
}

// BenchmarkDriftCycleUnchanged10kServices: the drift comparison of a cycle
// in which neither the save (the same *Ruleset, reused by iptables.Real)
// nor the view (same generation) changed: every derivation is shared.
func BenchmarkDriftCycleUnchanged10kServices(b *testing.B) {
	fake, text := bigCluster(10000, 5)
	v := &genView{staticView: snapshotView(fake)}
	rs, err := iptables.ParseString(text)
	if err != nil {
		b.Fatal(err)
	}
	CompareCached(FromIPTablesCached(rs, IPv4, "iptables-legacy"), DesireCached(v, IPv4, "n1"), false)
	runtime.GC()
	b.ReportAllocs()
	b.ResetTimer()
	cpu0 := cpuTime()
	defer func() { b.ReportMetric(float64((cpuTime()-cpu0).Microseconds())/float64(b.N), "cpu-us/op") }()
	for i := 0; i < b.N; i++ {
		got := FromIPTablesCached(rs, IPv4, "iptables-legacy")
		want := DesireCached(v, IPv4, "n1")
		if ds := CompareCached(got, want, false); len(ds) != 0 {
			b.Fatalf("%d diffs", len(ds))
		}
	}
}
