package detect

import (
	"context"
	"sort"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/clock"
	"k8s.io/utils/ptr"

	"github.com/remediate-dev/remediate/internal/finding"
	"github.com/remediate-dev/remediate/internal/kubeproxy"
	"github.com/remediate-dev/remediate/internal/node"
	"github.com/remediate-dev/remediate/internal/testing/controlplane"
)

// TestE2EKubeProxyLockStall runs the kube-proxy detectors against the real
// kube-proxy v1.34.4 (iptables-legacy mode) in a test-owned namespace, on
// the package's shared control plane (its Service in a namespace of its own):
// healthy → no finding; the xtables lock held by another process and an
// EndpointSlice changed → stale-sync and restore-failure findings for IPv4
// within 2 x syncPeriod + one interval, then /healthz unhealthy; lock
// released → every finding clears; kube-proxy stopped → KubeProxyUnreachable
// for both endpoints and the other detectors skip.
func TestE2EKubeProxyLockStall(t *testing.T) {
	const (
		syncPeriod = 10 * time.Second
		interval   = 2 * time.Second
	)
	cp := controlplane.Shared(t)
	ns := cp.Namespace("lockstall-e2e")
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	createWebService(ctx, t, cp, ns)
	kp := cp.StartKubeProxy(controlplane.KubeProxyOptions{SyncPeriod: syncPeriod})

	client := kp.Client(kubeproxy.Options{SyncPeriod: syncPeriod, Timeout: 2 * time.Second, CacheTTL: time.Second})
	n := &node.Node{Name: kp.NodeName, Clock: clock.RealClock{}, Log: zap.NewNop(), KubeProxy: client}
	dets := map[string]Detector{}
	for _, name := range []string{"KubeProxySyncStale", "KubeProxySyncSlow", "KubeProxyEndpointChangesPending",
		"KubeProxyRestoreFailures", "KubeProxyUnhealthy", "KubeProxyUnreachable", "KubeProxyRuleBloat"} {
		dets[name] = newDetector(t, name, n, func(p any) {
			// Shorter windows than the defaults so the findings clear sooner
			// after the stall.
			switch p := p.(type) {
			case *KubeProxyRestoreFailuresParams:
				p.Window.Duration = 2 * syncPeriod
			case *KubeProxySyncSlowParams:
				// The syncs during the stall wait 5 s for the lock: slow
				// (limit 0.33 x syncPeriod), reported while in the window.
				p.Window.Duration = 3 * syncPeriod
			}
		})
	}
	// cycle runs every detector once, as the engine would, and returns
	// "Detector target" keys of the findings.
	allowSkips := false
	cycle := func() map[string]finding.Finding {
		out := map[string]finding.Finding{}
		for name, d := range dets {
			dctx, dcancel := context.WithTimeout(ctx, 5*time.Second)
			fs, err := d.Detect(dctx)
			dcancel()
			if _, skip := finding.IsSkip(err); skip && allowSkips {
				continue
			}
			if err != nil {
				t.Errorf("%s: %v", name, err)
				continue
			}
			for _, f := range fs {
				out[f.Detector+" "+f.Target] = f
			}
		}
		return out
	}
	keys := func(m map[string]finding.Finding) string {
		var k []string
		for key := range m {
			k = append(k, key)
		}
		sort.Strings(k)
		return strings.Join(k, ", ")
	}

	// Cycles start every interval, as the daemon's loop does.
	tick := time.NewTicker(interval)
	defer tick.Stop()

	// Healthy: six cycles, no finding.
	for i := 0; i < 6; i++ {
		if fs := cycle(); len(fs) != 0 {
			t.Fatalf("healthy kube-proxy: findings %s: %+v", keys(fs), fs)
		}
		<-tick.C
	}

	// Stall: hold the lock, then change the EndpointSlice.
	holder := controlplane.HoldLock(t, kp.XtablesLock)
	stallStart := time.Now()
	addEndpoint(ctx, t, cp, ns, "10.244.0.7")
	tick.Reset(interval)
	want := []string{"KubeProxySyncStale kube-proxy/IPv4", "KubeProxyRestoreFailures kube-proxy/IPv4"}
	deadline := stallStart.Add(2*syncPeriod + interval)
	seen := map[string]time.Duration{}
	var last map[string]finding.Finding
	for len(seen) < len(want) || seen["KubeProxyUnhealthy kube-proxy/IPv4"] == 0 {
		last = cycle()
		t.Logf("stall +%v: %s", time.Since(stallStart).Round(100*time.Millisecond), keys(last))
		for _, k := range append(want, "KubeProxyUnhealthy kube-proxy/IPv4") {
			if _, ok := last[k]; ok && seen[k] == 0 {
				seen[k] = time.Since(stallStart)
				t.Logf("%s after %v: %s", k, seen[k].Round(time.Millisecond), last[k].Message)
			}
		}
		if _, bad := last["KubeProxyUnreachable kube-proxy/metrics"]; bad {
			t.Fatalf("kube-proxy metrics unreachable during the stall: %+v", last)
		}
		if time.Since(stallStart) > 2*syncPeriod+4*interval {
			t.Fatalf("after %v: findings %s; want %v and KubeProxyUnhealthy for IPv4", time.Since(stallStart).Round(time.Second), keys(last), want)
		}
		<-tick.C
	}
	for _, k := range want {
		if stallStart.Add(seen[k]).After(deadline) {
			t.Errorf("%s came after %v, want within 2 x syncPeriod + one interval (%v)", k, seen[k], 2*syncPeriod+interval)
		}
	}
	ev := last["KubeProxyRestoreFailures kube-proxy/IPv4"].Evidence
	if ev["ipFamily"] != "IPv4" || ev["failures"].(float64) < 1 {
		t.Errorf("restore failure evidence %v", ev)
	}

	// Release: kube-proxy syncs again; the findings clear (restore
	// failures once they leave the 2 x syncPeriod window).
	holder.Release(t)
	released := time.Now()
	tick.Reset(interval)
	for {
		last = cycle()
		t.Logf("released +%v: %s", time.Since(released).Round(100*time.Millisecond), keys(last))
		if len(last) == 0 {
			t.Logf("all findings cleared %v after the release", time.Since(released).Round(time.Millisecond))
			break
		}
		if time.Since(released) > 4*syncPeriod+2*interval {
			t.Fatalf("findings still present %v after the release: %s", time.Since(released).Round(time.Second), keys(last))
		}
		<-tick.C
	}

	// kube-proxy gone: one finding per endpoint (connection refused); the
	// other detectors skip, naming the cause.
	kp.Stop(t)
	allowSkips = true
	time.Sleep(1100 * time.Millisecond) // past the adapter's cache TTL
	last = cycle()
	if got, want := keys(last), "KubeProxyUnreachable kube-proxy/healthz, KubeProxyUnreachable kube-proxy/metrics"; got != want {
		t.Fatalf("kube-proxy stopped: findings %q, want %q", got, want)
	}
	if f := last["KubeProxyUnreachable kube-proxy/metrics"]; f.Evidence["kind"] != "unreachable" || !strings.Contains(f.Message, "connection refused") {
		t.Errorf("unreachable finding %+v", f)
	}
	if _, err := dets["KubeProxySyncStale"].Detect(ctx); err == nil {
		t.Error("KubeProxySyncStale without kube-proxy: no skip")
	} else if r, ok := finding.IsSkip(err); !ok || !strings.Contains(r, "unreachable") {
		t.Errorf("KubeProxySyncStale without kube-proxy: %v, want a skip naming the cause", err)
	}
}

// createWebService creates Service "web" (http/80, dns/53) and its
// EndpointSlice "web-1" with two ready endpoints in namespace ns.
func createWebService(ctx context.Context, t *testing.T, cp *controlplane.ControlPlane, ns string) {
	t.Helper()
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: ns},
		Spec: corev1.ServiceSpec{
			Selector: map[string]string{"app": "web"},
			Ports: []corev1.ServicePort{
				{Name: "http", Port: 80, Protocol: corev1.ProtocolTCP},
				{Name: "dns", Port: 53, Protocol: corev1.ProtocolUDP},
			},
		},
	}
	if _, err := cp.Client.CoreV1().Services(ns).Create(ctx, svc, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create service: %v", err)
	}
	es := &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Name: "web-1", Namespace: ns, Labels: map[string]string{discoveryv1.LabelServiceName: "web"}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports: []discoveryv1.EndpointPort{
			{Name: ptr.To("http"), Port: ptr.To[int32](8080), Protocol: ptr.To(corev1.ProtocolTCP)},
			{Name: ptr.To("dns"), Port: ptr.To[int32](53), Protocol: ptr.To(corev1.ProtocolUDP)},
		},
		Endpoints: []discoveryv1.Endpoint{
			{Addresses: []string{"10.244.0.5"}, Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true)}},
			{Addresses: []string{"10.244.0.6"}, Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true)}},
		},
	}
	if _, err := cp.Client.DiscoveryV1().EndpointSlices(ns).Create(ctx, es, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create endpointslice: %v", err)
	}
}

func addEndpoint(ctx context.Context, t *testing.T, cp *controlplane.ControlPlane, ns, addr string) {
	t.Helper()
	es, err := cp.Client.DiscoveryV1().EndpointSlices(ns).Get(ctx, "web-1", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	es.Endpoints = append(es.Endpoints, discoveryv1.Endpoint{Addresses: []string{addr}, Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true)}})
	if _, err := cp.Client.DiscoveryV1().EndpointSlices(ns).Update(ctx, es, metav1.UpdateOptions{}); err != nil {
		t.Fatalf("update endpointslice: %v", err)
	}
}
