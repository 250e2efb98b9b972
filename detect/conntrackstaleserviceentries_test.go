package detect

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"strings"
	"testing"
	"time"

	clocktesting "k8s.io/utils/clock/testing"

	"github.com/remediate-dev/remediate/internal/cluster"
	"github.com/remediate-dev/remediate/internal/cluster/clustertest"
	"github.com/remediate-dev/remediate/internal/conntrack"
	"github.com/remediate-dev/remediate/internal/finding"
	"github.com/remediate-dev/remediate/internal/kubeproxy"
	"github.com/remediate-dev/remediate/internal/node"
)

func defaultCTStaleParams(t *testing.T) ConntrackStaleServiceEntriesParams {
	t.Helper()
	ty, ok := Lookup(ConntrackStaleServiceEntriesName)
	if !ok {
		t.Fatal("ConntrackStaleServiceEntries is not registered")
	}
	return *ty.NewParams().(*ConntrackStaleServiceEntriesParams)
}

// ctWorld is a node with a fake conntrack table and a fake cluster view.
type ctWorld struct {
	clock *clocktesting.FakeClock
	view  *clustertest.Fake
	ct    *conntrack.Fake
	n     *node.Node
}

var ctT0 = time.Date(2026, 11, 23, 12, 0, 0, 0, time.UTC)

func newCTWorld() *ctWorld {
	w := &ctWorld{clock: clocktesting.NewFakeClock(ctT0), view: clustertest.New(ctT0), ct: conntrack.NewFake(262144, 65536)}
	w.n = &node.Node{Name: "node1", Clock: w.clock, Cluster: w.view, Conntrack: w.ct}
	return w
}

// dnsService is kube-system/dns with ClusterIP 10.96.0.10, UDP and TCP 53,
// changed at `changed`, with the given endpoints (port 53, both protocols).
func dnsService(changed time.Time) cluster.Service {
	return cluster.Service{Namespace: "kube-system", Name: "dns", ClusterIPs: []string{"10.96.0.10"}, Type: "ClusterIP",
		Ports:   []cluster.ServicePort{{Name: "dns", Protocol: "UDP", Port: 53}, {Name: "dns-tcp", Protocol: "TCP", Port: 53}},
		Created: changed.Add(-time.Hour), Changed: changed}
}

func ep(addr string, ready, serving, terminating bool, changed time.Time) []cluster.Endpoint {
	return []cluster.Endpoint{
		{Address: addr, Port: 53, Protocol: "UDP", PortName: "dns", Ready: ready, Serving: serving, Terminating: terminating, SliceChanged: changed},
		{Address: addr, Port: 53, Protocol: "TCP", PortName: "dns-tcp", Ready: ready, Serving: serving, Terminating: terminating, SliceChanged: changed},
	}
}

func eps(lists ...[]cluster.Endpoint) []cluster.Endpoint {
	out := []cluster.Endpoint{}
	for _, l := range lists {
		out = append(out, l...)
	}
	return out
}

// svcFlow is a client -> vip flow DNATed to backend (backend == vip: not
// DNATed).
func svcFlow(proto uint8, client, vip, backend string) conntrack.Flow {
	c, v, b := netip.MustParseAddrPort(client), netip.MustParseAddrPort(vip), netip.MustParseAddrPort(backend)
	return conntrack.Flow{Proto: proto, OrigSrc: c, OrigDst: v, ReplySrc: b, ReplyDst: c}
}

func TestConntrackStaleServiceEntries(t *testing.T) {
	const vip = "10.96.0.10:53"
	udp, tcp := conntrack.ProtoUDP, conntrack.ProtoTCP
	old := ctT0.Add(-10 * time.Minute)
	recent := ctT0.Add(-30 * time.Second)
	type want struct {
		target  string
		entries int
	}
	for _, tc := range []struct {
		name   string
		setup  func(w *ctWorld)
		flows  []conntrack.Flow
		params func(p *ConntrackStaleServiceEntriesParams)
		want   []want
	}{
		{
			name:  "scaled to zero: entries to the old backend are stale",
			setup: func(w *ctWorld) { w.view.SetService(dnsService(old), []cluster.Endpoint{}...) },
			flows: []conntrack.Flow{svcFlow(udp, "10.0.0.5:40000", vip, "10.244.1.5:53"), svcFlow(udp, "10.0.0.6:40000", vip, "10.244.1.5:53")},
			want:  []want{{"ipvs-conn/UDP/10.244.1.5:53", 2}},
		},
		{
			name: "backend replaced: the old one is stale, the new one is not",
			setup: func(w *ctWorld) {
				w.view.SetService(dnsService(old), eps(ep("10.244.2.7", true, true, false, old))...)
			},
			flows: []conntrack.Flow{svcFlow(udp, "10.0.0.5:40000", vip, "10.244.1.5:53"), svcFlow(udp, "10.0.0.6:40000", vip, "10.244.2.7:53")},
			want:  []want{{"ipvs-conn/UDP/10.244.1.5:53", 1}},
		},
		{
			name: "backend ready or terminating but serving: no finding",
			setup: func(w *ctWorld) {
				w.view.SetService(dnsService(old), eps(ep("10.244.2.7", true, true, false, old), ep("10.244.1.5", false, true, true, old))...)
			},
			flows: []conntrack.Flow{svcFlow(udp, "10.0.0.5:40000", vip, "10.244.1.5:53"), svcFlow(udp, "10.0.0.6:40000", vip, "10.244.2.7:53")},
		},
		{
			name: "terminating and no longer serving: stale",
			setup: func(w *ctWorld) {
				w.view.SetService(dnsService(old), eps(ep("10.244.2.7", true, true, false, old), ep("10.244.1.5", false, false, true, old))...)
			},
			flows: []conntrack.Flow{svcFlow(udp, "10.0.0.5:40000", vip, "10.244.1.5:53")},
			want:  []want{{"ipvs-conn/UDP/10.244.1.5:53", 1}},
		},
		{
			name: "within the grace: kube-proxy may still clean up",
			setup: func(w *ctWorld) {
				w.view.SetService(dnsService(old), []cluster.Endpoint{}...)
				w.view.SetEndpointsChanged("kube-system", "dns", recent)
			},
			flows: []conntrack.Flow{svcFlow(udp, "10.0.0.5:40000", vip, "10.244.1.5:53")},
		},
		{
			name: "slice change within the grace is seen through the endpoints' own timestamps",
			setup: func(w *ctWorld) {
				w.view.SetService(dnsService(old), eps(ep("10.244.2.7", true, true, false, recent))...)
			},
			flows: []conntrack.Flow{svcFlow(udp, "10.0.0.5:40000", vip, "10.244.1.5:53")},
		},
		{
			name:  "TCP ignored by default",
			setup: func(w *ctWorld) { w.view.SetService(dnsService(old), []cluster.Endpoint{}...) },
			flows: []conntrack.Flow{svcFlow(tcp, "10.0.0.5:40000", vip, "10.244.1.5:53")},
		},
		{
			name:   "TCP reported when opted in",
			setup:  func(w *ctWorld) { w.view.SetService(dnsService(old), []cluster.Endpoint{}...) },
			flows:  []conntrack.Flow{svcFlow(tcp, "10.0.0.5:40000", vip, "10.244.1.5:53"), svcFlow(udp, "10.0.0.5:40001", vip, "10.244.1.5:53")},
			params: func(p *ConntrackStaleServiceEntriesParams) { p.IncludeTCP = true },
			want:   []want{{"ipvs-conn/UDP/10.244.1.5:53", 1}, {"ipvs-conn/TCP/10.244.1.5:53", 1}},
		},
		{
			name: "not DNATed while the Service has endpoints: stale (the blackhole)",
			setup: func(w *ctWorld) {
				w.view.SetService(dnsService(old), eps(ep("10.244.2.7", true, true, false, old))...)
			},
			flows: []conntrack.Flow{svcFlow(udp, "10.0.0.5:40000", vip, vip)},
			want:  []want{{"ipvs-conn/UDP/10.96.0.10:53", 1}},
		},
		{
			name:  "not DNATed while the Service has no endpoint: nothing to gain",
			setup: func(w *ctWorld) { w.view.SetService(dnsService(old), []cluster.Endpoint{}...) },
			flows: []conntrack.Flow{svcFlow(udp, "10.0.0.5:40000", vip, vip)},
		},
		{
			name: "old backend serves another Service: never a flush target",
			setup: func(w *ctWorld) {
				w.view.SetService(dnsService(old), []cluster.Endpoint{}...)
				other := dnsService(old)
				other.Name, other.ClusterIPs = "dns2", []string{"10.96.0.11"}
				w.view.SetService(other, eps(ep("10.244.1.5", true, true, false, old))...)
			},
			flows: []conntrack.Flow{svcFlow(udp, "10.0.0.5:40000", vip, "10.244.1.5:53")},
		},
		{
			name:  "entries to addresses that are not Services are ignored",
			setup: func(w *ctWorld) { w.view.SetService(dnsService(old), []cluster.Endpoint{}...) },
			flows: []conntrack.Flow{svcFlow(udp, "10.0.0.5:40000", "8.8.8.8:53", "8.8.8.8:53"), svcFlow(udp, "10.0.0.5:40000", "10.96.0.10:54", "10.244.1.5:53")},
		},
		{
			name: "IPv6 ClusterIP",
			setup: func(w *ctWorld) {
				s := dnsService(old)
				s.ClusterIPs = []string{"fd00:96::a"}
				w.view.SetService(s, []cluster.Endpoint{}...)
			},
			flows: []conntrack.Flow{svcFlow(udp, "[fd00::5]:40000", "[fd00:96::a]:53", "[fd00:244::5]:53")},
			want:  []want{{"ipvs-conn/UDP/[fd00:244::5]:53", 1}},
		},
		{
			name: "NodePort on a node address: stale entries found, other hosts' ports ignored",
			setup: func(w *ctWorld) {
				s := dnsService(old)
				s.Type, s.Ports[0].NodePort = "NodePort", 30053
				w.view.SetService(s, eps(ep("10.244.2.7", true, true, false, old))...)
			},
			flows: []conntrack.Flow{
				svcFlow(udp, "10.0.0.5:40000", "192.168.1.10:30053", "10.244.1.5:53"), // stale
				svcFlow(udp, "10.0.0.5:40001", "192.168.1.10:30053", "10.244.2.7:53"), // serving
				svcFlow(udp, "10.0.0.5:40002", "192.168.1.99:30053", "10.244.1.6:53"), // not this node
			},
			want: []want{{"ipvs-conn/UDP/10.244.1.5:53", 1}},
		},
		{
			name: "minEntries",
			setup: func(w *ctWorld) {
				w.view.SetService(dnsService(old), []cluster.Endpoint{}...)
			},
			flows:  []conntrack.Flow{svcFlow(udp, "10.0.0.5:40000", vip, "10.244.1.5:53")},
			params: func(p *ConntrackStaleServiceEntriesParams) { p.MinEntries = 2 },
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := newCTWorld()
			tc.setup(w)
			w.ct.Flows = tc.flows
			p := defaultCTStaleParams(t)
			if tc.params != nil {
				tc.params(&p)
			}
			if errs := p.Validate(); len(errs) != 0 {
				t.Fatalf("params: %v", errs)
			}
			d, _ := newConntrackStaleServiceEntries(&p, w.n)
			d.(*conntrackStale).localAddrs = func() ([]netip.Addr, error) {
				return []netip.Addr{netip.MustParseAddr("192.168.1.10"), netip.MustParseAddr("fd00:1::10")}, nil
			}
			fs, err := d.Detect(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			if len(fs) != len(tc.want) {
				t.Fatalf("got %d findings, want %d: %+v", len(fs), len(tc.want), fs)
			}
			for i, f := range fs {
				if f.Target != tc.want[i].target || f.Evidence["entries"] != tc.want[i].entries {
					t.Errorf("finding %d: %s with %v entries, want %s with %d: %s", i, f.Target, f.Evidence["entries"], tc.want[i].target, tc.want[i].entries, f.Message)
				}
				ref, err := conntrack.DecodeBackendRef(f.Evidence)
				if err != nil || ref.Target() != f.Target {
					t.Errorf("finding %d: evidence does not decode to its target: %v %v", i, ref, err)
				}
			}
		})
	}
}

// A deleted Service's entries are recognised from the addresses remembered
// over earlier cycles, and reported only once the grace since the first
// cycle that missed the Service has passed.
func TestConntrackStaleDeletedService(t *testing.T) {
	w := newCTWorld()
	old := ctT0.Add(-10 * time.Minute)
	w.view.SetService(dnsService(old), eps(ep("10.244.1.5", true, true, false, old))...)
	w.ct.Flows = []conntrack.Flow{svcFlow(conntrack.ProtoUDP, "10.0.0.5:40000", "10.96.0.10:53", "10.244.1.5:53")}
	p := defaultCTStaleParams(t)
	d, _ := newConntrackStaleServiceEntries(&p, w.n)
	run := func(want int) {
		t.Helper()
		fs, err := d.Detect(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		if len(fs) != want {
			t.Fatalf("at %s: %d findings, want %d: %+v", w.clock.Now().Sub(ctT0), len(fs), want, fs)
		}
	}
	run(0) // serving
	w.view.DeleteService("kube-system", "dns")
	w.clock.Step(10 * time.Second)
	run(0) // first cycle without the Service: remembered as missing now
	w.clock.Step(p.Grace.Duration - time.Second)
	run(0) // within the grace
	w.clock.Step(2 * time.Second)
	run(1)
	fs, _ := d.Detect(context.Background())
	if got := fs[0].Evidence["reasons"].([]string); len(got) != 1 || got[0] != "Service (or this port) deleted" {
		t.Errorf("reasons %v", got)
	}
	// The address reused by a new Service with a serving endpoint: fine.
	s := dnsService(old)
	s.Name = "dns-new"
	w.view.SetService(s, eps(ep("10.244.1.5", true, true, false, old))...)
	run(0)
}

func TestConntrackStaleParamsValidate(t *testing.T) {
	p := defaultCTStaleParams(t)
	if errs := p.Validate(); len(errs) != 0 {
		t.Fatalf("defaults invalid: %v", errs)
	}
	for _, tc := range []struct {
		mut   func(p *ConntrackStaleServiceEntriesParams)
		field string
	}{
		{func(p *ConntrackStaleServiceEntriesParams) { p.Families = nil }, "families"},
		{func(p *ConntrackStaleServiceEntriesParams) { p.Families = []string{"IPv5"} }, "families[0]"},
		{func(p *ConntrackStaleServiceEntriesParams) { p.MaxScan = 0 }, "maxScan"},
		{func(p *ConntrackStaleServiceEntriesParams) { p.MinEntries = 0 }, "minEntries"},
		{func(p *ConntrackStaleServiceEntriesParams) { p.MaxFindings = 0 }, "maxFindings"},
		{func(p *ConntrackStaleServiceEntriesParams) { p.Grace.Duration = -1 }, "grace"},
	} {
		p := defaultCTStaleParams(t)
		tc.mut(&p)
		if errs := p.Validate(); len(errs) != 1 || errs[0].Field != tc.field {
			t.Errorf("errors %v, want one on %s", errs, tc.field)
		}
	}
}

// The scan is bounded by maxScan and says so in the evidence.
func TestConntrackStaleMaxScan(t *testing.T) {
	w := newCTWorld()
	old := ctT0.Add(-10 * time.Minute)
	w.view.SetService(dnsService(old), []cluster.Endpoint{}...)
	for i := 0; i < 10; i++ {
		w.ct.Flows = append(w.ct.Flows, svcFlow(conntrack.ProtoUDP, netip.AddrPortFrom(netip.MustParseAddr("10.0.0.5"), uint16(40000+i)).String(), "10.96.0.10:53", "10.244.1.5:53"))
	}
	p := defaultCTStaleParams(t)
	p.MaxScan = 4
	d, _ := newConntrackStaleServiceEntries(&p, w.n)
	fs, err := d.Detect(context.Background())
	if err != nil || len(fs) != 1 || fs[0].Evidence["entries"] != 4 {
		t.Fatalf("%+v, %v", fs, err)
	}
	scans := fs[0].Evidence["scans"].([]ctScanNote)
	if len(scans) != 2 || !scans[0].Truncated || scans[0].Scanned != 4 || scans[1].Truncated {
		t.Errorf("scans %+v", scans)
	}
}

// Nothing is judged without a synced, connected view; a failing scan is an
// error, not an empty answer.
func TestConntrackStaleSkipsAndErrors(t *testing.T) {
	p := defaultCTStaleParams(t)
	w := newCTWorld()
	w.view.SetFreshness(cluster.Freshness{Synced: true, Connected: false})
	d, _ := newConntrackStaleServiceEntries(&p, w.n)
	if _, err := d.Detect(context.Background()); err == nil {
		t.Fatal("disconnected view: no skip")
	} else if _, ok := finding.IsSkip(err); !ok {
		t.Fatalf("disconnected view: %v is not a skip", err)
	}
	w = newCTWorld()
	w.ct.InjectError("ScanProtocol", errors.New("netlink broke"))
	d, _ = newConntrackStaleServiceEntries(&p, w.n)
	if _, err := d.Detect(context.Background()); err == nil || !strings.Contains(err.Error(), "netlink broke") {
		t.Fatalf("scan error: %v", err)
	} else if _, ok := finding.IsSkip(err); ok {
		t.Fatalf("scan error reported as a skip: %v", err)
	}
	w.n.Conntrack = nil
	if _, err := d.Detect(context.Background()); err == nil {
		t.Fatal("no conntrack: no skip")
	}
}

// reconcilerMetrics is kube-proxy 1.34's conntrack reconciler series for
// IPv4 after runs runs (names and labels as the real v1.34.4 exports them).
func reconcilerMetrics(runs int, deleted float64) string {
	return fmt.Sprintf(`# TYPE kubeproxy_conntrack_reconciler_deleted_entries_total counter
kubeproxy_conntrack_reconciler_deleted_entries_total{ip_family="IPv4"} %g
# TYPE kubeproxy_conntrack_reconciler_sync_duration_seconds histogram
kubeproxy_conntrack_reconciler_sync_duration_seconds_bucket{ip_family="IPv4",le="0.008"} %d
kubeproxy_conntrack_reconciler_sync_duration_seconds_bucket{ip_family="IPv4",le="+Inf"} %d
kubeproxy_conntrack_reconciler_sync_duration_seconds_sum{ip_family="IPv4"} 0.004
kubeproxy_conntrack_reconciler_sync_duration_seconds_count{ip_family="IPv4"} %d
# TYPE kubeproxy_sync_proxy_rules_last_timestamp_seconds gauge
kubeproxy_sync_proxy_rules_last_timestamp_seconds{ip_family="IPv4"} 1.8e+09
`, deleted, runs, runs, runs)
}

// kube-proxy >= 1.32 deletes stale UDP entries itself after its syncs: the
// finding carries its reconciler's runs and deletions, and says when it
// has run (since the last cycle, or at all on the first) and the entries
// are still there past the grace; an older kube-proxy's absence of the
// series is said in the evidence only.
func TestConntrackStaleKubeProxyReconciler(t *testing.T) {
	old := ctT0.Add(-10 * time.Minute)
	w := newCTWorld()
	kp := kubeproxy.NewFake(w.clock, 30*time.Second)
	w.n.KubeProxy = kp
	w.view.SetService(dnsService(old), []cluster.Endpoint{}...)
	w.ct.Flows = []conntrack.Flow{svcFlow(conntrack.ProtoUDP, "10.0.0.5:40000", "10.96.0.10:53", "10.244.1.5:53")}
	p := defaultCTStaleParams(t)
	d, _ := newConntrackStaleServiceEntries(&p, w.n)
	d.(*conntrackStale).localAddrs = func() ([]netip.Addr, error) { return nil, nil }
	detect := func() finding.Finding {
		t.Helper()
		fs, err := d.Detect(context.Background())
		if err != nil || len(fs) != 1 {
			t.Fatalf("findings %+v, err %v", fs, err)
		}
		return fs[0]
	}

	// kube-proxy 1.31: no reconciler series.
	kp.SetMetrics("# TYPE kubeproxy_sync_proxy_rules_last_timestamp_seconds gauge\nkubeproxy_sync_proxy_rules_last_timestamp_seconds 1.8e+09\n")
	f := detect()
	if s, _ := f.Evidence["kubeProxyConntrackReconciler"].(string); !strings.Contains(s, "not exported") || strings.Contains(f.Message, "reconciler") {
		t.Fatalf("no reconciler: evidence %v, message %s", f.Evidence["kubeProxyConntrackReconciler"], f.Message)
	}

	// 1.34, first cycle with the series: it has run 3 times.
	d, _ = newConntrackStaleServiceEntries(&p, w.n)
	d.(*conntrackStale).localAddrs = func() ([]netip.Addr, error) { return nil, nil }
	kp.SetMetrics(reconcilerMetrics(3, 7))
	f = detect()
	ev, _ := f.Evidence["kubeProxyConntrackReconciler"].(map[string]any)
	if ev == nil || ev["runs"] != uint64(3) || ev["deletedEntries"] != 7.0 || ev["ipFamily"] != "IPv4" || ev["runsSinceLastCycle"] != nil ||
		!strings.Contains(f.Message, "conntrack reconciler has run (3 runs since kube-proxy started) and these entries remain") {
		t.Fatalf("first cycle: evidence %v, message %s", f.Evidence["kubeProxyConntrackReconciler"], f.Message)
	}
	// It ran twice more since: it keeps running and leaves them.
	kp.SetMetrics(reconcilerMetrics(5, 7))
	f = detect()
	ev, _ = f.Evidence["kubeProxyConntrackReconciler"].(map[string]any)
	if ev == nil || ev["runsSinceLastCycle"] != uint64(2) || !strings.Contains(f.Message, "reconciler ran 2 times since the last cycle and left them") {
		t.Fatalf("second cycle: evidence %v, message %s", f.Evidence["kubeProxyConntrackReconciler"], f.Message)
	}
	// Not run since the last cycle: the figures, no claim.
	f = detect()
	ev, _ = f.Evidence["kubeProxyConntrackReconciler"].(map[string]any)
	if ev == nil || ev["runsSinceLastCycle"] != uint64(0) || strings.Contains(f.Message, "reconciler") {
		t.Fatalf("idle reconciler: evidence %v, message %s", f.Evidence["kubeProxyConntrackReconciler"], f.Message)
	}
	// kube-proxy not answering: said in the evidence, the finding stays.
	kp.SetMetricsError(errors.New("connection refused"))
	f = detect()
	if s, _ := f.Evidence["kubeProxyConntrackReconciler"].(string); !strings.Contains(s, "not read") {
		t.Fatalf("unreadable: %v", f.Evidence["kubeProxyConntrackReconciler"])
	}
}

// genView is a clustertest.Fake that counts its generations (as kube.View
// does) and its Endpoints reads.
type genView struct {
	*clustertest.Fake
	gen   uint64
	reads int
}

func (g *genView) Generation() uint64 { return g.gen }
func (g *genView) Endpoints(namespace, name string) []cluster.Endpoint {
	g.reads++
	return g.Fake.Endpoints(namespace, name)
}

// TestConntrackStaleReadsTheViewOncePerGeneration: a cycle at a view
// generation already indexed reads no endpoint (the index's view part is
// kept, issue #31: every cycle merged every Service's endpoints three
// times), and the kept part still follows a change: a Service deleted at a
// new generation is recognised as deleted, as without the cache.
func TestConntrackStaleReadsTheViewOncePerGeneration(t *testing.T) {
	w := newCTWorld()
	v := &genView{Fake: w.view}
	w.n.Cluster = v
	old := ctT0.Add(-10 * time.Minute)
	w.view.SetService(dnsService(old), eps(ep("10.244.1.5", true, true, false, old))...)
	w.ct.Flows = []conntrack.Flow{svcFlow(conntrack.ProtoUDP, "10.0.0.5:40000", "10.96.0.10:53", "10.244.1.5:53")}
	p := defaultCTStaleParams(t)
	d, _ := newConntrackStaleServiceEntries(&p, w.n)
	detect := func(want int) {
		t.Helper()
		fs, err := d.Detect(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		if len(fs) != want {
			t.Fatalf("at %s: %d findings, want %d: %+v", w.clock.Now().Sub(ctT0), len(fs), want, fs)
		}
	}
	detect(0)
	if v.reads == 0 {
		t.Fatal("the first cycle read no endpoints")
	}
	first := v.reads
	w.clock.Step(10 * time.Second)
	detect(0)
	if v.reads != first {
		t.Errorf("a cycle at the same generation read the endpoints again (%d reads, then %d)", first, v.reads)
	}
	if b := d.(*conntrackStale).base.Builds(); b != 1 {
		t.Errorf("%d index bases built at one generation, want 1", b)
	}
	w.view.DeleteService("kube-system", "dns")
	v.gen++
	detect(0) // first cycle without the Service: remembered as missing now
	w.clock.Step(p.Grace.Duration + time.Second)
	detect(1)
	if b := d.(*conntrackStale).base.Builds(); b != 2 {
		t.Errorf("%d index bases built over two generations, want 2", b)
	}
}
