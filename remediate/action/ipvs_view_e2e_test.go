package action_test

import (
	"context"
	"net/netip"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap/zaptest"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/remediate-dev/remediate/detect"
	"github.com/remediate-dev/remediate/internal/finding"
	"github.com/remediate-dev/remediate/internal/ipvs"
	"github.com/remediate-dev/remediate/internal/kube"
	"github.com/remediate-dev/remediate/internal/node"
	"github.com/remediate-dev/remediate/internal/testing/controlplane"
	"github.com/remediate-dev/remediate/remediate/action"
)

// TestIPVSWithRealClusterViewEndToEnd drives the IPVS stale-real-server
// detector and DeleteIPVSRealServer with the real informer-backed view over
// a real kube-apiserver (IPVS itself is the fake: this kernel has no
// ip_vs). The CoreDNS rolling update: the old pod is first still an
// endpoint (nothing stale), then terminating but serving while a new pod
// is ready (stale, still answering), then gone (stale, dead) and deleted;
// with kube-apiserver stopped the view disconnects and the delete refuses.
func TestIPVSWithRealClusterViewEndToEnd(t *testing.T) {
	cp := controlplane.Start(t, controlplane.Options{})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	cs := cp.Client

	if _, err := cs.CoreV1().Services("kube-system").Create(ctx, &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "kube-dns", Namespace: "kube-system"},
		Spec: corev1.ServiceSpec{ClusterIP: "10.96.0.10", Ports: []corev1.ServicePort{
			{Name: "dns", Protocol: corev1.ProtocolUDP, Port: 53},
			{Name: "dns-tcp", Protocol: corev1.ProtocolTCP, Port: 53},
		}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	ep := func(addr string, ready, serving, terminating bool) discoveryv1.Endpoint {
		return discoveryv1.Endpoint{Addresses: []string{addr}, Conditions: discoveryv1.EndpointConditions{
			Ready: ptr.To(ready), Serving: ptr.To(serving), Terminating: ptr.To(terminating)}}
	}
	slice := &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Name: "kube-dns-abc", Namespace: "kube-system", Labels: map[string]string{discoveryv1.LabelServiceName: "kube-dns"}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       []discoveryv1.EndpointPort{{Name: ptr.To("dns"), Protocol: ptr.To(corev1.ProtocolUDP), Port: ptr.To(int32(53))}},
		Endpoints:   []discoveryv1.Endpoint{ep("10.244.0.12", true, true, false), ep("10.244.1.21", true, true, false)},
	}
	slice, err := cs.DiscoveryV1().EndpointSlices("kube-system").Create(ctx, slice, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}

	c, err := kube.NewClient(cp.RestConfig, kube.Options{QPS: 50, Burst: 100})
	if err != nil {
		t.Fatal(err)
	}
	view, err := kube.NewView(c.Interface, c.Contact, nil, zaptest.NewLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	view.Start(ctx)
	sctx, scancel := context.WithTimeout(ctx, 60*time.Second)
	defer scancel()
	if !view.WaitForSync(sctx) {
		t.Fatal("view did not sync")
	}

	fk := ipvs.NewFake()
	dns := ipvs.VirtualServer{Address: netip.MustParseAddr("10.96.0.10"), Protocol: ipvs.UDP, Port: 53}
	for _, err := range []error{
		fk.AddVirtualServer(dns),
		fk.AddRealServer(dns, ipvs.RealServer{Address: netip.MustParseAddr("10.244.0.12"), Port: 53, Weight: 1}),
		fk.AddRealServer(dns, ipvs.RealServer{Address: netip.MustParseAddr("10.244.1.21"), Port: 53, Weight: 1}),
	} {
		if err != nil {
			t.Fatal(err)
		}
	}
	n := &node.Node{Name: "n1", IPVS: fk, Cluster: view, Unavailable: map[string]string{}}
	dt, _ := detect.Lookup("IPVSStaleRealServer")
	dp := dt.NewParams().(*detect.IPVSStaleRealServerParams)
	dp.RequireIPVSMode = false
	det, err := dt.New(dp, n)
	if err != nil {
		t.Fatal(err)
	}
	at, _ := action.Lookup("DeleteIPVSRealServer")
	act, err := at.New(at.NewParams(), n)
	if err != nil {
		t.Fatal(err)
	}
	const target = "ipvs-rs/UDP/10.96.0.10:53/10.244.0.12:53"
	// waitFindings polls the detector until the view has caught up with
	// the last API change.
	waitFindings := func(what string, want func([]finding.Finding) bool) []finding.Finding {
		t.Helper()
		deadline := time.Now().Add(30 * time.Second)
		for {
			fs, err := det.Detect(ctx)
			if err == nil && want(fs) {
				return fs
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: last findings %+v, err %v", what, fs, err)
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	update := func(eps ...discoveryv1.Endpoint) {
		t.Helper()
		slice.Endpoints = eps
		var err error
		if slice, err = cs.DiscoveryV1().EndpointSlices("kube-system").Update(ctx, slice, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}

	waitFindings("both pods ready: nothing stale", func(fs []finding.Finding) bool { return len(fs) == 0 })

	update(ep("10.244.0.12", false, true, true), ep("10.244.1.21", true, true, false))
	fs := waitFindings("old pod terminating", func(fs []finding.Finding) bool { return len(fs) == 1 })
	if fs[0].Target != target || fs[0].Evidence["reason"] != ipvs.BackendTerminatingWhileReady {
		t.Fatalf("finding = %+v", fs[0])
	}

	update(ep("10.244.1.21", true, true, false))
	fs = waitFindings("old pod gone", func(fs []finding.Finding) bool {
		return len(fs) == 1 && fs[0].Evidence["reason"] == ipvs.BackendNotEndpoint
	})
	if _, err := act.Plan(ctx, fs[0]); err != nil {
		t.Fatalf("plan: %v", err)
	}

	// kube-apiserver goes away: the view disconnects and the delete refuses.
	cp.StopAPIServer()
	deadline := time.Now().Add(60 * time.Second)
	for view.Freshness().Connected {
		if time.Now().After(deadline) {
			t.Fatal("view still connected a minute after kube-apiserver stopped")
		}
		time.Sleep(200 * time.Millisecond)
	}
	_, err = act.Execute(ctx, fs[0])
	if reason, ok := finding.IsSkip(err); !ok || !strings.Contains(reason, "disconnected") {
		t.Fatalf("execute with the API down: %v, want a skip saying disconnected", err)
	}
	if fk.Calls("DeleteRealServer") != 0 {
		t.Fatal("deleted with a disconnected view")
	}

	cp.StartAPIServer()
	deadline = time.Now().Add(90 * time.Second)
	for !view.Freshness().Connected {
		if time.Now().After(deadline) {
			t.Fatal("view did not reconnect")
		}
		time.Sleep(200 * time.Millisecond)
	}
	res, err := act.Execute(ctx, fs[0])
	if err != nil {
		t.Fatalf("execute after reconnect: %v", err)
	}
	t.Logf("executed: %s", res.Summary)
	waitFindings("after the delete", func(fs []finding.Finding) bool { return len(fs) == 0 })
}
