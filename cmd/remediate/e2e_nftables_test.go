package main

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
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

	"github.com/remediate-dev/remediate/detect"
	"github.com/remediate-dev/remediate/internal/finding"
	"github.com/remediate-dev/remediate/internal/iptables"
	"github.com/remediate-dev/remediate/internal/kubeproxy"
	"github.com/remediate-dev/remediate/internal/nftables"
	"github.com/remediate-dev/remediate/internal/node"
	"github.com/remediate-dev/remediate/internal/procs"
	"github.com/remediate-dev/remediate/internal/testing/controlplane"
	"github.com/remediate-dev/remediate/policy"
)

const e2eNFTablesPolicy = `apiVersion: remediate.dev/v1alpha1
kind: RemediationPolicy
mode: audit
detectorTimeout: 15s
kubeProxy: {syncPeriod: 10s}
rules:
- name: nft-integrity
  detector: {type: KubeProxyNFTablesIntegrity}
- name: nft-shadowing
  detector: {type: NFTablesShadowing}
- name: mode-leftovers
  detector: {type: KubeProxyModeLeftovers}
- name: nft-failures
  detector: {type: KubeProxyNFTablesFailures}
`

// nftE2EDetectors are the detectors of issue 11 run against the real
// kube-proxy.
var nftE2EDetectors = []string{"KubeProxyNFTablesIntegrity", "NFTablesShadowing", "KubeProxyModeLeftovers",
	"KubeProxyNFTablesFailures", "HungNFT", "IPTablesRules", "KubeProxyRestoreFailures", "KubeProxyRuleBloat",
	"IPTablesVersionSkew", "KubeProxyKernelModules"}

// TestE2EKubeProxyNFTablesMode runs the nftables-mode detectors against the
// real kube-proxy v1.34.4 in nftables mode, with a real apiserver, Services
// in a test-made Kubernetes namespace, and the real nft listing the test's
// network namespace, every interval as the daemon does (one control plane
// for all subtests): healthy → no finding and the iptables-only detectors
// skip; a host firewall's drop chain before kube-proxy → shadowing warning;
// KUBE-* iptables rules left in the legacy backend → leftovers finding;
// `nft delete table ip kube-proxy` → critical integrity finding at the next
// cycle and from `remediate --once`; kube-proxy restarted (what
// RestartKubeProxy does) → the table is rebuilt and the finding clears.
func TestE2EKubeProxyNFTablesMode(t *testing.T) {
	parallelE2E(t)
	const (
		syncPeriod = 10 * time.Second
		interval   = 2 * time.Second
	)
	cp := controlplane.Start(t, controlplane.Options{})
	ctx, cancel := context.WithTimeout(context.Background(), 6*time.Minute)
	defer cancel()
	createNFTE2EObjects(ctx, t, cp, "nft-e2e")
	kp := cp.StartKubeProxy(controlplane.KubeProxyOptions{Mode: "nftables", SyncPeriod: syncPeriod})
	ns := cp.NetNS.Name
	prefix := []string{"ip", "netns", "exec", ns}
	run := func(stdin string, args ...string) {
		t.Helper()
		cmd := exec.Command("ip", append([]string{"netns", "exec", ns}, args...)...)
		cmd.Env = kp.Env() // private XTABLES_LOCKFILE for iptables-legacy
		cmd.Stdin = strings.NewReader(stdin)
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("%v: %v: %s", args, err, out)
		}
	}
	// Wait until kube-proxy programmed the test's Service.
	waitUntil(t, 60*time.Second, "kube-proxy programs nft-e2e/web", func() bool {
		out, _ := exec.Command("ip", "netns", "exec", ns, "nft", "list", "map", "ip", "kube-proxy", "service-ips").Output()
		return strings.Contains(string(out), "nft-e2e/web/tcp/http")
	})

	kpc := kp.Client(kubeproxy.Options{SyncPeriod: syncPeriod, Timeout: 2 * time.Second, CacheTTL: time.Second})
	n := &node.Node{Name: kp.NodeName, Clock: clock.RealClock{}, Log: zap.NewNop(), KubeProxy: kpc,
		NFTables: nftables.New(nftables.Config{Prefix: prefix, CacheTTL: time.Second}),
		IPTables: iptables.New(iptables.Config{Prefix: prefix}),
		Procs:    procs.New("/proc")}
	dets := map[string]detect.Detector{}
	for _, name := range nftE2EDetectors {
		typ, ok := detect.Lookup(name)
		if !ok {
			t.Fatalf("%s not registered", name)
		}
		p := typ.NewParams()
		switch pp := p.(type) {
		case *detect.IPTablesRulesParams:
			pp.ProxyMode = "auto"
		case *detect.IPTablesVersionSkewParams:
			pp.ProxyMode = "auto"
		case *detect.KubeProxyKernelModulesParams:
			pp.ProxyMode = "auto"
		}
		if v, ok := p.(policy.Validator); ok && len(v.Validate()) > 0 {
			t.Fatalf("%s params invalid: %v", name, v.Validate())
		}
		d, err := typ.New(p, n)
		if err != nil {
			t.Fatal(err)
		}
		dets[name] = d
	}
	// cycle runs every detector once, as the engine does, and returns the
	// findings by "Detector target" and the skip reasons by detector.
	cycle := func() (map[string]finding.Finding, map[string]string) {
		found, skipped := map[string]finding.Finding{}, map[string]string{}
		for name, d := range dets {
			dctx, dcancel := context.WithTimeout(ctx, 10*time.Second)
			fs, err := d.Detect(dctx)
			dcancel()
			if r, ok := finding.IsSkip(err); ok {
				skipped[name] = r
				continue
			}
			if err != nil {
				t.Errorf("%s: %v", name, err)
				continue
			}
			for _, f := range fs {
				found[f.Detector+" "+f.Target] = f
			}
		}
		return found, skipped
	}
	keys := func(m map[string]finding.Finding) string {
		var k []string
		for key := range m {
			k = append(k, key)
		}
		sort.Strings(k)
		return strings.Join(k, ", ")
	}
	// within runs cycles every interval until want is found (or gone, when
	// gone is true), failing after max.
	within := func(what, want string, gone bool, max time.Duration) finding.Finding {
		t.Helper()
		start := time.Now()
		for {
			found, _ := cycle()
			f, ok := found[want]
			if ok != gone {
				t.Logf("%s: %q after %v", what, want, time.Since(start).Round(time.Millisecond))
				return f
			}
			if time.Since(start) > max {
				t.Fatalf("%s: after %v findings are %s; want %q %s", what, time.Since(start).Round(time.Second), keys(found), want,
					map[bool]string{false: "present", true: "gone"}[gone])
			}
			time.Sleep(interval)
		}
	}

	t.Run("healthy", func(t *testing.T) {
		for i := 0; i < 3; i++ {
			found, skipped := cycle()
			if len(found) != 0 {
				t.Fatalf("healthy kube-proxy in nftables mode: findings %s: %+v", keys(found), found)
			}
			for _, name := range []string{"IPTablesRules", "KubeProxyRestoreFailures", "KubeProxyRuleBloat", "IPTablesVersionSkew", "KubeProxyKernelModules"} {
				if !strings.Contains(skipped[name], "nftables mode") {
					t.Errorf("%s: skip reason %q, want one naming nftables mode", name, skipped[name])
				}
			}
			for _, name := range []string{"KubeProxyNFTablesIntegrity", "NFTablesShadowing", "KubeProxyModeLeftovers", "KubeProxyNFTablesFailures"} {
				if r, ok := skipped[name]; ok {
					t.Errorf("%s skipped in nftables mode: %s", name, r)
				}
			}
			time.Sleep(interval)
		}
	})

	t.Run("shadowing drop chain", func(t *testing.T) {
		// A host firewall in prerouting before kube-proxy's DNAT, policy
		// drop (loopback accepted, so the test still reaches kube-proxy).
		run(`table inet hostfw {
	chain pre {
		type filter hook prerouting priority -150; policy drop;
		iifname "lo" accept
	}
}
`, "nft", "-f", "-")
		f := within("shadowing", "NFTablesShadowing nftables/inet/hostfw/pre", false, interval+time.Second)
		if f.Severity != finding.Warning || !strings.Contains(f.Message, "table inet hostfw, chain pre") || !strings.Contains(f.Message, "nat-prerouting") {
			t.Errorf("finding %+v", f)
		}
		run("", "nft", "delete", "table", "inet", "hostfw")
		within("shadowing removed", "NFTablesShadowing nftables/inet/hostfw/pre", true, interval+time.Second)
	})

	t.Run("iptables leftovers", func(t *testing.T) {
		rules := "*nat\n:PREROUTING ACCEPT [0:0]\n:OUTPUT ACCEPT [0:0]\n:KUBE-SERVICES - [0:0]\n:KUBE-SVC-STALE - [0:0]\n" +
			"-A PREROUTING -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES\n" +
			"-A KUBE-SERVICES -d 10.96.0.99/32 -p tcp --dport 80 -j KUBE-SVC-STALE\n" +
			"-A KUBE-SVC-STALE -p tcp -j DNAT --to-destination 10.244.9.9:8080\nCOMMIT\n"
		run(rules, "iptables-legacy-restore", "-w", "5")
		f := within("leftovers", "KubeProxyModeLeftovers iptables/IPv4/legacy/kube-proxy-leftovers", false, interval+time.Second)
		if f.Severity != finding.Critical || !strings.Contains(f.Message, "nftables mode") || !strings.Contains(f.Message, "legacy backend") {
			t.Errorf("finding %+v", f)
		}
		run("*nat\n:PREROUTING ACCEPT [0:0]\n:OUTPUT ACCEPT [0:0]\nCOMMIT\n", "iptables-legacy-restore", "-w", "5")
		within("leftovers removed", "KubeProxyModeLeftovers iptables/IPv4/legacy/kube-proxy-leftovers", true, interval+time.Second)
	})

	t.Run("table deleted", func(t *testing.T) {
		// The real daemon too, inside the namespace, every 2 s: its
		// remediate_findings gauge must show the critical finding within one
		// interval (plus the cycle's own run time) of the deletion.
		dir := t.TempDir()
		self, err := os.Executable()
		if err != nil {
			t.Fatal(err)
		}
		daemonPol := filepath.Join(dir, "daemon.yaml")
		if err := os.WriteFile(daemonPol, []byte(strings.NewReplacer("mode: audit\n", "mode: audit\ninterval: 2s\njitter: 0\n",
			"detectorTimeout: 15s", "detectorTimeout: 2s", "{type: KubeProxyModeLeftovers}", "{type: KubeProxyModeLeftovers, saveTimeout: 1500ms}").Replace(e2eNFTablesPolicy)), 0o644); err != nil {
			t.Fatal(err)
		}
		daemon := exec.Command("ip", "netns", "exec", ns, self, "--policy", daemonPol, "--state-dir", filepath.Join(dir, "daemon-state"),
			"--metrics-addr", "127.0.0.1:19808", "--node-name", kp.NodeName, "--proc-root", "/proc")
		daemon.Env = append(os.Environ(), "REMEDIATE_TEST_AS_MAIN=1")
		daemonLog, err := os.Create(filepath.Join(dir, "daemon.log"))
		if err != nil {
			t.Fatal(err)
		}
		daemon.Stdout, daemon.Stderr = daemonLog, daemonLog
		if err := daemon.Start(); err != nil {
			t.Fatal(err)
		}
		stopDaemon := func() {
			if daemon.ProcessState == nil {
				_ = daemon.Process.Signal(os.Interrupt)
				done := make(chan struct{})
				go func() { _ = daemon.Wait(); close(done) }()
				select {
				case <-done:
				case <-time.After(10 * time.Second):
					_ = daemon.Process.Kill()
					<-done
				}
			}
		}
		t.Cleanup(func() {
			stopDaemon()
			if t.Failed() {
				b, _ := os.ReadFile(daemonLog.Name())
				t.Logf("daemon log:\n%s", b)
			}
		})
		hc := cp.NetNS.HTTPClient(2 * time.Second)
		daemonFinding := func() bool {
			resp, err := hc.Get("http://127.0.0.1:19808/metrics")
			if err != nil {
				return false
			}
			defer resp.Body.Close()
			b, _ := io.ReadAll(resp.Body)
			return strings.Contains(string(b), `remediate_findings{detector="KubeProxyNFTablesIntegrity",rule="nft-integrity",severity="critical"} 1`)
		}
		waitUntil(t, 60*time.Second, "the daemon completed a cycle", func() bool {
			resp, err := hc.Get("http://127.0.0.1:19808/readyz")
			if err != nil {
				return false
			}
			resp.Body.Close()
			return resp.StatusCode == 200
		})
		if daemonFinding() {
			t.Fatal("daemon reports the table missing before it was deleted")
		}

		// As between two daemon cycles: the last listing (shared for at most
		// min(2s, interval/2)) has expired when the next cycle starts.
		time.Sleep(interval)
		run("", "nft", "delete", "table", "ip", "kube-proxy")
		deleted := time.Now()
		f := within("table deleted", "KubeProxyNFTablesIntegrity nftables/ip/kube-proxy", false, interval+time.Second)
		if f.Severity != finding.Critical || !strings.Contains(f.Message, "table ip kube-proxy is missing") {
			t.Errorf("finding %+v", f)
		}
		if d := time.Since(deleted); d > interval {
			t.Errorf("found after %v, want within one interval (%v)", d, interval)
		}
		// kube-proxy does not notice: /healthz stays healthy.
		if h, err := kpc.Healthz(ctx); err != nil || !h.Healthy {
			t.Logf("healthz after the deletion: %+v %v", h, err)
		}

		waitUntil(t, interval+5*time.Second, "the daemon reports the missing table", daemonFinding)
		t.Logf("daemon: remediate_findings{rule=nft-integrity,severity=critical} 1 after %v", time.Since(deleted).Round(time.Millisecond))
		if d := time.Since(deleted); d > interval+3*time.Second {
			t.Errorf("daemon reported it after %v, want within one interval (%v) plus the cycle's run time", d, interval)
		}
		stopDaemon()

		// The same from the binary: remediate --once inside the namespace.
		pol := filepath.Join(dir, "policy.yaml")
		if err := os.WriteFile(pol, []byte(e2eNFTablesPolicy), 0o644); err != nil {
			t.Fatal(err)
		}
		cmd := exec.CommandContext(ctx, "ip", "netns", "exec", ns, self, "--once", "--sample", "0", "-o", "json", "--policy", pol,
			"--state-dir", filepath.Join(dir, "state"), "--node-name", kp.NodeName, "--proc-root", "/proc")
		cmd.Env = append(os.Environ(), "REMEDIATE_TEST_AS_MAIN=1")
		var stderr strings.Builder
		cmd.Stderr = &stderr
		out, err := cmd.Output()
		var ee *exec.ExitError
		if !errors.As(err, &ee) || ee.ExitCode() != 2 {
			t.Fatalf("--once: %v (want exit 2)\n%s\n%s", err, out, stderr.String())
		}
		var rep e2eReport
		if err := json.Unmarshal(out, &rep); err != nil {
			t.Fatalf("--once output: %v\n%s", err, out)
		}
		seen := false
		for _, f := range rep.Findings {
			if f.Detector == "KubeProxyNFTablesIntegrity" && f.Target == "nftables/ip/kube-proxy" {
				seen = true
			}
		}
		if !seen {
			t.Errorf("--once did not report the missing table:\n%s", out)
		}

		// What RestartKubeProxy does: kube-proxy starts again and rebuilds
		// its whole table on its first (full) sync.
		kp.Restart()
		kp.WaitHealthy(60 * time.Second)
		within("after a kube-proxy restart", "KubeProxyNFTablesIntegrity nftables/ip/kube-proxy", true, 30*time.Second)
		found, _ := cycle()
		if len(found) != 0 {
			t.Errorf("after the restart: findings %s", keys(found))
		}
	})
}

func waitUntil(t *testing.T, max time.Duration, what string, ok func() bool) {
	t.Helper()
	deadline := time.Now().Add(max)
	for !ok() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting until %s", max, what)
		}
		time.Sleep(500 * time.Millisecond)
	}
}

// createNFTE2EObjects creates namespace ns with Service web (80/TCP) and two
// ready endpoints.
func createNFTE2EObjects(ctx context.Context, t *testing.T, cp *controlplane.ControlPlane, ns string) {
	t.Helper()
	if _, err := cp.Client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	svc := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: ns},
		Spec: corev1.ServiceSpec{Selector: map[string]string{"app": "web"},
			Ports: []corev1.ServicePort{{Name: "http", Port: 80, Protocol: corev1.ProtocolTCP}}}}
	if _, err := cp.Client.CoreV1().Services(ns).Create(ctx, svc, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	es := &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Name: "web-1", Namespace: ns, Labels: map[string]string{discoveryv1.LabelServiceName: "web"}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       []discoveryv1.EndpointPort{{Name: ptr.To("http"), Port: ptr.To[int32](8080), Protocol: ptr.To(corev1.ProtocolTCP)}},
		Endpoints: []discoveryv1.Endpoint{
			{Addresses: []string{"10.244.0.5"}, Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true)}},
			{Addresses: []string{"10.244.0.6"}, Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true)}},
		},
	}
	if _, err := cp.Client.DiscoveryV1().EndpointSlices(ns).Create(ctx, es, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
}
