package detect

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"strings"
	"testing"
	"time"

	clocktesting "k8s.io/utils/clock/testing"

	"github.com/remediate-dev/remediate/internal/cluster"
	"github.com/remediate-dev/remediate/internal/cluster/clustertest"
	"github.com/remediate-dev/remediate/internal/finding"
	"github.com/remediate-dev/remediate/internal/iptables"
	"github.com/remediate-dev/remediate/internal/ipvs"
	"github.com/remediate-dev/remediate/internal/kubeproxy"
	"github.com/remediate-dev/remediate/internal/nftables"
	"github.com/remediate-dev/remediate/internal/node"
)

// The real kube-proxy v1.34.4 capture: default/kubernetes:https and
// default/web:{http,dns}, two endpoints each for web.
const driftSave = "../internal/iptables/testdata/iptables-save-legacy.txt"

type driftWorld struct {
	clock *clocktesting.FakeClock
	ipt   *iptables.Fake
	view  *clustertest.Fake
	kp    *kubeproxy.Fake
	n     *node.Node
	t0    time.Time
}

func newDriftWorld(t *testing.T) *driftWorld {
	t.Helper()
	t0 := time.Date(2026, 11, 21, 12, 0, 0, 0, time.UTC)
	w := &driftWorld{clock: clocktesting.NewFakeClock(t0.Add(time.Hour)), ipt: iptables.NewFake(), view: clustertest.New(t0), t0: t0}
	b := readFile(t, driftSave)
	w.ipt.SetRules(iptables.IPv4, iptables.Legacy, b)
	w.kp = kubeproxy.NewFake(w.clock, 10*time.Second)
	w.kp.SetMode(kubeproxy.ModeIPTables, nil)
	w.setMetrics(t0.Add(59*time.Minute), t0.Add(30*time.Minute), 0)
	w.n = &node.Node{Name: "node1", Clock: w.clock, IPTables: w.ipt, Cluster: w.view, KubeProxy: w.kp}
	ready := func(a string, port int32, name, proto string) cluster.Endpoint {
		return cluster.Endpoint{Address: a, Port: port, Protocol: proto, PortName: name, NodeName: "node1", Ready: true, Serving: true}
	}
	w.view.SetService(cluster.Service{Namespace: "default", Name: "kubernetes", ClusterIPs: []string{"10.96.0.1"}, Created: t0, Changed: t0,
		Ports: []cluster.ServicePort{{Name: "https", Protocol: "TCP", Port: 443}}}, ready("10.200.0.1", 6443, "https", "TCP"))
	w.view.SetService(cluster.Service{Namespace: "default", Name: "web", ClusterIPs: []string{"10.96.91.18"}, Created: t0, Changed: t0,
		Ports: []cluster.ServicePort{{Name: "http", Protocol: "TCP", Port: 80}, {Name: "dns", Protocol: "UDP", Port: 53}}},
		ready("10.244.0.5", 8080, "http", "TCP"), ready("10.244.0.6", 8080, "http", "TCP"),
		ready("10.244.0.5", 53, "dns", "UDP"), ready("10.244.0.6", 53, "dns", "UDP"))
	// Each test's detectors get their own comparison.
	sharedObservation.Lock()
	sharedObservation.m = map[observationKey]*observationSlot{}
	sharedObservation.Unlock()
	return w
}

func readFile(t *testing.T, p string) string {
	t.Helper()
	b, err := osReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func (w *driftWorld) setMetrics(lastSync, lastQueued time.Time, pending int) {
	w.kp.SetMetrics(fmt.Sprintf(`# TYPE kubeproxy_sync_proxy_rules_last_timestamp_seconds gauge
kubeproxy_sync_proxy_rules_last_timestamp_seconds{ip_family="IPv4"} %d
# TYPE kubeproxy_sync_proxy_rules_last_queued_timestamp_seconds gauge
kubeproxy_sync_proxy_rules_last_queued_timestamp_seconds{ip_family="IPv4"} %d
# TYPE kubeproxy_sync_proxy_rules_endpoint_changes_pending gauge
kubeproxy_sync_proxy_rules_endpoint_changes_pending %d
# TYPE kubeproxy_sync_proxy_rules_service_changes_pending gauge
kubeproxy_sync_proxy_rules_service_changes_pending 0
# TYPE rest_client_requests_total counter
rest_client_requests_total{code="200",host="10.0.0.1:6443",method="GET"} 8
`, lastSync.Unix(), lastQueued.Unix(), pending))
}

func (w *driftWorld) detect(t *testing.T, d Detector) []finding.Finding {
	t.Helper()
	sharedObservation.Lock()
	sharedObservation.m = map[observationKey]*observationSlot{}
	sharedObservation.Unlock()
	fs, err := d.Detect(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return fs
}

func newDriftDetectors(t *testing.T, w *driftWorld) (Detector, Detector) {
	t.Helper()
	p := &DataplaneDriftParams{}
	p.SetDefaults()
	p.Families = []string{"IPv4"}
	if errs := p.Validate(); len(errs) > 0 {
		t.Fatal(errs)
	}
	dt, _ := Lookup("DataplaneDrift")
	kt, _ := Lookup("KubeProxyNotHearingAPI")
	d, err := dt.New(p, w.n)
	if err != nil {
		t.Fatal(err)
	}
	k, err := kt.New(p, w.n)
	if err != nil {
		t.Fatal(err)
	}
	return d, k
}

func driftTargets(fs []finding.Finding) string {
	var out []string
	for _, f := range fs {
		out = append(out, f.Detector+" "+f.Target)
	}
	return strings.Join(out, ", ")
}

func TestDataplaneDriftInSync(t *testing.T) {
	w := newDriftWorld(t)
	d, k := newDriftDetectors(t, w)
	if fs := w.detect(t, d); len(fs) != 0 {
		t.Fatalf("in sync: %s", driftTargets(fs))
	}
	if fs := w.detect(t, k); len(fs) != 0 {
		t.Fatalf("in sync: %s", driftTargets(fs))
	}
}

// A Service created after kube-proxy stopped hearing the API: not reported
// inside the grace (3 x 10 s), reported by name after it, by both
// detectors while nothing is queued; the deaf finding holds back when
// kube-proxy has work queued or pending (KubeProxySyncStale's case).
func TestDataplaneDriftNewServiceNotProgrammed(t *testing.T) {
	w := newDriftWorld(t)
	d, k := newDriftDetectors(t, w)
	now := w.clock.Now()
	late := cluster.Service{Namespace: "team", Name: "late", ClusterIPs: []string{"10.96.7.7"}, Created: now.Add(-20 * time.Second), Changed: now.Add(-20 * time.Second),
		Ports: []cluster.ServicePort{{Name: "http", Protocol: "TCP", Port: 80}}}
	w.view.SetService(late, cluster.Endpoint{Address: "10.244.0.9", Port: 8080, Protocol: "TCP", PortName: "http", Ready: true, Serving: true})
	if fs := w.detect(t, d); len(fs) != 0 {
		t.Fatalf("inside the grace: %s", driftTargets(fs))
	}
	w.clock.Step(15 * time.Second) // 35 s > 30 s
	fs := w.detect(t, d)
	if len(fs) != 1 || fs[0].Target != "dataplane/IPv4/team/late:http" || fs[0].Severity != finding.Critical ||
		!strings.Contains(fs[0].Message, "team/late:http") || !strings.Contains(fs[0].Message, "10.244.0.9:8080") ||
		!strings.Contains(fs[0].Message, "kube-proxy last synced") || fs[0].Evidence["serviceCreated"] == nil {
		t.Fatalf("drift: %s %+v", driftTargets(fs), fs)
	}
	fs = w.detect(t, k)
	if len(fs) != 1 || fs[0].Target != "kube-proxy/api-updates" || !strings.Contains(fs[0].Message, "not receiving API updates: team/late:http") ||
		fs[0].Evidence["restClientRequestsByCode"] == nil {
		t.Fatalf("deaf: %s %+v", driftTargets(fs), fs)
	}
	// Work queued after the last sync: kube-proxy heard something; not deaf.
	w.setMetrics(now.Add(-time.Minute), now, 0)
	if fs := w.detect(t, k); len(fs) != 0 {
		t.Fatalf("queued: %s", driftTargets(fs))
	}
	w.setMetrics(now.Add(-time.Minute), now.Add(-2*time.Minute), 3)
	if fs := w.detect(t, k); len(fs) != 0 {
		t.Fatalf("pending: %s", driftTargets(fs))
	}
}

// Churn: objects that changed within the grace are never reported, however
// different the rules are.
func TestDataplaneDriftChurnInsideGrace(t *testing.T) {
	w := newDriftWorld(t)
	d, k := newDriftDetectors(t, w)
	now := w.clock.Now()
	for i := 0; i < 20; i++ {
		w.view.SetService(cluster.Service{Namespace: "churn", Name: fmt.Sprintf("s%d", i), ClusterIPs: []string{fmt.Sprintf("10.96.8.%d", i)},
			Created: now.Add(-time.Duration(i) * time.Second), Changed: now.Add(-time.Duration(i) * time.Second),
			Ports: []cluster.ServicePort{{Name: "p", Protocol: "TCP", Port: 80}}},
			cluster.Endpoint{Address: fmt.Sprintf("10.244.8.%d", i), Port: 80, Protocol: "TCP", PortName: "p", Ready: true, Serving: true})
	}
	// web scaled down a moment ago: its old endpoint is still programmed.
	w.view.SetEndpoints("default", "web", cluster.Endpoint{Address: "10.244.0.5", Port: 8080, Protocol: "TCP", PortName: "http", Ready: true, Serving: true,
		SliceChanged: now.Add(-5 * time.Second)})
	w.view.SetEndpointsChanged("default", "web", now.Add(-5*time.Second))
	if fs := append(w.detect(t, d), w.detect(t, k)...); len(fs) != 0 {
		t.Fatalf("churn inside the grace: %s", driftTargets(fs))
	}
	// After the grace the scale-down of web is stale backends (dns lost
	// all endpoints: it should reject) and every churn Service is missing.
	w.clock.Step(time.Minute)
	fs := w.detect(t, d)
	got := driftTargets(fs)
	if len(fs) != 22 || !strings.Contains(got, "dataplane/IPv4/default/web:http") || !strings.Contains(got, "dataplane/IPv4/default/web:dns") {
		t.Fatalf("after the grace: %d %s", len(fs), got)
	}
}

// A programmed Service port absent from the view has no API object to date
// it: --once (a new detector) never reports it; the daemon's detector does
// after the grace from when it first saw it.
func TestDataplaneDriftDeletedServiceAgedByFirstSeen(t *testing.T) {
	w := newDriftWorld(t)
	w.view.DeleteService("default", "web")
	d, k := newDriftDetectors(t, w)
	if fs := w.detect(t, d); len(fs) != 0 {
		t.Fatalf("first sight: %s", driftTargets(fs))
	}
	w.clock.Step(31 * time.Second)
	fs := w.detect(t, d)
	if len(fs) != 2 || fs[0].Target != "dataplane/IPv4/default/web:dns" || fs[0].Evidence["firstSeenProgrammedWithoutService"] == nil {
		t.Fatalf("after the grace: %s", driftTargets(fs))
	}
	if fs := w.detect(t, k); len(fs) != 0 {
		t.Fatalf("a deleted Service is not evidence of deafness: %s", driftTargets(fs))
	}
}

func TestDataplaneDriftSyncPeriodFromConfigz(t *testing.T) {
	w := newDriftWorld(t)
	w.kp.SetConfigz(&kubeproxy.Configz{SyncPeriod: time.Minute, Mode: "iptables"}, nil)
	d, _ := newDriftDetectors(t, w)
	now := w.clock.Now()
	w.view.SetService(cluster.Service{Namespace: "team", Name: "late", ClusterIPs: []string{"10.96.7.7"}, Created: now.Add(-2 * time.Minute), Changed: now.Add(-2 * time.Minute),
		Ports: []cluster.ServicePort{{Name: "http", Protocol: "TCP", Port: 80}}})
	// 2 min < 3 x 1 min (from /configz): not yet; the mismatch is a warning.
	fs := w.detect(t, d)
	if len(fs) != 1 || fs[0].Target != "kube-proxy/syncPeriod" || !strings.Contains(fs[0].Message, "1m0s") || !strings.Contains(fs[0].Message, "10s") {
		t.Fatalf("configz: %s %+v", driftTargets(fs), fs)
	}
	w.clock.Step(90 * time.Second)
	if fs := w.detect(t, d); len(fs) != 2 || fs[0].Evidence["syncPeriodSource"] != "kube-proxy /configz" {
		t.Fatalf("after 3 x 1m: %s", driftTargets(fs))
	}
}

func TestDataplaneDriftSkips(t *testing.T) {
	w := newDriftWorld(t)
	d, _ := newDriftDetectors(t, w)
	w.kp.SetMode(kubeproxy.ModeIPVS, nil)
	if _, err := d.Detect(context.Background()); err == nil {
		t.Fatal("ipvs mode not skipped")
	} else if _, ok := finding.IsSkip(err); !ok {
		t.Fatalf("not a skip: %v", err)
	}
	w = newDriftWorld(t)
	d, _ = newDriftDetectors(t, w)
	w.view.SetFreshness(cluster.Freshness{Synced: true, Connected: false})
	if _, err := d.Detect(context.Background()); err == nil {
		t.Fatal("disconnected view not skipped")
	}
	w = newDriftWorld(t)
	w.n.Cluster = nil
	d, _ = newDriftDetectors(t, w)
	if _, err := d.Detect(context.Background()); err == nil {
		t.Fatal("no cluster view not skipped")
	}
}

var osReadFile = os.ReadFile

// IPVS mode: a serving endpoint missing as a real server (a new pod never
// programmed) is drift; a draining real server (weight 0) is not.
func TestDataplaneDriftIPVSMissingRealServer(t *testing.T) {
	w := newDriftWorld(t)
	w.kp.SetMode(kubeproxy.ModeIPVS, nil)
	fk := ipvs.NewFake()
	w.n.IPVS = fk
	vs := ipvs.VirtualServer{Address: netip.MustParseAddr("10.96.91.18"), Protocol: "TCP", Port: 80}
	dns := ipvs.VirtualServer{Address: netip.MustParseAddr("10.96.91.18"), Protocol: "UDP", Port: 53}
	api := ipvs.VirtualServer{Address: netip.MustParseAddr("10.96.0.1"), Protocol: "TCP", Port: 443}
	for _, v := range []ipvs.VirtualServer{vs, dns, api} {
		if err := fk.AddVirtualServer(v); err != nil {
			t.Fatal(err)
		}
	}
	add := func(v ipvs.VirtualServer, a string, port uint16, weight int) {
		if err := fk.AddRealServer(v, ipvs.RealServer{Address: netip.MustParseAddr(a), Port: port, Weight: weight}); err != nil {
			t.Fatal(err)
		}
	}
	add(api, "10.200.0.1", 6443, 1)
	add(dns, "10.244.0.5", 53, 1)
	add(dns, "10.244.0.6", 53, 1)
	add(vs, "10.244.0.5", 8080, 1)
	add(vs, "10.244.0.99", 8080, 0) // draining
	d, _ := newDriftDetectors(t, w)
	fs := w.detect(t, d)
	if len(fs) != 1 || fs[0].Target != "dataplane/IPv4/default/web:http" || !strings.Contains(fs[0].Message, "missing-backends [10.244.0.6:8080]") {
		t.Fatalf("ipvs: %s %+v", driftTargets(fs), fs)
	}
}

// nftables mode, from the real kube-proxy v1.34.4 capture: in sync with the
// captured cluster, then a Service the table lacks is reported.
func TestDataplaneDriftNFTables(t *testing.T) {
	w := newDriftWorld(t)
	w.kp.SetMode(kubeproxy.ModeNFTables, nil)
	fk := nftables.NewFake()
	if err := fk.SetRuleset(readFile(t, "../internal/nftables/testdata/kube-proxy-v1.34.4-ruleset.json")); err != nil {
		t.Fatal(err)
	}
	w.n.NFTables = fk
	t0 := w.t0
	ready := func(a string, port int32, name, proto string) cluster.Endpoint {
		return cluster.Endpoint{Address: a, Port: port, Protocol: proto, PortName: name, NodeName: "node1", Ready: true, Serving: true}
	}
	w.view.DeleteService("default", "web")
	w.view.SetService(cluster.Service{Namespace: "nft-capture", Name: "web", ClusterIPs: []string{"10.96.172.238"}, Created: t0, Changed: t0,
		Ports: []cluster.ServicePort{{Name: "http", Protocol: "TCP", Port: 80}, {Name: "dns", Protocol: "UDP", Port: 53}}},
		ready("10.244.0.5", 8080, "http", "TCP"), ready("10.244.0.6", 8080, "http", "TCP"),
		ready("10.244.0.5", 53, "dns", "UDP"), ready("10.244.0.6", 53, "dns", "UDP"))
	w.view.SetService(cluster.Service{Namespace: "nft-capture", Name: "np", ClusterIPs: []string{"10.96.241.69"}, Type: "NodePort", Created: t0, Changed: t0,
		Ports: []cluster.ServicePort{{Name: "http", Protocol: "TCP", Port: 80, NodePort: 32095}}}, ready("10.244.0.7", 8080, "http", "TCP"))
	w.view.SetService(cluster.Service{Namespace: "nft-capture", Name: "empty", ClusterIPs: []string{"10.96.219.213"}, Created: t0, Changed: t0,
		Ports: []cluster.ServicePort{{Name: "http", Protocol: "TCP", Port: 80}}})
	d, k := newDriftDetectors(t, w)
	if fs := append(w.detect(t, d), w.detect(t, k)...); len(fs) != 0 {
		t.Fatalf("in sync with the capture: %s %+v", driftTargets(fs), fs)
	}
	w.view.SetService(cluster.Service{Namespace: "nft-capture", Name: "late", ClusterIPs: []string{"10.96.7.7"}, Created: t0, Changed: t0,
		Ports: []cluster.ServicePort{{Name: "http", Protocol: "TCP", Port: 80}}}, ready("10.244.0.9", 8080, "http", "TCP"))
	fs := w.detect(t, d)
	if len(fs) != 1 || fs[0].Target != "dataplane/IPv4/nft-capture/late:http" || fs[0].Evidence["source"] != "nftables" {
		t.Fatalf("nftables: %s %+v", driftTargets(fs), fs)
	}
	if fs := w.detect(t, k); len(fs) != 1 {
		t.Fatalf("deaf in nftables mode: %s", driftTargets(fs))
	}
}

// A terminating-fallback Service that kube-proxy did not follow: its ready
// pods replaced by terminating, still serving ones (kube-proxy falls back
// to them), the rules still on the old pods. The message names the stale
// backends the rules still forward to as well as the missing ones, not
// only the evidence.
func TestDataplaneDriftMessageNamesStaleBackends(t *testing.T) {
	w := newDriftWorld(t)
	d, _ := newDriftDetectors(t, w)
	term := func(a string) cluster.Endpoint {
		return cluster.Endpoint{Address: a, Port: 8080, Protocol: "TCP", PortName: "http", NodeName: "node1", Serving: true, Terminating: true}
	}
	dns := func(a string) cluster.Endpoint {
		return cluster.Endpoint{Address: a, Port: 53, Protocol: "UDP", PortName: "dns", NodeName: "node1", Ready: true, Serving: true}
	}
	w.view.SetService(cluster.Service{Namespace: "default", Name: "web", ClusterIPs: []string{"10.96.91.18"}, Created: w.t0, Changed: w.t0,
		Ports: []cluster.ServicePort{{Name: "http", Protocol: "TCP", Port: 80}, {Name: "dns", Protocol: "UDP", Port: 53}}},
		term("10.244.0.7"), term("10.244.0.8"), dns("10.244.0.5"), dns("10.244.0.6"))
	fs := w.detect(t, d)
	if len(fs) != 1 || fs[0].Target != "dataplane/IPv4/default/web:http" {
		t.Fatalf("drift: %s %+v", driftTargets(fs), fs)
	}
	for _, want := range []string{"10.244.0.7:8080", "10.244.0.8:8080", "stale", "10.244.0.5:8080", "10.244.0.6:8080"} {
		if !strings.Contains(fs[0].Message, want) {
			t.Errorf("message lacks %q: %s", want, fs[0].Message)
		}
	}
}
