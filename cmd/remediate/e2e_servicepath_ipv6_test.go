package main

import (
	"context"
	"encoding/json"
	"net/netip"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/clock"

	"github.com/remediate-dev/remediate/detect"
	"github.com/remediate-dev/remediate/internal/finding"
	"github.com/remediate-dev/remediate/internal/kube"
	"github.com/remediate-dev/remediate/internal/node"
	"github.com/remediate-dev/remediate/internal/probe"
	"github.com/remediate-dev/remediate/internal/testing/controlplane"
	"github.com/remediate-dev/remediate/policy"
)

// TestE2EServicePathProbeIPv6 is TestE2EServicePathProbe's dataplane
// proof over IPv6: its own control plane, IPv6 single-stack (service range
// controlplane.ServiceCIDR6, the apiserver advertising and listening on
// the namespace's ULA address fd00:200::1, the Node's InternalIP
// IPv6), and the real kube-proxy v1.34.4 with an IPv6 clusterCIDR in
// iptables mode, then nftables mode on the same control plane. The
// `kubernetes` Service (ClusterIP fd00:10:96::1, the apiserver behind it)
// and a canary Service whose IPv6 endpoint is a listener of the test.
// A policy with families [IPv4] skips, naming both Services. Per mode:
//
//   - healthy: no finding, the judged line naming both IPv6 ClusterIPs;
//   - a filter rule dropping DNAT'ed IPv6 traffic (ip6tables, or an
//     `ip6` nft table; kube-proxy's rules unchanged): both paths are
//     critical in one run, naming the bracketed ClusterIP and the backend
//     that answers directly, also from the real binary's --once in its
//     one run (exit 2; iptables mode only, to save 10 s); the backends
//     still answer directly;
//   - the rule removed: the findings clear at the next run.
func TestE2EServicePathProbeIPv6(t *testing.T) {
	parallelE2E(t)
	const testNS = "probe-e2e6"
	cp := controlplane.Start(t, controlplane.Options{ServiceCIDR: controlplane.ServiceCIDR6,
		ExtraAPIServerArgs: []string{"--bind-address", "::"}})
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	const clusterCIDR = "fd00:10:244::/64"
	kp := cp.StartKubeProxy(controlplane.KubeProxyOptions{ClusterCIDR: clusterCIDR})
	if _, err := cp.Client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: testNS}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	nodeAddr := netip.MustParseAddr(cp.NodeAddress)
	if !nodeAddr.Is6() {
		t.Fatalf("node address %s is not IPv6", nodeAddr)
	}
	backend := netip.AddrPortFrom(nodeAddr, 18080)
	createCanary(ctx, t, cp, testNS, backend)
	startCanaryBackend(t, cp, backend)

	view, err := kube.NewView(cp.Client, nil, clock.RealClock{}, zap.NewNop())
	if err != nil {
		t.Fatal(err)
	}
	view.Start(ctx)
	if !view.WaitForSync(ctx) {
		t.Fatal("view not synced")
	}
	// The cluster is IPv6 single-stack: both Services have one IPv6
	// ClusterIP.
	vips := map[string]string{}
	for _, s := range view.Services() {
		if s.Name == "kubernetes" || s.Namespace == testNS {
			if len(s.ClusterIPs) != 1 || !netip.MustParseAddr(s.ClusterIPs[0]).Is6() {
				t.Fatalf("%s/%s ClusterIPs %v: want one IPv6", s.Namespace, s.Name, s.ClusterIPs)
			}
			vips[s.Name] = s.ClusterIPs[0]
		}
	}
	if vips["kubernetes"] != "fd00:10:96::1" || vips["canary"] == "" {
		t.Fatalf("ClusterIPs %v", vips)
	}
	apiVIP := "[fd00:10:96::1]:443"
	canaryVIP := netip.AddrPortFrom(netip.MustParseAddr(vips["canary"]), 80).String()
	apiBackend := netip.AddrPortFrom(nodeAddr, 6443)

	prober := probe.New(probe.Options{Dial: cp.NetNS.DialContext})
	params := func(p any) {
		pp := p.(*detect.ServicePathProbeParams)
		// Both paths judged in one run: 2 failing Service connects and
		// a direct one each.
		pp.Canaries, pp.Families, pp.MinPeriod, pp.MaxConnects = []string{testNS + "/canary"}, []string{"IPv6"}, policy.D(time.Second), 6
	}
	const apiTarget, canaryTarget = "service-path/IPv6/default/kubernetes:443", "service-path/IPv6/" + testNS + "/canary:80"
	run := func(t *testing.T, d detect.Detector) map[string]finding.Finding {
		t.Helper()
		return runServicePath(ctx, t, d, 20*time.Second)
	}

	once := newOnceRunner(ctx, t, cp, e2eServicePathPolicyIPv6).run

	// A policy leaving IPv6 out probes nothing here and says why.
	d4 := servicePathDetector(t, &node.Node{Name: kp.NodeName, Clock: clock.RealClock{}, Log: zap.NewNop(), Cluster: view, Probe: prober},
		func(p any) { params(p); p.(*detect.ServicePathProbeParams).Families = []string{"IPv4"} })
	if _, err := d4.Detect(ctx); err == nil || !strings.Contains(err.Error(), "default/kubernetes: its ClusterIP fd00:10:96::1 is IPv6, not in families [IPv4]") ||
		!strings.Contains(err.Error(), testNS+"/canary: its ClusterIP "+vips["canary"]+" is IPv6") {
		t.Fatalf("families [IPv4] on the IPv6 cluster: %v", err)
	}

	// mode runs the cases against the kube-proxy running as nodeName
	// (withOnce: the real binary's --once too, 10 s);
	// kubeProxyRules returns its IPv6 rules, which must contain each of
	// programmed (so the paths go through kube-proxy's IPv6 DNAT).
	mode := func(t *testing.T, nodeName string, withOnce bool, dropOn, dropOff []string, kubeProxyRules func() string, programmed ...string) {
		waitServicePaths(ctx, t, view, prober, "default/kubernetes", testNS+"/canary")
		rules := kubeProxyRules()
		for _, want := range programmed {
			if !strings.Contains(rules, want) {
				t.Fatalf("kube-proxy's IPv6 rules lack %q:\n%s", want, rules)
			}
		}
		n := &node.Node{Name: nodeName, Clock: clock.RealClock{}, Log: zap.NewNop(), Cluster: view, Probe: prober}
		d := servicePathDetector(t, n, params)
		t.Run("healthy", func(t *testing.T) {
			for i := 0; i < 2; i++ {
				if fs := run(t, d); len(fs) != 0 {
					t.Fatalf("healthy: %v", fs)
				}
				j := d.(detect.Judged).Judged()
				if !strings.Contains(j, "2 of 2 Service paths answer") || !strings.Contains(j, apiVIP) || !strings.Contains(j, canaryVIP) {
					t.Fatalf("healthy: judged %q", j)
				}
				time.Sleep(time.Second)
			}
		})
		t.Run("DNAT'ed traffic dropped", func(t *testing.T) {
			before := kubeProxyRules()
			netnsRun(t, cp, dropOn...)
			added := time.Now()
			fs := run(t, d)
			for target, want := range map[string][2]string{apiTarget: {apiVIP, apiBackend.String()}, canaryTarget: {canaryVIP, backend.String()}} {
				f, ok := fs[target]
				if !ok || f.Severity != finding.Critical || f.Evidence["verdict"] != "dataplane" || f.Evidence["family"] != "IPv6" {
					t.Fatalf("dropped DNAT'ed IPv6 traffic: no critical %s finding at the next run: %v", target, fs)
				}
				if !strings.Contains(f.Message, "(IPv6 ClusterIP "+want[0]+")") || !strings.Contains(f.Message, want[1]+" connected") ||
					f.Evidence["clusterIP"] != want[0] {
					t.Fatalf("the finding does not name the ClusterIP %s and the answering backend %s: %s (evidence %v)", want[0], want[1], f.Message, f.Evidence)
				}
				// The evidence as the JSON report shows it.
				checked, err := json.Marshal(f.Evidence["backendsChecked"])
				if err != nil || !strings.HasPrefix(string(checked), `[{"addr":"`+want[1]+`","outcome":"connected"`) {
					t.Fatalf("backendsChecked %s (%v), want %s connected", checked, err, want[1])
				}
				t.Logf("reported %v after the rule was added: %s", time.Since(added).Round(time.Millisecond), f.Message)
			}
			// The real binary's --once (its own dialer, in the
			// namespace) judges both in its one run.
			if withOnce {
				code, rep := once(t, nodeName)
				crit := map[string]string{}
				for _, f := range rep.Findings {
					if f.Rule == "service-path-probe" && f.Severity == "critical" {
						crit[f.Target] = f.Message
					}
				}
				if code != 2 || len(crit) != 2 || !strings.Contains(crit[apiTarget], "(IPv6 ClusterIP "+apiVIP+")") ||
					!strings.Contains(crit[canaryTarget], backend.String()+" connected") {
					t.Fatalf("--once: exit %d, %+v", code, rep)
				}
			}
			// The backends still answer directly, and kube-proxy's
			// rules are what they were.
			for _, b := range []netip.AddrPort{apiBackend, backend} {
				if r := prober.Connect(ctx, b, 2*time.Second); !r.OK() {
					t.Fatalf("%s does not answer directly: %s", b, r)
				}
			}
			if after := kubeProxyRules(); after != before {
				t.Fatalf("kube-proxy's rules changed:\nbefore:\n%s\nafter:\n%s", before, after)
			}
		})
		t.Run("rule removed", func(t *testing.T) {
			ruleRemovedClears(t, cp, dropOff, func() map[string]finding.Finding { return run(t, d) })
		})
	}

	t.Run("iptables", func(t *testing.T) {
		rule := []string{"OUTPUT", "-m", "conntrack", "--ctstate", "DNAT", "-j", "DROP"}
		mode(t, kp.NodeName, true,
			append([]string{"ip6tables-legacy", "-I"}, rule...),
			append([]string{"ip6tables-legacy", "-D"}, rule...),
			func() string {
				return saveCounters.ReplaceAllString(netnsRun(t, cp, "ip6tables-legacy-save", "-t", "nat"), "")
			},
			"-j DNAT --to-destination "+apiBackend.String(), "-j DNAT --to-destination "+backend.String(),
			"! -s "+clusterCIDR+" -d fd00:10:96::1/128") // the node's own traffic is masqueraded
	})

	t.Run("nftables", func(t *testing.T) {
		// kube-proxy ran dual-stack (both families where the kernel
		// can): its legacy rules of both go.
		kp2 := kubeProxyToNFTables(t, cp, kp, controlplane.KubeProxyOptions{NodeName: "node2", ClusterCIDR: clusterCIDR},
			"iptables-legacy", "ip6tables-legacy")
		mode(t, kp2.NodeName, false,
			[]string{"nft", "add table ip6 rmdprobe; add chain ip6 rmdprobe out { type filter hook output priority 0; }; add rule ip6 rmdprobe out ct status dnat drop"},
			[]string{"nft", "delete table ip6 rmdprobe"},
			func() string { return netnsRun(t, cp, "nft", "list", "table", "ip6", "kube-proxy") },
			"dnat to "+apiBackend.String(), "dnat to "+backend.String(), "ip6 saddr != "+clusterCIDR+" jump mark-for-masquerade")
	})
}

const e2eServicePathPolicyIPv6 = `apiVersion: remediate.dev/v1alpha1
kind: RemediationPolicy
mode: audit
detectorTimeout: 20s
rules:
- name: service-path-probe
  detector: {type: ServicePathProbe, canaries: [probe-e2e6/canary], families: [IPv6], maxConnects: 6}
`
