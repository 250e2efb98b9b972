//go:build linux

package iptables_test

import (
	"context"
	"fmt"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"

	"github.com/remediate-dev/remediate/internal/dataplane"
	"github.com/remediate-dev/remediate/internal/iptables"
	"github.com/remediate-dev/remediate/internal/testing/controlplane"
)

// TestE2EDecodeEqualsSaveWithKubeProxy runs the real kube-proxy v1.34.4 in
// iptables (legacy) mode on the real apiserver, with Services of every kind
// it programs: ClusterIP with several endpoints, NodePort, LoadBalancer
// ingress IPs with source ranges and externalTrafficPolicy Local (health
// check node port, KUBE-FW/KUBE-XLB/KUBE-SVL chains), externalIPs, session
// affinity ClientIP (recent), internalTrafficPolicy Local without local
// endpoints, no endpoints (REJECT/DROP), terminating endpoints, UDP and
// SCTP ports, and a cluster CIDR (local-traffic detection). The adapter's
// decode of the legacy IPv4 entries (no save run) equals
// iptables-legacy-save's output of the same tables token for token, line
// numbers included, and the dataplane model built from either is the same.
// kube-proxy is stalled on its xtables lock while the two are read, so
// both see the same rules.
func TestE2EDecodeEqualsSaveWithKubeProxy(t *testing.T) {
	cp := controlplane.Start(t, controlplane.Options{})
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	kp := cp.StartKubeProxy(controlplane.KubeProxyOptions{SyncPeriod: 10 * time.Second, ClusterCIDR: "10.244.0.0/16"})
	const ns = "default"
	seq := 0
	eps := func(n int, local bool, cond discoveryv1.EndpointConditions) []discoveryv1.Endpoint {
		var out []discoveryv1.Endpoint
		for i := 0; i < n; i++ {
			seq++
			e := discoveryv1.Endpoint{Addresses: []string{fmt.Sprintf("10.244.%d.%d", seq/250, seq%250+1)}, Conditions: cond}
			if local && i == 0 {
				e.NodeName = ptr.To(kp.NodeName)
			}
			out = append(out, e)
		}
		return out
	}
	ready := discoveryv1.EndpointConditions{Ready: ptr.To(true)}
	terminating := discoveryv1.EndpointConditions{Ready: ptr.To(false), Serving: ptr.To(true), Terminating: ptr.To(true)}
	mk := func(name string, proto corev1.Protocol, spec corev1.ServiceSpec, endpoints []discoveryv1.Endpoint, lbIP string) {
		t.Helper()
		spec.Ports = []corev1.ServicePort{{Name: "p", Port: 80, Protocol: proto, TargetPort: intstr.FromInt32(8080)}}
		svc, err := cp.Client.CoreV1().Services(ns).Create(ctx, &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: spec}, metav1.CreateOptions{})
		if err != nil {
			t.Fatalf("create service %s: %v", name, err)
		}
		if lbIP != "" {
			svc.Status.LoadBalancer.Ingress = []corev1.LoadBalancerIngress{{IP: lbIP}}
			if _, err := cp.Client.CoreV1().Services(ns).UpdateStatus(ctx, svc, metav1.UpdateOptions{}); err != nil {
				t.Fatalf("status of %s: %v", name, err)
			}
		}
		if endpoints == nil {
			return
		}
		es := &discoveryv1.EndpointSlice{
			ObjectMeta:  metav1.ObjectMeta{Name: name + "-1", Labels: map[string]string{discoveryv1.LabelServiceName: name}},
			AddressType: discoveryv1.AddressTypeIPv4,
			Ports:       []discoveryv1.EndpointPort{{Name: ptr.To("p"), Port: ptr.To[int32](8080), Protocol: ptr.To(proto)}},
			Endpoints:   endpoints,
		}
		if _, err := cp.Client.DiscoveryV1().EndpointSlices(ns).Create(ctx, es, metav1.CreateOptions{}); err != nil {
			t.Fatalf("create endpointslice %s: %v", name, err)
		}
	}
	tcp, udp, sctp := corev1.ProtocolTCP, corev1.ProtocolUDP, corev1.ProtocolSCTP
	mk("plain", tcp, corev1.ServiceSpec{}, eps(3, false, ready), "")
	mk("dns", udp, corev1.ServiceSpec{}, eps(2, false, ready), "")
	mk("sig", sctp, corev1.ServiceSpec{}, eps(1, false, ready), "")
	mk("affinity", tcp, corev1.ServiceSpec{SessionAffinity: corev1.ServiceAffinityClientIP}, eps(2, false, ready), "")
	mk("extip", tcp, corev1.ServiceSpec{ExternalIPs: []string{"192.0.2.10"}}, eps(2, false, ready), "")
	mk("nodeport", udp, corev1.ServiceSpec{Type: corev1.ServiceTypeNodePort}, eps(2, false, ready), "")
	mk("lb-local", tcp, corev1.ServiceSpec{Type: corev1.ServiceTypeLoadBalancer, ExternalTrafficPolicy: corev1.ServiceExternalTrafficPolicyLocal,
		LoadBalancerSourceRanges: []string{"198.51.100.0/24"}}, eps(2, true, ready), "192.0.2.20")
	mk("lb-cluster", tcp, corev1.ServiceSpec{Type: corev1.ServiceTypeLoadBalancer, SessionAffinity: corev1.ServiceAffinityClientIP}, eps(2, false, ready), "192.0.2.21")
	mk("nodeport-empty", tcp, corev1.ServiceSpec{Type: corev1.ServiceTypeNodePort}, nil, "")
	mk("lb-empty", tcp, corev1.ServiceSpec{Type: corev1.ServiceTypeLoadBalancer}, nil, "192.0.2.22")
	mk("itp-local", tcp, corev1.ServiceSpec{InternalTrafficPolicy: ptr.To(corev1.ServiceInternalTrafficPolicyLocal)}, eps(1, false, ready), "")
	mk("terminating", tcp, corev1.ServiceSpec{Type: corev1.ServiceTypeLoadBalancer, ExternalTrafficPolicy: corev1.ServiceExternalTrafficPolicyLocal},
		append(eps(1, true, terminating), eps(1, false, ready)...), "192.0.2.23")

	save := iptables.New(iptables.Config{Prefix: []string{"env", "XTABLES_LOCKFILE=" + kp.XtablesLock, "ip", "netns", "exec", cp.NetNS.Name},
		Timeout: time.Minute, NoDecode: true})
	dec := iptables.New(iptables.Config{Prefix: []string{"ip", "netns", "exec", cp.NetNS.Name}, NetNS: "/var/run/netns/" + cp.NetNS.Name,
		Timeout: time.Minute})
	want := []string{ns + "/plain:p -> ", ns + "/dns:p cluster IP", ns + "/sig:p cluster IP", "recent", ns + "/extip:p external IP",
		ns + "/nodeport:p", ns + "/lb-local:p loadbalancer IP", "KUBE-FW-", "KUBE-SVL-", "KUBE-EXT-",
		ns + "/lb-local:p health check node port", ns + "/lb-cluster:p loadbalancer IP",
		ns + "/nodeport-empty:p has no endpoints", ns + "/lb-empty:p has no endpoints",
		ns + "/itp-local:p has no local endpoints", ns + "/terminating:p loadbalancer IP", "-m sctp", "10.244.0.0/16"}
	var text string
	deadline := time.Now().Add(90 * time.Second)
	for {
		s, err := save.Save(ctx, iptables.IPv4, iptables.Legacy)
		if err != nil {
			t.Fatal(err)
		}
		text = s.Rules.String()
		var missing []string
		for _, w := range want {
			if !strings.Contains(text, w) {
				missing = append(missing, w)
			}
		}
		if len(missing) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("kube-proxy did not program %q in 90s:\n%s", missing, text)
		}
		time.Sleep(time.Second)
	}

	// Stall kube-proxy on its lock (observation takes none) and read the
	// same rules both ways.
	h := controlplane.HoldLock(t, kp.XtablesLock)
	defer h.Release(t)
	got, err := dec.Save(ctx, iptables.IPv4, iptables.Legacy)
	if err != nil {
		t.Fatal(err)
	}
	ref, err := save.Save(ctx, iptables.IPv4, iptables.Legacy)
	if err != nil {
		t.Fatal(err)
	}
	if !got.Decoded || got.DecodeFallback != "" || ref.Decoded {
		t.Fatalf("decode adapter: decoded %v (fallback %q); save adapter decoded %v", got.Decoded, got.DecodeFallback, ref.Decoded)
	}
	if n := ref.Rules.RuleCount(); n < 100 || got.Rules.RuleCount() != n {
		t.Fatalf("%d rules decoded, %d saved", got.Rules.RuleCount(), n)
	}
	if d := diffRules(ref.Rules, got.Rules); len(d) > 0 {
		t.Fatalf("decode differs from iptables-legacy-save:\n%s", strings.Join(d, "\n"))
	}
	a := dataplane.FromIPTables(ref.Rules, dataplane.IPv4, "save")
	b := dataplane.FromIPTables(got.Rules, dataplane.IPv4, "save")
	if len(a.Ports) < 12 || !reflect.DeepEqual(a, b) {
		t.Fatalf("dataplane models differ (%d and %d service ports)", len(a.Ports), len(b.Ports))
	}
	t.Logf("%d rules, %d service ports in the model: decode equals the save", got.Rules.RuleCount(), len(a.Ports))
}

// diffRules compares tables, chains, policies and every rule's tokens,
// target and line number.
func diffRules(want, got *iptables.Ruleset) []string {
	var d []string
	if len(want.Tables) != len(got.Tables) {
		return []string{fmt.Sprintf("%d tables, want %d", len(got.Tables), len(want.Tables))}
	}
	for i, wt := range want.Tables {
		gt := got.Tables[i]
		if wt.Name != gt.Name || len(wt.Chains) != len(gt.Chains) {
			d = append(d, fmt.Sprintf("table %d: %s/%d chains, want %s/%d", i, gt.Name, len(gt.Chains), wt.Name, len(wt.Chains)))
			continue
		}
		for j, wc := range wt.Chains {
			gc := gt.Chains[j]
			if wc.Name != gc.Name || wc.Policy != gc.Policy || len(wc.Rules) != len(gc.Rules) {
				d = append(d, fmt.Sprintf("%s chain %d: %s %s/%d rules, want %s %s/%d", wt.Name, j, gc.Name, gc.Policy, len(gc.Rules), wc.Name, wc.Policy, len(wc.Rules)))
				continue
			}
			for k, wr := range wc.Rules {
				gr := gc.Rules[k]
				if !slices.Equal(wr.Args, gr.Args) || wr.Target != gr.Target || wr.Goto != gr.Goto || wr.Line != gr.Line {
					d = append(d, fmt.Sprintf("%s %s rule %d: got %d %q, want %d %q", wt.Name, wc.Name, k+1, gr.Line, gr.Args, wr.Line, wr.Args))
				}
			}
		}
	}
	if len(d) > 10 {
		d = d[:10]
	}
	return d
}
