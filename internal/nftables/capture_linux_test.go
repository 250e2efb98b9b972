//go:build linux

package nftables

import (
	"context"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/remediate-dev/remediate/internal/testing/controlplane"
)

// TestCaptureKubeProxyFixtures regenerates testdata/kube-proxy-v1.34.4-*
// from the real kube-proxy v1.34.4 in nftables mode when
// REMEDIATE_CAPTURE_FIXTURES=1: a real apiserver, a test-made Kubernetes
// namespace with a Service with two ready endpoints (TCP and UDP ports), a
// Service without endpoints and a NodePort Service, then `nft -j list
// ruleset` (and the text form, for humans), /metrics and /proxyMode.
func TestCaptureKubeProxyFixtures(t *testing.T) {
	if os.Getenv("REMEDIATE_CAPTURE_FIXTURES") != "1" {
		t.Skip("set REMEDIATE_CAPTURE_FIXTURES=1 to re-capture testdata from the real kube-proxy")
	}
	cp := controlplane.Start(t, controlplane.Options{})
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	const ns = "nft-capture"
	CreateKubeProxyFixtureObjects(ctx, t, cp, ns)
	kp := cp.StartKubeProxy(controlplane.KubeProxyOptions{Mode: "nftables"})

	nft := func(args ...string) string {
		out, err := cp.NetNS.Command("nft", args...).Output()
		if err != nil {
			t.Fatalf("nft %v: %v", args, err)
		}
		return string(out)
	}
	// Wait until kube-proxy programmed all three services.
	deadline := time.Now().Add(60 * time.Second)
	for {
		text := nft("list", "ruleset")
		if strings.Contains(text, ns+"/web/tcp/http__10.244.0.6/8080") && strings.Contains(text, ns+"/empty") &&
			strings.Contains(text, ns+"/np/tcp/") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("kube-proxy did not program the services; ruleset:\n%s", text)
		}
		time.Sleep(time.Second)
	}
	write := func(name, content string) {
		if err := os.WriteFile(filepath.Join("testdata", name), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("kube-proxy-v1.34.4-ruleset.json", nft("-j", "list", "ruleset"))
	write("kube-proxy-v1.34.4-ruleset.nft", nft("list", "ruleset"))
	hc := cp.NetNS.HTTPClient(5 * time.Second)
	for name, u := range map[string]string{"metrics.txt": kp.MetricsURL, "proxyMode.txt": kp.ProxyModeURL} {
		resp, err := hc.Get(u)
		if err != nil {
			t.Fatal(err)
		}
		b, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil {
			t.Fatal(err)
		}
		write("kube-proxy-v1.34.4-nftables-"+name, string(b))
	}

	// The table deleted by someone else (a firewall reload, nft flush
	// ruleset), then an EndpointSlice change: kube-proxy's partial sync
	// fails against the missing table and counts a sync failure.
	if out, err := cp.NetNS.Command("nft", "delete", "table", "ip", "kube-proxy").CombinedOutput(); err != nil {
		t.Fatalf("nft delete table: %v: %s", err, out)
	}
	es, err := cp.Client.DiscoveryV1().EndpointSlices(ns).Get(ctx, "web-1", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	es.Endpoints = append(es.Endpoints, discoveryv1.Endpoint{Addresses: []string{"10.244.0.8"}, Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true)}})
	if _, err := cp.Client.DiscoveryV1().EndpointSlices(ns).Update(ctx, es, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	deadline = time.Now().Add(60 * time.Second)
	for {
		resp, err := hc.Get(kp.MetricsURL)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if strings.Contains(string(b), "kubeproxy_sync_proxy_rules_nftables_sync_failures_total{") {
			write("kube-proxy-v1.34.4-nftables-metrics-syncfailure.txt", string(b))
			write("kube-proxy-v1.34.4-ruleset-after-syncfailure.nft", nft("list", "ruleset"))
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no nftables sync failure counted 60s after deleting the table and changing an EndpointSlice")
		}
		time.Sleep(time.Second)
	}
}

// CreateKubeProxyFixtureObjects creates, in namespace ns: Service web
// (ports http 80/TCP → 8080 and dns 53/UDP) with two ready endpoints
// 10.244.0.5 and 10.244.0.6, Service empty (80/TCP) without endpoints, and
// NodePort Service np (80/TCP → 8080) with endpoint 10.244.0.7.
func CreateKubeProxyFixtureObjects(ctx context.Context, t testing.TB, cp *controlplane.ControlPlane, ns string) {
	t.Helper()
	c := cp.Client
	if _, err := c.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create namespace: %v", err)
	}
	svc := func(name string, typ corev1.ServiceType, ports ...corev1.ServicePort) {
		s := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
			Spec: corev1.ServiceSpec{Selector: map[string]string{"app": name}, Type: typ, Ports: ports}}
		if _, err := c.CoreV1().Services(ns).Create(ctx, s, metav1.CreateOptions{}); err != nil {
			t.Fatalf("create service %s: %v", name, err)
		}
	}
	slice := func(svcName string, ports []discoveryv1.EndpointPort, addrs ...string) {
		es := &discoveryv1.EndpointSlice{
			ObjectMeta:  metav1.ObjectMeta{Name: svcName + "-1", Namespace: ns, Labels: map[string]string{discoveryv1.LabelServiceName: svcName}},
			AddressType: discoveryv1.AddressTypeIPv4,
			Ports:       ports,
		}
		for _, a := range addrs {
			es.Endpoints = append(es.Endpoints, discoveryv1.Endpoint{Addresses: []string{a}, Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true)}})
		}
		if _, err := c.DiscoveryV1().EndpointSlices(ns).Create(ctx, es, metav1.CreateOptions{}); err != nil {
			t.Fatalf("create endpointslice %s: %v", svcName, err)
		}
	}
	svc("web", corev1.ServiceTypeClusterIP,
		corev1.ServicePort{Name: "http", Port: 80, Protocol: corev1.ProtocolTCP},
		corev1.ServicePort{Name: "dns", Port: 53, Protocol: corev1.ProtocolUDP})
	slice("web", []discoveryv1.EndpointPort{
		{Name: ptr.To("http"), Port: ptr.To[int32](8080), Protocol: ptr.To(corev1.ProtocolTCP)},
		{Name: ptr.To("dns"), Port: ptr.To[int32](53), Protocol: ptr.To(corev1.ProtocolUDP)},
	}, "10.244.0.5", "10.244.0.6")
	svc("empty", corev1.ServiceTypeClusterIP, corev1.ServicePort{Name: "http", Port: 80, Protocol: corev1.ProtocolTCP})
	svc("np", corev1.ServiceTypeNodePort, corev1.ServicePort{Name: "http", Port: 80, Protocol: corev1.ProtocolTCP})
	slice("np", []discoveryv1.EndpointPort{
		{Name: ptr.To("http"), Port: ptr.To[int32](8080), Protocol: ptr.To(corev1.ProtocolTCP)},
	}, "10.244.0.7")
}
