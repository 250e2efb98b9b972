package main

import (
	"context"
	"encoding/json"
	"errors"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
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
	"github.com/remediate-dev/remediate/internal/cluster"
	"github.com/remediate-dev/remediate/internal/finding"
	"github.com/remediate-dev/remediate/internal/kube"
	"github.com/remediate-dev/remediate/internal/node"
	"github.com/remediate-dev/remediate/internal/probe"
	"github.com/remediate-dev/remediate/internal/testing/controlplane"
	"github.com/remediate-dev/remediate/policy"
)

// TestE2EServicePathProbe runs ServicePathProbe against the real
// kube-proxy v1.34.4 on the real apiserver, in iptables mode and then in
// nftables mode on one control plane, connecting from inside the test-made
// namespace (the node's network namespace here). The `kubernetes` Service
// (the apiserver, bound to 0.0.0.0 in the namespace so its endpoint
// answers) and a canary Service whose endpoint is a listener of the test.
// Per mode:
//
//   - healthy: no finding, and the real binary's --once (run inside the
//     namespace) exits 0 with the check ok;
//   - a filter rule dropping DNAT'ed traffic (kube-proxy's rules intact):
//     the kubernetes path is critical at the next run, naming the backend,
//     which answers directly; the canary's at the run after; also from
//     the real binary's --once in its one run (exit 2);
//   - the rule removed: the findings clear at the next run;
//   - the canary's backend down (both fail): a backend-problem warning,
//     not the dataplane finding; back up: clears.
func TestE2EServicePathProbe(t *testing.T) {
	parallelE2E(t)
	const testNS = "probe-e2e"
	cp := controlplane.Start(t, controlplane.Options{ExtraAPIServerArgs: []string{"--bind-address", "0.0.0.0"}})
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	kp := cp.StartKubeProxy(controlplane.KubeProxyOptions{})
	if _, err := cp.Client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: testNS}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	backend := netip.AddrPortFrom(netip.MustParseAddr(cp.NetNS.Address), 18080)
	createCanary(ctx, t, cp, testNS, backend)
	canary := startCanaryBackend(t, cp, backend)

	view, err := kube.NewView(cp.Client, nil, clock.RealClock{}, zap.NewNop())
	if err != nil {
		t.Fatal(err)
	}
	view.Start(ctx)
	if !view.WaitForSync(ctx) {
		t.Fatal("view not synced")
	}
	prober := probe.New(probe.Options{Dial: cp.NetNS.DialContext})
	params := func(p any) {
		pp := p.(*detect.ServicePathProbeParams)
		pp.Canaries, pp.Families, pp.MinPeriod = []string{testNS + "/canary"}, []string{"IPv4"}, policy.D(time.Second)
	}
	const apiTarget, canaryTarget = "service-path/IPv4/default/kubernetes:443", "service-path/IPv4/" + testNS + "/canary:80"

	run := func(t *testing.T, d detect.Detector) map[string]finding.Finding {
		t.Helper()
		return runServicePath(ctx, t, d, 15*time.Second)
	}
	// waitPaths waits until both Service paths answer (kube-proxy
	// programmed them), straight through the prober.
	waitPaths := func(t *testing.T) {
		t.Helper()
		waitServicePaths(ctx, t, view, prober, "default/kubernetes", testNS+"/canary")
	}

	once := newOnceRunner(ctx, t, cp, e2eServicePathPolicy).run

	mode := func(t *testing.T, nodeName string, dropOn, dropOff []string, kubeProxyRules func() string) {
		waitPaths(t)
		n := &node.Node{Name: nodeName, Clock: clock.RealClock{}, Log: zap.NewNop(), Cluster: view, Probe: prober}
		d := servicePathDetector(t, n, params)
		t.Run("healthy", func(t *testing.T) {
			for i := 0; i < 3; i++ {
				if fs := run(t, d); len(fs) != 0 {
					t.Fatalf("healthy: %v", fs)
				}
				time.Sleep(time.Second)
			}
			code, rep := once(t, nodeName)
			if code != 0 || len(rep.OK) != 1 || rep.OK[0].Rule != "service-path-probe" || !strings.Contains(rep.OK[0].Judged, "2 of 2 Service paths answer") {
				t.Fatalf("--once healthy: exit %d, %+v", code, rep)
			}
		})
		t.Run("DNAT'ed traffic dropped", func(t *testing.T) {
			before := kubeProxyRules()
			netnsRun(t, cp, dropOn...)
			added := time.Now()
			fs := run(t, d)
			f, ok := fs[apiTarget]
			if !ok || f.Severity != finding.Critical || f.Evidence["verdict"] != "dataplane" {
				t.Fatalf("dropped DNAT'ed traffic: no critical finding at the next run: %v", fs)
			}
			if !strings.Contains(f.Message, cp.NetNS.Address+":6443 connected") || !strings.Contains(f.Message, "10.96.0.1:443") {
				t.Fatalf("the finding does not name the ClusterIP and the answering backend: %s", f.Message)
			}
			t.Logf("reported %v after the rule was added: %s", time.Since(added).Round(time.Millisecond), f.Message)
			// The canary is judged at the next run (the connect budget
			// of 4 went to the kubernetes path first).
			time.Sleep(time.Second)
			fs = run(t, d)
			if f, ok := fs[canaryTarget]; !ok || f.Severity != finding.Critical || !strings.Contains(f.Message, backend.String()+" connected") {
				t.Fatalf("canary not reported at the second run: %v", fs)
			}
			if _, ok := fs[apiTarget]; !ok {
				t.Fatalf("kubernetes finding gone while the rule is there: %v", fs)
			}
			// The real binary's --once judges in its one run.
			code, rep := once(t, nodeName)
			found := false
			for _, f := range rep.Findings {
				found = found || (f.Rule == "service-path-probe" && f.Target == apiTarget && f.Severity == "critical")
			}
			if code != 2 || !found {
				t.Fatalf("--once: exit %d, %+v", code, rep)
			}
			// The backend still answers directly, and kube-proxy's rules
			// are what they were.
			if r := prober.Connect(ctx, netip.AddrPortFrom(netip.MustParseAddr(cp.NetNS.Address), 6443), 2*time.Second); !r.OK() {
				t.Fatalf("the apiserver does not answer directly: %s", r)
			}
			if after := kubeProxyRules(); after != before {
				t.Fatalf("kube-proxy's rules changed:\nbefore:\n%s\nafter:\n%s", before, after)
			}
		})
		t.Run("rule removed", func(t *testing.T) {
			ruleRemovedClears(t, cp, dropOff, func() map[string]finding.Finding { return run(t, d) })
		})
		t.Run("backend down", func(t *testing.T) {
			canary.stop()
			defer canary.start(t)
			time.Sleep(time.Second)
			fs := run(t, d)
			f, ok := fs[canaryTarget]
			if !ok || f.Severity != finding.Warning || f.Evidence["verdict"] != "backend" || !strings.Contains(f.Message, "a backend problem, not the Service dataplane") {
				t.Fatalf("backend down: %v", fs)
			}
			if _, ok := fs[apiTarget]; ok || len(fs) != 1 {
				t.Fatalf("backend down: other findings %v", fs)
			}
			t.Logf("backend down: %s", f.Message)
			canary.start(t)
			time.Sleep(time.Second)
			if fs := run(t, d); len(fs) != 0 {
				t.Fatalf("backend back: still %v", fs)
			}
		})
	}

	t.Run("iptables", func(t *testing.T) {
		rule := []string{"OUTPUT", "-m", "conntrack", "--ctstate", "DNAT", "-j", "DROP"}
		mode(t, kp.NodeName,
			append([]string{"iptables-legacy", "-I"}, rule...),
			append([]string{"iptables-legacy", "-D"}, rule...),
			func() string {
				// Without packet counters and dates.
				return saveCounters.ReplaceAllString(netnsRun(t, cp, "iptables-legacy-save", "-t", "nat"), "")
			})
	})

	t.Run("nftables", func(t *testing.T) {
		// Without nft, StartKubeProxy skips (fails under
		// REMEDIATE_E2E_REQUIRED).
		kp2 := kubeProxyToNFTables(t, cp, kp, controlplane.KubeProxyOptions{NodeName: "node2"}, "iptables-legacy")
		mode(t, kp2.NodeName,
			[]string{"nft", "add table inet rmdprobe; add chain inet rmdprobe out { type filter hook output priority 0; }; add rule inet rmdprobe out ct status dnat drop"},
			[]string{"nft", "delete table inet rmdprobe"},
			func() string { return netnsRun(t, cp, "nft", "list", "table", "ip", "kube-proxy") })
	})
}

const e2eServicePathPolicy = `apiVersion: remediate.dev/v1alpha1
kind: RemediationPolicy
mode: audit
detectorTimeout: 15s
rules:
- name: service-path-probe
  detector: {type: ServicePathProbe, canaries: [probe-e2e/canary], families: [IPv4]}
`

// onceRunner runs the real binary's --once inside the control plane's
// namespace (the daemon's dialer, in the node's namespace, is then the
// namespace's), with the cluster through the admin kubeconfig and a
// policy, each run with a fresh state dir.
type onceRunner struct {
	ctx         context.Context
	cp          *controlplane.ControlPlane
	self        string
	dir, policy string
	runs        int
}

func newOnceRunner(ctx context.Context, t *testing.T, cp *controlplane.ControlPlane, policy string) *onceRunner {
	t.Helper()
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	o := &onceRunner{ctx: ctx, cp: cp, self: self, dir: t.TempDir()}
	o.policy = filepath.Join(o.dir, "policy.yaml")
	if err := os.WriteFile(o.policy, []byte(policy), 0o644); err != nil {
		t.Fatal(err)
	}
	return o
}

// run runs --once -o json as node nodeName and returns its exit code and
// report.
func (o *onceRunner) run(t *testing.T, nodeName string) (int, servicePathReport) {
	t.Helper()
	o.runs++
	var rep servicePathReport
	code := onceInNetNS(o.ctx, t, o.cp, o.self, &rep, "--policy", o.policy, "--kubeconfig", o.cp.AdminKubeconfig,
		"--state-dir", filepath.Join(o.dir, "state", strconv.Itoa(o.runs)), "--node-name", nodeName, "--proc-root", "/proc")
	return code, rep
}

// servicePathReport is the part of the --once JSON report the test reads.
type servicePathReport struct {
	Findings []struct {
		Rule     string `json:"rule"`
		Target   string `json:"target"`
		Severity string `json:"severity"`
		Message  string `json:"message"`
	} `json:"findings"`
	Skipped []struct {
		Rule   string `json:"rule"`
		Reason string `json:"reason"`
	} `json:"skipped"`
	OK []struct {
		Rule   string `json:"rule"`
		Judged string `json:"judged"`
	} `json:"ok"`
}

// runServicePath runs d once within timeout and returns its findings by
// target, logging how long it took and its judged line.
func runServicePath(ctx context.Context, t *testing.T, d detect.Detector, timeout time.Duration) map[string]finding.Finding {
	t.Helper()
	dctx, dcancel := context.WithTimeout(ctx, timeout)
	defer dcancel()
	start := time.Now()
	fs, err := d.Detect(dctx)
	if err != nil {
		t.Fatalf("Detect: %v", err)
	}
	out := map[string]finding.Finding{}
	for _, f := range fs {
		out[f.Target] = f
	}
	t.Logf("run took %v: %d findings, judged %q", time.Since(start).Round(time.Millisecond), len(fs), d.(detect.Judged).Judged())
	return out
}

// waitServicePaths waits (at most 30 s) until each "namespace/name"
// Service's first ClusterIP and port answer through the prober, that is
// until kube-proxy has programmed them.
func waitServicePaths(ctx context.Context, t *testing.T, view cluster.View, prober probe.Interface, services ...string) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for _, s := range services {
		ns, name, _ := strings.Cut(s, "/")
		var vip netip.AddrPort
		for _, svc := range view.Services() {
			if svc.Namespace == ns && svc.Name == name && len(svc.ClusterIPs) > 0 && len(svc.Ports) > 0 {
				vip = netip.AddrPortFrom(netip.MustParseAddr(svc.ClusterIPs[0]), uint16(svc.Ports[0].Port))
			}
		}
		if !vip.IsValid() {
			t.Fatalf("%s: not in the cluster view", s)
		}
		for {
			r := prober.Connect(ctx, vip, time.Second)
			if r.OK() {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s %s never answered: %s", s, vip, r)
			}
			time.Sleep(300 * time.Millisecond)
		}
	}
}

// kubeProxyToNFTables stops kp (iptables mode), flushes and deletes the
// chains it left in the nat and filter tables of each iptables command
// (they would still DNAT, so the paths would answer without the new
// kube-proxy), and starts kube-proxy in nftables mode with opts. Without
// nft, StartKubeProxy skips (fails under REMEDIATE_E2E_REQUIRED).
func kubeProxyToNFTables(t *testing.T, cp *controlplane.ControlPlane, kp *controlplane.KubeProxy, opts controlplane.KubeProxyOptions, iptablesCmds ...string) *controlplane.KubeProxy {
	t.Helper()
	kp.Stop(t)
	for _, cmd := range iptablesCmds {
		for _, table := range []string{"nat", "filter"} {
			netnsRun(t, cp, cmd, "-t", table, "-F")
			netnsRun(t, cp, cmd, "-t", table, "-X")
		}
	}
	opts.Mode = "nftables"
	return cp.StartKubeProxy(opts)
}

// ruleRemovedClears runs dropOff in the namespace and checks that the
// next run (a second later) has no finding.
func ruleRemovedClears(t *testing.T, cp *controlplane.ControlPlane, dropOff []string, run func() map[string]finding.Finding) {
	t.Helper()
	netnsRun(t, cp, dropOff...)
	time.Sleep(time.Second)
	if fs := run(); len(fs) != 0 {
		t.Fatalf("rule removed: still %v", fs)
	}
}

// servicePathDetector builds a ServicePathProbe as the engine does.
func servicePathDetector(t *testing.T, n *node.Node, tweak func(any)) detect.Detector {
	t.Helper()
	typ, ok := detect.Lookup(detect.ServicePathProbeName)
	if !ok {
		t.Fatal("ServicePathProbe not registered")
	}
	p := typ.NewParams()
	tweak(p)
	if v, ok := p.(policy.Validator); ok && len(v.Validate()) > 0 {
		t.Fatalf("params invalid: %v", v.Validate())
	}
	d, err := typ.New(p, n)
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// saveCounters matches what changes between two iptables-save of the same
// rules: the chains' packet counters and the "# Generated ..." lines.
var saveCounters = regexp.MustCompile(`\[\d+:\d+\]|(?m)^#.*$`)

// netnsRun runs a command in the control plane's namespace and returns its
// output, failing the test on error.
func netnsRun(t *testing.T, cp *controlplane.ControlPlane, args ...string) string {
	t.Helper()
	cmd := cp.NetNS.Command(args[0], args[1:]...)
	// iptables-legacy's lock file is the control plane's, not the host's
	// /run/xtables.lock: the rules are the namespace's, and the tests
	// running beside this one (parallelE2E) take the host's lock.
	cmd.Env = append(os.Environ(), "XTABLES_LOCKFILE="+filepath.Join(cp.Dir, "xtables.lock"))
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%s: %v: %s", strings.Join(args, " "), err, out)
	}
	return string(out)
}

// onceInNetNS runs bin (this test binary as main) with `--once -o json`
// and args inside the control plane's namespace, where the apiserver
// answers on the loopback, decodes its report into rep and returns its
// exit code.
func onceInNetNS(ctx context.Context, t *testing.T, cp *controlplane.ControlPlane, bin string, rep any, args ...string) int {
	t.Helper()
	return onceInNetNSEnv(ctx, t, cp, bin, rep, nil, args...)
}

// onceInNetNSEnv is onceInNetNS with env (NAME=value) added to the
// binary's environment: a parallel test cannot t.Setenv.
func onceInNetNSEnv(ctx context.Context, t *testing.T, cp *controlplane.ControlPlane, bin string, rep any, env []string, args ...string) int {
	t.Helper()
	cmd := exec.CommandContext(ctx, "ip", append([]string{"netns", "exec", cp.NetNS.Name, bin, "--once", "-o", "json"}, args...)...)
	cmd.Env = append(append(os.Environ(), "REMEDIATE_TEST_AS_MAIN=1"), env...)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	start := time.Now()
	out, err := cmd.Output()
	code := 0
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatalf("--once: %v\n%s", err, stderr.String())
	}
	if err := json.Unmarshal(out, rep); err != nil {
		t.Fatalf("--once output (exit %d): %v\n%s\n%s", code, err, out, stderr.String())
	}
	t.Logf("--once took %v, exit %d", time.Since(start).Round(time.Millisecond), code)
	return code
}

// createCanary creates Service "canary" (TCP 80) whose one ready endpoint
// is backend (no controller-manager runs: the EndpointSlice is written by
// hand, of backend's address family; the Service takes the cluster's).
func createCanary(ctx context.Context, t *testing.T, cp *controlplane.ControlPlane, ns string, backend netip.AddrPort) {
	t.Helper()
	addrType := discoveryv1.AddressTypeIPv4
	if backend.Addr().Is6() {
		addrType = discoveryv1.AddressTypeIPv6
	}
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "canary", Namespace: ns},
		Spec:       corev1.ServiceSpec{Ports: []corev1.ServicePort{{Name: "http", Port: 80, Protocol: corev1.ProtocolTCP}}},
	}
	if _, err := cp.Client.CoreV1().Services(ns).Create(ctx, svc, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	es := &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Name: "canary-1", Namespace: ns, Labels: map[string]string{discoveryv1.LabelServiceName: "canary"}},
		AddressType: addrType,
		Ports:       []discoveryv1.EndpointPort{{Name: ptr.To("http"), Port: ptr.To(int32(backend.Port())), Protocol: ptr.To(corev1.ProtocolTCP)}},
		Endpoints: []discoveryv1.Endpoint{{Addresses: []string{backend.Addr().String()},
			Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true)}}},
	}
	if _, err := cp.Client.DiscoveryV1().EndpointSlices(ns).Create(ctx, es, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
}

// canaryBackend is a TCP listener inside the namespace that accepts and
// closes; stop closes it (connects are then refused), start reopens it.
type canaryBackend struct {
	cp   *controlplane.ControlPlane
	addr netip.AddrPort
	l    net.Listener
}

func startCanaryBackend(t *testing.T, cp *controlplane.ControlPlane, addr netip.AddrPort) *canaryBackend {
	c := &canaryBackend{cp: cp, addr: addr}
	c.start(t)
	t.Cleanup(c.stop)
	return c
}

func (c *canaryBackend) start(t *testing.T) {
	t.Helper()
	if c.l != nil {
		return
	}
	l, err := c.cp.NetNS.Listen("tcp", c.addr.String())
	if err != nil {
		t.Fatal(err)
	}
	c.l = l
	go func() {
		for {
			conn, err := l.Accept()
			if err != nil {
				return
			}
			conn.Close()
		}
	}()
}

func (c *canaryBackend) stop() {
	if c.l != nil {
		c.l.Close()
		c.l = nil
	}
}
