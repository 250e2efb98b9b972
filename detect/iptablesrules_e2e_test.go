package detect

import (
	"context"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/clock"
	"k8s.io/utils/ptr"

	"github.com/remediate-dev/remediate/internal/finding"
	"github.com/remediate-dev/remediate/internal/iptables"
	"github.com/remediate-dev/remediate/internal/node"
	"github.com/remediate-dev/remediate/internal/testing/controlplane"
)

// TestE2EIPTablesKubeProxyChains runs the real kube-proxy v1.34.4 in
// iptables mode on the real apiserver (the package's shared one) with Services of every shape its
// rules take (several endpoints, session affinity, external IPs, a
// LoadBalancer with source ranges and Local traffic policy, a NodePort
// without endpoints, internalTrafficPolicy Local without local endpoints):
// kube-proxy's own rules give no finding. Then its masquerade rules are
// corrupted behind its back: the RETURN's mark match stripped (found, and
// cleared by kube-proxy's next sync, which rewrites KUBE-POSTROUTING), and
// the POSTROUTING jump deleted (found, and cleared by restarting it).
func TestE2EIPTablesKubeProxyChains(t *testing.T) {
	cp := controlplane.Shared(t)
	ns := cp.Namespace("chains-e2e")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	kp := cp.StartKubeProxy(controlplane.KubeProxyOptions{SyncPeriod: 10 * time.Second})
	local := func(n int) []discoveryv1.Endpoint {
		eps := endpointsFor(n)
		eps[0].NodeName = ptr.To(kp.NodeName)
		return eps
	}
	mk := func(name string, spec corev1.ServiceSpec, eps []discoveryv1.Endpoint, lbIP string) {
		t.Helper()
		spec.Ports = []corev1.ServicePort{{Name: "http", Port: 80, Protocol: corev1.ProtocolTCP, TargetPort: intstr.FromInt32(8080)}}
		svc, err := cp.Client.CoreV1().Services(ns).Create(ctx, &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns}, Spec: spec}, metav1.CreateOptions{})
		if err != nil {
			t.Fatalf("create service %s: %v", name, err)
		}
		if lbIP != "" {
			svc.Status.LoadBalancer.Ingress = []corev1.LoadBalancerIngress{{IP: lbIP}}
			if _, err := cp.Client.CoreV1().Services(ns).UpdateStatus(ctx, svc, metav1.UpdateOptions{}); err != nil {
				t.Fatalf("status of %s: %v", name, err)
			}
		}
		if eps == nil {
			return
		}
		es := &discoveryv1.EndpointSlice{
			ObjectMeta:  metav1.ObjectMeta{Name: name + "-1", Namespace: ns, Labels: map[string]string{discoveryv1.LabelServiceName: name}},
			AddressType: discoveryv1.AddressTypeIPv4,
			Ports:       []discoveryv1.EndpointPort{{Name: ptr.To("http"), Port: ptr.To[int32](8080), Protocol: ptr.To(corev1.ProtocolTCP)}},
			Endpoints:   eps,
		}
		if _, err := cp.Client.DiscoveryV1().EndpointSlices(ns).Create(ctx, es, metav1.CreateOptions{}); err != nil {
			t.Fatalf("create endpointslice %s: %v", name, err)
		}
	}
	mk("plain", corev1.ServiceSpec{}, endpointsFor(3), "")
	mk("affinity", corev1.ServiceSpec{SessionAffinity: corev1.ServiceAffinityClientIP}, endpointsFor(2), "")
	mk("extip", corev1.ServiceSpec{ExternalIPs: []string{"192.0.2.10"}}, endpointsFor(2), "")
	mk("lb-local", corev1.ServiceSpec{Type: corev1.ServiceTypeLoadBalancer, ExternalTrafficPolicy: corev1.ServiceExternalTrafficPolicyLocal,
		LoadBalancerSourceRanges: []string{"198.51.100.0/24"}}, local(2), "192.0.2.20")
	mk("lb-cluster", corev1.ServiceSpec{Type: corev1.ServiceTypeLoadBalancer}, endpointsFor(2), "192.0.2.21")
	mk("nodeport-empty", corev1.ServiceSpec{Type: corev1.ServiceTypeNodePort}, nil, "")
	mk("itp-local", corev1.ServiceSpec{InternalTrafficPolicy: ptr.To(corev1.ServiceInternalTrafficPolicyLocal)}, endpointsFor(1), "")

	save := func(table string) string {
		cmd := cp.NetNS.Command("iptables-legacy-save", "-t", table)
		cmd.Env = kp.Env()
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("iptables-legacy-save: %v: %s", err, out)
		}
		return string(out)
	}
	run := func(args ...string) {
		t.Helper()
		cmd := cp.NetNS.Command("iptables-legacy", append([]string{"-w", "5"}, args...)...)
		cmd.Env = kp.Env()
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("iptables-legacy %v: %v: %s", args, err, out)
		}
	}
	want := []string{ns + "/plain:http -> ", "recent", ns + "/extip:http external IP", ns + "/lb-local:http loadbalancer IP", "KUBE-FW-",
		"KUBE-SVL-", ns + "/lb-local:http health check node port", ns + "/lb-cluster:http loadbalancer IP",
		ns + "/nodeport-empty:http has no endpoints", ns + "/itp-local:http has no local endpoints"}
	deadline := time.Now().Add(60 * time.Second)
	for {
		all := save("nat") + save("filter")
		var missing []string
		for _, w := range want {
			if !strings.Contains(all, w) {
				missing = append(missing, w)
			}
		}
		if len(missing) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("kube-proxy did not program %q in 60s:\n%s", missing, all)
		}
		time.Sleep(500 * time.Millisecond)
	}

	ipt := iptables.New(iptables.Config{Prefix: []string{"ip", "netns", "exec", cp.NetNS.Name}})
	n := &node.Node{Name: kp.NodeName, Clock: clock.RealClock{}, Log: zap.NewNop(), IPTables: ipt}
	d := newDetector(t, "IPTablesRules", n, func(p any) {
		pp := p.(*IPTablesRulesParams)
		pp.Families, pp.Backends, pp.ProxyMode, pp.MaxSaveDutyCycle = []string{"IPv4"}, []string{"legacy"}, "iptables", 0
	})
	detect := func() map[string]finding.Finding {
		t.Helper()
		fs, err := d.Detect(ctx)
		if err != nil {
			t.Fatal(err)
		}
		out := map[string]finding.Finding{}
		for _, f := range fs {
			out[f.Target] = f
		}
		return out
	}
	waitFor := func(step, target string, present bool, within time.Duration) {
		t.Helper()
		start := time.Now()
		for {
			fs := detect()
			_, ok := fs[target]
			if ok == present && (present || len(fs) == 0) {
				if present {
					t.Logf("%s: found after %v: %s", step, time.Since(start).Round(time.Millisecond), fs[target].Message)
				} else {
					t.Logf("%s: cleared after %v", step, time.Since(start).Round(time.Millisecond))
				}
				return
			}
			if time.Since(start) > within {
				t.Fatalf("%s: %s present=%v not reached in %v; findings %v", step, target, present, within, fs)
			}
			time.Sleep(time.Second)
		}
	}

	if fs := detect(); len(fs) != 0 {
		t.Fatalf("kube-proxy's own rules: %v", fs)
	}
	t.Logf("kube-proxy's own rules (%d nat, %d filter lines): no finding", strings.Count(save("nat"), "\n-A "), strings.Count(save("filter"), "\n-A "))

	// The RETURN for unmarked packets loses its mark match.
	run("-t", "nat", "-R", "KUBE-POSTROUTING", "1", "-j", "RETURN")
	waitFor("RETURN stripped", "iptables/IPv4/legacy/nat/KUBE-POSTROUTING/return", true, 5*time.Second)
	// A Service change makes kube-proxy sync, which rewrites KUBE-POSTROUTING.
	scaleService(ctx, t, cp, ns, "plain", 2)
	waitFor("RETURN rewritten by kube-proxy's sync", "iptables/IPv4/legacy/nat/KUBE-POSTROUTING/return", false, 30*time.Second)

	// The POSTROUTING jump deleted: kube-proxy restores it when it starts.
	run("-t", "nat", "-D", "POSTROUTING", "-m", "comment", "--comment", "kubernetes postrouting rules", "-j", "KUBE-POSTROUTING")
	waitFor("POSTROUTING jump deleted", "iptables/IPv4/legacy/nat/POSTROUTING/KUBE-POSTROUTING", true, 5*time.Second)
	kp.Restart()
	waitFor("kube-proxy restarted", "iptables/IPv4/legacy/nat/POSTROUTING/KUBE-POSTROUTING", false, 60*time.Second)
}
