package action

import (
	"context"
	"encoding/json"
	"errors"
	"net/netip"
	"strings"
	"testing"
	"time"

	testingclock "k8s.io/utils/clock/testing"

	"github.com/remediate-dev/remediate/internal/cluster"
	"github.com/remediate-dev/remediate/internal/cluster/clustertest"
	"github.com/remediate-dev/remediate/internal/finding"
	"github.com/remediate-dev/remediate/internal/ipvs"
	"github.com/remediate-dev/remediate/internal/kubeproxy"
	"github.com/remediate-dev/remediate/internal/node"
	"github.com/remediate-dev/remediate/policy"
)

var ipvsT0 = time.Date(2026, 11, 21, 12, 0, 0, 0, time.UTC)

type ipvsActWorld struct {
	ipvs  *ipvs.Fake
	kp    *kubeproxy.Fake
	view  *clustertest.Fake
	clock *testingclock.FakePassiveClock
	node  *node.Node
}

var (
	dnsUDPVS = ipvs.VirtualServer{Address: netip.MustParseAddr("10.96.0.10"), Protocol: ipvs.UDP, Port: 53}
	dnsTCPVS = ipvs.VirtualServer{Address: netip.MustParseAddr("10.96.0.10"), Protocol: ipvs.TCP, Port: 53}
)

func ipvsRS(addr string, weight, active int) ipvs.RealServer {
	return ipvs.RealServer{Address: netip.MustParseAddr(addr), Port: 53, Weight: weight, ActiveConns: active}
}

func ipvsEP(addr, proto, name string, ready, serving, terminating bool) cluster.Endpoint {
	return cluster.Endpoint{Address: addr, Port: 53, Protocol: proto, PortName: name, Ready: ready, Serving: serving, Terminating: terminating}
}

// newIPVSActWorld is the CoreDNS rolling update: 10.244.0.12 is gone from
// the endpoints but still a real server of both DNS virtual servers (the
// TCP one draining), and a deleted Service left TCP/10.96.5.5:80 behind.
func newIPVSActWorld(t *testing.T) *ipvsActWorld {
	t.Helper()
	w := &ipvsActWorld{ipvs: ipvs.NewFake(), view: clustertest.New(ipvsT0), clock: testingclock.NewFakePassiveClock(ipvsT0)}
	w.kp = ipvsKubeProxy()
	w.node = &node.Node{Name: "node1", Clock: w.clock, IPVS: w.ipvs, Cluster: w.view, KubeProxy: w.kp}
	w.view.SetService(cluster.Service{Namespace: "default", Name: "kubernetes", ClusterIPs: []string{"10.96.0.1"},
		Ports: []cluster.ServicePort{{Name: "https", Protocol: "TCP", Port: 443}}},
		cluster.Endpoint{Address: "10.200.0.1", Port: 6443, Protocol: "TCP", PortName: "https", Ready: true, Serving: true})
	w.view.SetService(cluster.Service{
		Namespace: "kube-system", Name: "kube-dns", ClusterIPs: []string{"10.96.0.10"},
		Ports: []cluster.ServicePort{{Name: "dns", Protocol: "UDP", Port: 53}, {Name: "dns-tcp", Protocol: "TCP", Port: 53}},
	},
		ipvsEP("10.244.1.21", "UDP", "dns", true, true, false),
		ipvsEP("10.244.2.22", "UDP", "dns", true, true, false),
		ipvsEP("10.244.1.21", "TCP", "dns-tcp", true, true, false),
	)
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(w.ipvs.AddVirtualServer(dnsUDPVS))
	for _, r := range []ipvs.RealServer{ipvsRS("10.244.0.12", 1, 0), ipvsRS("10.244.0.13", 1, 0), ipvsRS("10.244.1.21", 1, 0), ipvsRS("10.244.2.22", 1, 0)} {
		must(w.ipvs.AddRealServer(dnsUDPVS, r))
	}
	must(w.ipvs.AddVirtualServer(dnsTCPVS))
	must(w.ipvs.AddRealServer(dnsTCPVS, ipvsRS("10.244.0.12", 0, 3)))
	must(w.ipvs.AddRealServer(dnsTCPVS, ipvsRS("10.244.1.21", 1, 0)))
	stale := ipvs.VirtualServer{Address: netip.MustParseAddr("10.96.5.5"), Protocol: ipvs.TCP, Port: 80}
	must(w.ipvs.AddVirtualServer(stale))
	must(w.ipvs.AddRealServer(stale, ipvs.RealServer{Address: netip.MustParseAddr("10.244.3.3"), Port: 8080, Weight: 1}))
	must(w.ipvs.AddVirtualServer(ipvs.VirtualServer{Address: netip.MustParseAddr("172.16.0.1"), Protocol: ipvs.TCP, Port: 80}))
	return w
}

// ipvsKubeProxy is kube-proxy in IPVS mode whose /configz lists
// excludeCIDRs (none: it answers, with no exclusions).
func ipvsKubeProxy(excludeCIDRs ...string) *kubeproxy.Fake {
	kp := kubeproxy.NewFake(nil, 30*time.Second)
	kp.SetMode(kubeproxy.ModeIPVS, nil)
	kp.SetConfigz(&kubeproxy.Configz{SyncPeriod: 30 * time.Second, Mode: "ipvs", IPVSExcludeCIDRs: excludeCIDRs}, nil)
	return kp
}

func rsFinding(vs ipvs.VirtualServer, addr string) finding.Finding {
	return withRefs(finding.Finding{
		Detector: "IPVSStaleRealServer",
		Target:   "ipvs-rs/" + vs.Key() + "/" + addr + ":53",
		Evidence: map[string]any{"vsProtocol": vs.Protocol, "vsAddress": vs.Address.String(), "vsPort": int(vs.Port), "rsAddress": addr, "rsPort": 53},
	})
}

func vsFinding(proto, addr string, port int) finding.Finding {
	return withRefs(finding.Finding{
		Detector: "IPVSStaleVirtualServer",
		Target:   "ipvs-vs/" + proto + "/" + addr,
		Evidence: map[string]any{"vsProtocol": proto, "vsAddress": addr, "vsPort": port},
	})
}

func newIPVSAction(t *testing.T, name string, n *node.Node, set func(p any)) Action {
	t.Helper()
	typ, ok := Lookup(name)
	if !ok {
		t.Fatalf("%s not registered", name)
	}
	p := typ.NewParams()
	if set != nil {
		set(p)
	}
	if errs := p.(policy.Validator).Validate(); len(errs) > 0 {
		t.Fatalf("params invalid: %+v", errs)
	}
	a, err := typ.New(p, n)
	if err != nil {
		t.Fatal(err)
	}
	return a
}

func wantSkip(t *testing.T, err error, substr string) {
	t.Helper()
	reason, ok := finding.IsSkip(err)
	if !ok || !strings.Contains(reason, substr) {
		t.Fatalf("err = %v, want a skip containing %q", err, substr)
	}
}

func hasRS(t *testing.T, w *ipvsActWorld, vs ipvs.VirtualServer, addr string) bool {
	t.Helper()
	rss, err := w.ipvs.RealServers(context.Background(), vs)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range rss {
		if r.Address.String() == addr {
			return true
		}
	}
	return false
}

func TestIPVSTimeoutChange(t *testing.T) {
	def := ipvs.DefaultTimeouts
	cases := []struct {
		name   string
		cur    ipvs.Timeouts
		p      SetIPVSTimeoutsParams
		want   ipvs.Timeouts
		change bool
	}{
		{"lower UDP only", def, SetIPVSTimeoutsParams{UDPTimeout: policy.D(30 * time.Second)}, ipvs.Timeouts{UDP: 30 * time.Second}, true},
		{"never raise UDP", ipvs.Timeouts{TCP: 900e9, TCPFin: 120e9, UDP: 10 * time.Second}, SetIPVSTimeoutsParams{UDPTimeout: policy.D(30 * time.Second)}, ipvs.Timeouts{}, false},
		{"already equal", ipvs.Timeouts{UDP: 30 * time.Second}, SetIPVSTimeoutsParams{UDPTimeout: policy.D(30 * time.Second)}, ipvs.Timeouts{}, false},
		{"never below 1s", def, SetIPVSTimeoutsParams{UDPTimeout: policy.D(500 * time.Millisecond)}, ipvs.Timeouts{}, false},
		{"TCP when asked", def, SetIPVSTimeoutsParams{UDPTimeout: policy.D(30 * time.Second), TCPTimeout: policy.D(600 * time.Second)}, ipvs.Timeouts{TCP: 600 * time.Second, UDP: 30 * time.Second}, true},
		{"TCP-FIN only", ipvs.Timeouts{TCP: 900e9, TCPFin: 120e9, UDP: 5e9}, SetIPVSTimeoutsParams{UDPTimeout: policy.D(30 * time.Second), TCPFinTimeout: policy.D(60 * time.Second)}, ipvs.Timeouts{TCPFin: 60 * time.Second}, true},
	}
	for _, c := range cases {
		got, changed := IPVSTimeoutChange(c.cur, c.p)
		if got != c.want || changed != c.change {
			t.Errorf("%s: got %+v %v, want %+v %v", c.name, got, changed, c.want, c.change)
		}
	}
}

func TestSetIPVSTimeouts(t *testing.T) {
	ctx := context.Background()
	w := newIPVSActWorld(t)
	a := newIPVSAction(t, "SetIPVSTimeouts", w.node, nil)
	f := finding.Finding{Detector: "IPVSUDPTimeoutHigh", Target: "ipvs/timeouts"}

	p, err := a.Plan(ctx, f)
	if err != nil || !strings.Contains(p.Summary, "UDP 5m0s -> 30s") || !strings.Contains(p.Summary, "TCP 15m0s unchanged") {
		t.Fatalf("plan = %+v, %v", p, err)
	}
	if w.ipvs.Calls("SetTimeouts") != 0 {
		t.Fatal("Plan changed something")
	}
	res, err := a.Execute(ctx, f)
	if err != nil {
		t.Fatal(err)
	}
	if res.Details["previousUDPSeconds"] != 300 || res.Details["previousTCPSeconds"] != 900 || res.Details["previousTCPFinSeconds"] != 120 ||
		res.Details["udpSeconds"] != 30 || res.Details["tcpSeconds"] != 900 || res.Details["restoreCommand"] != "ipvsadm --set 900 120 300" {
		t.Errorf("details = %v", res.Details)
	}
	got, _ := w.ipvs.Timeouts(ctx)
	if got != (ipvs.Timeouts{TCP: 900 * time.Second, TCPFin: 120 * time.Second, UDP: 30 * time.Second}) {
		t.Fatalf("kernel timeouts = %+v", got)
	}
	_, err = a.Execute(ctx, f)
	wantSkip(t, err, "already within bounds")

	// The kernel refusing the write is a failure, not a success.
	w2 := newIPVSActWorld(t)
	w2.ipvs.InjectError("SetTimeouts", errors.New("invalid argument"))
	if _, err := newIPVSAction(t, "SetIPVSTimeouts", w2.node, nil).Execute(ctx, f); err == nil {
		t.Fatal("want an error")
	} else if _, skip := finding.IsSkip(err); skip {
		t.Fatalf("a kernel error must fail, not skip: %v", err)
	}

	w2.ipvs.SetUnavailable("no ip_vs module")
	_, err = newIPVSAction(t, "SetIPVSTimeouts", w2.node, nil).Execute(ctx, f)
	wantSkip(t, err, "IPVS unavailable")

	typ, _ := Lookup("SetIPVSTimeouts")
	bad := typ.NewParams().(*SetIPVSTimeoutsParams)
	bad.UDPTimeout = policy.D(500 * time.Millisecond)
	bad.TCPTimeout = policy.D(1500 * time.Millisecond)
	if errs := bad.Validate(); len(errs) != 2 || errs[0].Field != "udpTimeout" || errs[1].Field != "tcpTimeout" {
		t.Fatalf("errs = %+v", errs)
	}
}

func TestDeleteIPVSRealServer(t *testing.T) {
	ctx := context.Background()
	cases := []struct {
		name     string
		prep     func(w *ipvsActWorld)
		set      func(p any)
		finding  finding.Finding
		wantSkip string
		deleted  bool
	}{
		{name: "CoreDNS rollout: terminated pod deleted from UDP/53", finding: rsFinding(dnsUDPVS, "10.244.0.12"), deleted: true},
		{name: "view not synced", prep: func(w *ipvsActWorld) { w.view.SetFreshness(cluster.Freshness{}) },
			finding: rsFinding(dnsUDPVS, "10.244.0.12"), wantSkip: "not synced"},
		{name: "view disconnected", prep: func(w *ipvsActWorld) {
			w.view.SetFreshness(cluster.Freshness{Synced: true, LastEvent: ipvsT0, LastError: errors.New("dial tcp: connection refused")})
		}, finding: rsFinding(dnsUDPVS, "10.244.0.12"), wantSkip: "disconnected (dial tcp: connection refused)"},
		// The real view has no periodic resync: a quiet cluster's last
		// event can be hours old while its watch is current.
		{name: "quiet but connected view is trusted", prep: func(w *ipvsActWorld) { w.clock.SetTime(ipvsT0.Add(6 * time.Hour)) },
			finding: rsFinding(dnsUDPVS, "10.244.0.12"), deleted: true},
		{name: "pod came back before the action ran", prep: func(w *ipvsActWorld) {
			w.view.SetEndpoints("kube-system", "kube-dns", ipvsEP("10.244.0.12", "UDP", "dns", true, true, false))
		}, finding: rsFinding(dnsUDPVS, "10.244.0.12"), wantSkip: "now an expected endpoint"},
		{name: "already gone", prep: func(w *ipvsActWorld) {
			_ = w.ipvs.DeleteRealServer(context.Background(), dnsUDPVS, ipvsRS("10.244.0.12", 1, 0))
		}, finding: rsFinding(dnsUDPVS, "10.244.0.12"), wantSkip: "no longer exists"},
		{name: "draining TCP real server kept", finding: rsFinding(dnsTCPVS, "10.244.0.12"), wantSkip: "draining"},
		{name: "draining TCP real server deleted when allowed", set: func(p any) { p.(*DeleteIPVSRealServerParams).DeleteDraining = true },
			finding: rsFinding(dnsTCPVS, "10.244.0.12"), deleted: true},
		{name: "serving terminating pod kept while no ready endpoint is programmed", prep: func(w *ipvsActWorld) {
			w.view.SetEndpoints("kube-system", "kube-dns",
				ipvsEP("10.244.0.12", "UDP", "dns", false, true, true), ipvsEP("10.244.9.9", "UDP", "dns", true, true, false))
		}, finding: rsFinding(dnsUDPVS, "10.244.0.12"), wantSkip: "would black-hole traffic"},
		{name: "no endpoints at all in the view for that port", prep: func(w *ipvsActWorld) {
			w.view.SetEndpoints("kube-system", "kube-dns", ipvsEP("10.244.1.21", "TCP", "dns-tcp", true, true, false))
		}, finding: rsFinding(dnsUDPVS, "10.244.0.12"), wantSkip: "no endpoints at all for kube-system/kube-dns port \"dns\""},
		{name: "virtual server of no Service", prep: func(w *ipvsActWorld) { w.view.DeleteService("kube-system", "kube-dns") },
			finding: rsFinding(dnsUDPVS, "10.244.0.12"), wantSkip: "matches no Service"},
		{name: "IPVS unavailable", prep: func(w *ipvsActWorld) { w.ipvs.SetUnavailable("no ip_vs module") },
			finding: rsFinding(dnsUDPVS, "10.244.0.12"), wantSkip: "IPVS unavailable: no ip_vs module"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			w := newIPVSActWorld(t)
			if c.prep != nil {
				c.prep(w)
			}
			a := newIPVSAction(t, "DeleteIPVSRealServer", w.node, c.set)
			ref, _ := ipvs.DecodeVirtualRef(c.finding.Evidence)
			vs := ref.VS
			rs := c.finding.Evidence["rsAddress"].(string)
			_, planErr := a.Plan(ctx, c.finding)
			res, err := a.Execute(ctx, c.finding)
			if c.wantSkip != "" {
				wantSkip(t, planErr, c.wantSkip)
				wantSkip(t, err, c.wantSkip)
				if w.ipvs.Calls("DeleteRealServer") != 0 && !strings.Contains(c.name, "already gone") {
					t.Fatal("deleted despite the skip")
				}
				return
			}
			if planErr != nil || err != nil {
				t.Fatalf("plan %v, execute %v", planErr, err)
			}
			if hasRS(t, w, vs, rs) != !c.deleted {
				t.Fatalf("real server present = %v after %s", hasRS(t, w, vs, rs), res.Summary)
			}
			if !strings.HasPrefix(res.Details["restoreCommand"].(string), "ipvsadm -a ") {
				t.Errorf("details = %v", res.Details)
			}
		})
	}
}

func TestDeleteIPVSRealServerPerCycleLimitAndJSONEvidence(t *testing.T) {
	ctx := context.Background()
	w := newIPVSActWorld(t)
	a := newIPVSAction(t, "DeleteIPVSRealServer", w.node, nil) // maxPerCycle 1 per 1m
	if _, err := a.Execute(ctx, rsFinding(dnsUDPVS, "10.244.0.12")); err != nil {
		t.Fatal(err)
	}
	// The second stale real server waits for the next cycle.
	second := rsFinding(dnsUDPVS, "10.244.0.13")
	_, err := a.Plan(ctx, second)
	wantSkip(t, err, "maxPerCycle 1")
	_, err = a.Execute(ctx, second)
	wantSkip(t, err, "maxPerCycle 1")
	if !hasRS(t, w, dnsUDPVS, "10.244.0.13") {
		t.Fatal("limit exceeded")
	}
	w.clock.SetTime(ipvsT0.Add(61 * time.Second))
	w.view.SetFreshness(cluster.Freshness{Synced: true, Connected: true, LastEvent: ipvsT0.Add(60 * time.Second)})
	// Evidence read back from JSON (float64 numbers) changes nothing: the
	// action reads the typed reference.
	var ev map[string]any
	b, _ := json.Marshal(second.Evidence)
	if err := json.Unmarshal(b, &ev); err != nil {
		t.Fatal(err)
	}
	second.Evidence = ev
	if _, err := a.Execute(ctx, second); err != nil {
		t.Fatal(err)
	}
	if hasRS(t, w, dnsUDPVS, "10.244.0.13") {
		t.Fatal("not deleted in the next cycle")
	}
	// A finding without the typed reference is an error, never a guess
	// from its evidence.
	bad := rsFinding(dnsUDPVS, "10.244.1.21")
	bad.Subject.Refs = nil
	if _, err := a.Plan(ctx, bad); err == nil || !strings.Contains(err.Error(), "no IPVS real server reference") {
		t.Fatalf("want an error for a finding without a reference, got %v", err)
	}
}

func ipvsKubeProxyConfigz(excludeCIDRs ...string) *kubeproxy.Configz {
	return &kubeproxy.Configz{SyncPeriod: 30 * time.Second, Mode: "ipvs", IPVSExcludeCIDRs: excludeCIDRs}
}

func TestDeleteIPVSVirtualServer(t *testing.T) {
	ctx := context.Background()
	cases := []struct {
		name     string
		prep     func(w *ipvsActWorld)
		finding  finding.Finding
		wantSkip string
	}{
		{name: "deleted Service's virtual server", finding: vsFinding("TCP", "10.96.5.5", 80)},
		{name: "the view wants it", finding: vsFinding("UDP", "10.96.0.10", 53), wantSkip: "should exist (ClusterIP of kube-system/kube-dns)"},
		{name: "Service re-created before the action ran", prep: func(w *ipvsActWorld) {
			w.view.SetService(cluster.Service{Namespace: "default", Name: "web", ClusterIPs: []string{"10.96.5.5"},
				Ports: []cluster.ServicePort{{Protocol: "TCP", Port: 80}}})
		}, finding: vsFinding("TCP", "10.96.5.5", 80), wantSkip: "should exist"},
		{name: "empty view", prep: func(w *ipvsActWorld) {
			w.view.DeleteService("default", "kubernetes")
			w.view.DeleteService("kube-system", "kube-dns")
		}, finding: vsFinding("TCP", "10.96.5.5", 80), wantSkip: "no Services at all"},
		{name: "not kube-proxy's", finding: vsFinding("TCP", "172.16.0.1", 80), wantSkip: "outside managedCIDRs"},
		{name: "already gone", finding: vsFinding("TCP", "10.96.6.6", 80), wantSkip: "no longer exists"},
		{name: "view disconnected", prep: func(w *ipvsActWorld) {
			w.view.SetFreshness(cluster.Freshness{Synced: true, LastError: errors.New("watch: EOF")})
		}, finding: vsFinding("TCP", "10.96.5.5", 80), wantSkip: "disconnected (watch: EOF)"},
		{name: "no cluster view", prep: func(w *ipvsActWorld) { w.node.Cluster = nil },
			finding: vsFinding("TCP", "10.96.5.5", 80), wantSkip: "kubernetes is not configured"},
		{name: "IPVS unavailable", prep: func(w *ipvsActWorld) { w.ipvs.SetUnavailable("no ip_vs module") },
			finding: vsFinding("TCP", "10.96.5.5", 80), wantSkip: "IPVS unavailable"},
		// kube-proxy's ipvs.excludeCIDRs (kubernetes/kubernetes#134147)
		{name: "inside kube-proxy's excludeCIDRs", prep: func(w *ipvsActWorld) { w.kp.SetConfigz(ipvsKubeProxyConfigz("fd00::/64", "10.96.5.0/24"), nil) },
			finding: vsFinding("TCP", "10.96.5.5", 80), wantSkip: "inside kube-proxy's ipvs.excludeCIDRs (10.96.5.0/24)"},
		{name: "outside kube-proxy's excludeCIDRs", prep: func(w *ipvsActWorld) { w.kp.SetConfigz(ipvsKubeProxyConfigz("10.96.6.0/24"), nil) },
			finding: vsFinding("TCP", "10.96.5.5", 80)},
		{name: "/configz unreadable", prep: func(w *ipvsActWorld) { w.kp.SetConfigz(nil, errors.New("connection refused")) },
			finding: vsFinding("TCP", "10.96.5.5", 80), wantSkip: "ipvs.excludeCIDRs are unknown (reading kube-proxy's /configz: connection refused): refusing to delete TCP/10.96.5.5:80"},
		{name: "excludeCIDRs that do not parse", prep: func(w *ipvsActWorld) { w.kp.SetConfigz(ipvsKubeProxyConfigz("10.96.6.0/24", "soon"), nil) },
			finding: vsFinding("TCP", "10.96.5.5", 80), wantSkip: "ipvs.excludeCIDRs are unknown"},
		{name: "no kube-proxy adapter", prep: func(w *ipvsActWorld) { w.node.KubeProxy = nil },
			finding: vsFinding("TCP", "10.96.5.5", 80), wantSkip: "/configz is not read here"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			w := newIPVSActWorld(t)
			if c.prep != nil {
				c.prep(w)
			}
			a := newIPVSAction(t, "DeleteIPVSVirtualServer", w.node, nil)
			_, planErr := a.Plan(ctx, c.finding)
			res, err := a.Execute(ctx, c.finding)
			if c.wantSkip != "" {
				wantSkip(t, planErr, c.wantSkip)
				wantSkip(t, err, c.wantSkip)
				if w.ipvs.Calls("DeleteVirtualServer") != 0 {
					t.Fatal("deleted despite the skip")
				}
				return
			}
			if planErr != nil || err != nil {
				t.Fatalf("plan %v, execute %v", planErr, err)
			}
			vss, _ := w.ipvs.VirtualServers(ctx)
			for _, v := range vss {
				if v.Key() == "TCP/10.96.5.5:80" {
					t.Fatal("not deleted")
				}
			}
			if len(vss) != 3 {
				t.Fatalf("deleted more than one: %v", vss)
			}
			if rs := res.Details["realServers"].([]string); len(rs) != 1 || rs[0] != "10.244.3.3:8080 weight 1" {
				t.Errorf("details = %v", res.Details)
			}
		})
	}
}

func TestIPVSDeleteParamsValidation(t *testing.T) {
	typ, _ := Lookup("DeleteIPVSVirtualServer")
	p := typ.NewParams().(*DeleteIPVSVirtualServerParams)
	p.MaxPerCycle = 0
	p.CycleWindow = policy.D(0)
	p.ManagedCIDRs = []string{"10.96.0.0/33"}
	p.NodeIPs = []string{"node1"}
	errs := p.Validate()
	fields := []string{}
	for _, e := range errs {
		fields = append(fields, e.Field)
	}
	if strings.Join(fields, ",") != "maxPerCycle,cycleWindow,managedCIDRs[0],nodeIPs[0]" {
		t.Fatalf("fields = %v", fields)
	}
	for _, name := range []string{"DeleteIPVSVirtualServer", "DeleteIPVSRealServer"} {
		if typ, _ := Lookup(name); !typ.Disruptive {
			t.Errorf("%s must be Disruptive", name)
		}
	}
}
