package realnode_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/remediate-dev/remediate/deploy"
	"github.com/remediate-dev/remediate/internal/testing/realnode"
)

// The real-node lane (make test-node) sets REMEDIATE_NODE_LANE=1 and says
// where the pieces are; every other `go test` skips these tests (one node
// is ~1 min to bring up and needs the lane's images):
//
//	REMEDIATE_NODE_LANE=1 REMEDIATE_CONTROLPLANE_BIN=_output/bin \
//	REMEDIATE_NODE_ROOTFS=$(tools/image/rootfs.sh) REMEDIATE_NODE_IMAGE=bin/remediate-image-linux-amd64.tar \
//	REMEDIATE_MKIMAGE=_output/bin/mkimage REMEDIATE_HELM=_output/bin/helm go test -v ./internal/testing/realnode/
var (
	node      *realnode.Node
	nodeErr   string
	repo      string
	pluginBin string
)

func TestMain(m *testing.M) {
	os.Exit(laneMain(m))
}

func laneMain(m *testing.M) int {
	if os.Getenv("REMEDIATE_NODE_LANE") != "1" {
		nodeErr = "the real-node lane runs with make test-node (REMEDIATE_NODE_LANE=1)"
		return m.Run()
	}
	wd, _ := os.Getwd()
	repo = filepath.Join(wd, "..", "..", "..")
	abs := func(env string) string {
		p := os.Getenv(env)
		if p != "" && !filepath.IsAbs(p) {
			p = filepath.Join(repo, p)
		}
		return p
	}
	cfg := realnode.Config{
		BinDir: abs("REMEDIATE_CONTROLPLANE_BIN"), MkImage: abs("REMEDIATE_MKIMAGE"), Rootfs: abs("REMEDIATE_NODE_ROOTFS"),
		Dir:  fmt.Sprintf("/tmp/remediate-realnode-%d", os.Getpid()),
		Logf: func(f string, a ...any) { fmt.Fprintf(os.Stderr, f+"\n", a...) },
	}
	if img := abs("REMEDIATE_NODE_IMAGE"); img != "" {
		cfg.Images = append(cfg.Images, img)
	}
	pluginBin = filepath.Join(os.TempDir(), fmt.Sprintf("kubectl-remediate-%d", os.Getpid()))
	defer os.Remove(pluginBin)
	build := exec.Command("go", "build", "-o", pluginBin, "./cmd/kubectl-remediate")
	build.Dir = repo
	if out, err := build.CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "build kubectl-remediate: %v: %s\n", err, out)
		return 1
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	n, err := realnode.Start(ctx, cfg)
	cancel()
	if err != nil {
		fmt.Fprintf(os.Stderr, "real node: %v\n", err)
		return 1
	}
	node = n
	code := m.Run()
	t0 := time.Now()
	if err := n.Stop(); err != nil {
		fmt.Fprintf(os.Stderr, "real node teardown: %v\n", err)
		code = 1
	}
	if left := n.Leftovers(); len(left) > 0 {
		fmt.Fprintf(os.Stderr, "real node left behind: %s\n", strings.Join(left, "; "))
		code = 1
	}
	fmt.Fprintf(os.Stderr, "realnode: torn down in %.0fs\n", time.Since(t0).Seconds())
	return code
}

func needNode(t *testing.T) *realnode.Node {
	t.Helper()
	if node == nil {
		t.Skip(nodeErr)
	}
	return node
}

// run runs a program inside the node's namespace with the admin kubeconfig.
func run(t *testing.T, n *realnode.Node, timeout time.Duration, name string, args ...string) (string, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	cmd := n.Command(ctx, name, args...)
	cmd.Env = append(os.Environ(), "KUBECONFIG="+n.AdminKubeconfig, "HOME="+t.TempDir())
	out, err := cmd.CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("%s %s: %w: %s", name, strings.Join(args, " "), err, out)
	}
	return string(out), nil
}

func helm(t *testing.T, n *realnode.Node, args ...string) string {
	t.Helper()
	bin, err := deploy.HelmBin()
	if err != nil {
		t.Fatal(err)
	}
	out, err := run(t, n, 5*time.Minute, bin, args...)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// chartValues are the node's host paths: Debian's plugins are copied to the
// node's folder (a scenario may break them), the conf dir is containerd's,
// the xtables lock and the state dir are the node's own.
func chartValues(n *realnode.Node) []string {
	return []string{"--set", "host.cniConfDir=" + n.CNIConfDir, "--set", "host.cniBinDir=" + n.CNIBinDir, "--set", "host.cniIPAMDir=" + n.CNIIPAMDir,
		"--set", "host.xtablesLock=" + n.XtablesLock, "--set", "host.stateDir=" + n.StateDir}
}

const releaseNS = "remediate"

func waitRemediateReady(t *testing.T, n *realnode.Node) {
	t.Helper()
	if err := n.Poll(context.Background(), "remediate pod Ready", 4*time.Minute, func(ctx context.Context) (bool, string) {
		return n.PodsReady(ctx, releaseNS, "app.kubernetes.io/name=remediate")
	}); err != nil {
		t.Fatalf("%v\nkubelet log:\n%s", err, realnode.Tail(n.Log("kubelet"), 20))
	}
}

// report is the --once -o json report (README: stable keys).
type report struct {
	Findings []struct{ Rule, Detector, Severity, Message string } `json:"findings"`
	Skipped  []struct{ Rule, Detector, Reason string }            `json:"skipped"`
	OK       []struct{ Rule, Detector, Judged string }            `json:"ok"`
}

// TestNodeChartAudit is scenario (a): the chart with its defaults (audit)
// under a real kubelet: the pod Ready; its one-shot report (through the
// kubectl plugin, scenario (b)) accounts for every rule of the policy, no
// critical finding on this healthy node, and no check skipped for a reason
// a correct pod spec would lift (permission denied, operation not
// permitted: a capability, mount or securityContext the chart lacks);
// metrics scraped; the Node condition set; the evidence bundle fetched;
// `helm uninstall` leaves no condition, Lease or cluster-scoped object.
func TestNodeChartAudit(t *testing.T) {
	n := needNode(t)
	ctx := context.Background()
	helm(t, n, append([]string{"install", "remediate", deploy.ChartDir(), "-n", releaseNS, "--create-namespace"}, chartValues(n)...)...)
	uninstalled := false
	t.Cleanup(func() {
		if !uninstalled {
			bin, _ := deploy.HelmBin()
			_, _ = run(t, n, 3*time.Minute, bin, "uninstall", "remediate", "-n", releaseNS, "--wait")
		}
	})
	waitRemediateReady(t, n)

	// Scenario (b): the kubectl plugin runs --once in the pod.
	out, err := run(t, n, 3*time.Minute, pluginBin, realnode.NodeName, "-o", "json")
	if err != nil && !strings.Contains(err.Error(), "exit status 2") {
		t.Fatalf("kubectl remediate: %v", err)
	}
	var r report
	// The plugin's output: its own line, the pod's log lines (a JSON field
	// may be on them), then the report, which starts on a line of its own.
	start := strings.Index(out, "\n{\n")
	if start < 0 {
		t.Fatalf("no report in the plugin's output:\n%s", out)
	}
	if err := json.Unmarshal([]byte(out[start+1:]), &r); err != nil {
		t.Fatalf("report: %v\n%s", err, out)
	}
	cm, err := n.Client.CoreV1().ConfigMaps(releaseNS).List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	rules := policyRules(t, cm.Items)
	seen := map[string]int{}
	for _, f := range r.Findings {
		seen[f.Rule]++
		t.Logf("finding %s/%s %s: %s", f.Rule, f.Detector, f.Severity, f.Message)
		if f.Severity == "critical" {
			t.Errorf("critical finding on a healthy node: %s: %s", f.Rule, f.Message)
		}
	}
	skips := map[string]int{}
	for _, s := range r.Skipped {
		seen[s.Rule]++
		t.Logf("skipped %s/%s: %s", s.Rule, s.Detector, s.Reason)
		for _, bad := range []string{"permission denied", "operation not permitted", "read-only file system"} {
			if strings.Contains(strings.ToLower(s.Reason), bad) {
				t.Errorf("%s skipped for a reason the pod spec should lift: %s", s.Rule, s.Reason)
			}
		}
		why := acceptedSkip(s.Reason)
		if why == "" {
			t.Errorf("%s skipped for a reason not known to be this node's rather than the pod spec's: %s", s.Rule, s.Reason)
		}
		skips[why]++
	}
	t.Logf("skips by cause: %v", skips)
	for _, o := range r.OK {
		seen[o.Rule]++
	}
	for _, rule := range rules {
		if seen[rule] == 0 {
			t.Errorf("rule %s is not in the report (findings, ok or skipped)", rule)
		}
	}
	t.Logf("report: %d rules, %d ok, %d skipped, %d findings", len(rules), len(r.OK), len(r.Skipped), len(r.Findings))

	// The plugin fetches the evidence bundle.
	bundle := filepath.Join(t.TempDir(), "rn1.tar.gz")
	if out, err := run(t, n, 3*time.Minute, pluginBin, realnode.NodeName, "--bundle", bundle); err != nil && !strings.Contains(err.Error(), "exit status 2") {
		t.Fatalf("kubectl remediate --bundle: %v\n%s", err, out)
	}
	if st, err := os.Stat(bundle); err != nil || st.Size() == 0 {
		t.Errorf("bundle not fetched: %v", err)
	}

	// Metrics, from the node's namespace (the pod is hostNetwork).
	var metrics string
	if err := n.Poll(ctx, "metrics", time.Minute, func(ctx context.Context) (bool, string) {
		metrics, err = n.HTTPGet(ctx, "http://127.0.0.1:9808/metrics")
		return err == nil && strings.Contains(metrics, "remediate_last_cycle_timestamp_seconds "), fmt.Sprint(err)
	}); err != nil {
		t.Error(err)
	}

	// The Node condition.
	if err := n.Poll(ctx, "Node condition KubeProxyDataplaneHealthy=True", 2*time.Minute, func(ctx context.Context) (bool, string) {
		c := nodeCondition(ctx, n)
		return c != nil && c.Status == corev1.ConditionTrue, fmt.Sprintf("%+v", c)
	}); err != nil {
		t.Error(err)
	}

	// The fleet subcommands (docs/FLEET.md) on the real node: once
	// --all-nodes through the real pods/exec, one merged report; fleet
	// from what the running daemon wrote.
	var merged struct {
		Exit  int
		Nodes []struct {
			Node, Error string
			Exit        int
			Report      *report
		}
	}
	if pluginJSON(t, n, []int{0, 2}, &merged, "once", "--all-nodes", "-n", releaseNS, "-o", "json") {
		if len(merged.Nodes) != 1 || merged.Nodes[0].Node != realnode.NodeName || merged.Nodes[0].Report == nil || merged.Nodes[0].Exit != merged.Exit {
			t.Errorf("once --all-nodes: %+v", merged)
		}
	}
	var fleet struct {
		Nodes []struct {
			Name, Status             string
			Heartbeat, DaemonRenewed *time.Time
		}
	}
	if pluginJSON(t, n, []int{0}, &fleet, "fleet", "-n", releaseNS, "-o", "json") {
		if len(fleet.Nodes) != 1 || fleet.Nodes[0].Name != realnode.NodeName || fleet.Nodes[0].Status != "True" || fleet.Nodes[0].Heartbeat == nil || fleet.Nodes[0].DaemonRenewed == nil {
			t.Errorf("fleet: %+v", fleet)
		}
	}

	helm(t, n, "uninstall", "remediate", "-n", releaseNS, "--wait", "--timeout", "3m")
	uninstalled = true
	if c := nodeCondition(ctx, n); c != nil {
		t.Errorf("helm uninstall left the Node condition: %+v", c)
	}
	leases, err := n.Client.CoordinationV1().Leases(releaseNS).List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range leases.Items {
		t.Errorf("helm uninstall left Lease %s/%s", l.Namespace, l.Name)
	}
	crs, err := n.Client.RbacV1().ClusterRoles().List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/name=remediate"})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range crs.Items {
		t.Errorf("helm uninstall left ClusterRole %s", c.Name)
	}
	ds, err := n.Client.AppsV1().DaemonSets(releaseNS).List(ctx, metav1.ListOptions{})
	if err == nil && len(ds.Items) > 0 {
		t.Errorf("helm uninstall left DaemonSet %s", ds.Items[0].Name)
	}
}

// pluginJSON runs the plugin with args, wants one of the exit statuses
// and decodes its stdout into v; false (and the test failed) otherwise.
func pluginJSON(t *testing.T, n *realnode.Node, exits []int, v any, args ...string) bool {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cmd := n.Command(ctx, pluginBin, args...)
	cmd.Env = append(os.Environ(), "KUBECONFIG="+n.AdminKubeconfig, "HOME="+t.TempDir())
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	code := 0
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatalf("kubectl remediate %v: %v", args, err)
	}
	if !slices.Contains(exits, code) {
		t.Errorf("kubectl remediate %v: exit %d, want %v\n%s\n%s", args, code, exits, out, stderr.String())
		return false
	}
	if err := json.Unmarshal(out, v); err != nil {
		t.Errorf("kubectl remediate %v: %v\n%s\n%s", args, err, out, stderr.String())
		return false
	}
	return true
}

// acceptedSkip names why a skip on the lane's healthy node is not the
// pod spec's to lift, or "" when it is not one of these (a defect of the
// chart until shown otherwise):
//   - CAP_SYS_PTRACE: off by default by decision (values sysPtrace), and
//     needed only to read other processes' root filesystems (the process
//     checks run without it: issue 41);
//   - IPVS: this machine's kernel has no ip_vs (the host's own
//     /proc/net/ip_vs is absent too, checked here);
//   - nftables-only rules: the lane's kube-proxy runs in iptables mode;
//   - no CNI agent: the lane's node has the bridge plugin and no agent
//     (TestNodeEnforce/c-cni-agent-oom runs one).
func acceptedSkip(reason string) string {
	switch {
	case strings.HasPrefix(reason, "needs CAP_SYS_PTRACE to read the host's and kube-proxy's files"):
		// Only the reads of other processes' root filesystems
		// (IPTablesVersionSkew); the process checks run without it.
		return "CAP_SYS_PTRACE off by default"
	case strings.HasPrefix(reason, "IPVS unavailable: /host/proc/net/ip_vs: no such file or directory"):
		if _, err := os.Stat("/proc/net/ip_vs"); os.IsNotExist(err) {
			return "no ip_vs in this kernel"
		}
	case strings.Contains(reason, "kube-proxy runs in iptables mode") && strings.Contains(reason, "applies to nftables mode only"):
		return "nftables mode only"
	case strings.HasPrefix(reason, "no pod of a configured CNI agent"), strings.HasPrefix(reason, "no process of a known CNI agent runs in this node's network namespace"):
		return "no CNI agent on the node"
	case strings.HasPrefix(reason, "cannot read the kubelet's /metrics") && strings.Contains(reason, ": tls: "):
		// The lane's kubelet serves a self-signed certificate (as most
		// do) and the chart verifies by default (kubelet.insecureTLS).
		return "kubelet certificate self-signed, verified by default"
	}
	return ""
}

func nodeCondition(ctx context.Context, n *realnode.Node) *corev1.NodeCondition {
	node, err := n.Client.CoreV1().Nodes().Get(ctx, realnode.NodeName, metav1.GetOptions{})
	if err != nil {
		return nil
	}
	for _, c := range node.Status.Conditions {
		if c.Type == "KubeProxyDataplaneHealthy" {
			return &c
		}
	}
	return nil
}

// policyRules are the rule names of the chart's policy ConfigMap.
func policyRules(t *testing.T, cms []corev1.ConfigMap) []string {
	t.Helper()
	var rules []string
	for _, cm := range cms {
		for _, v := range cm.Data {
			for _, line := range strings.Split(v, "\n") {
				if s, ok := strings.CutPrefix(line, "- name:"); ok {
					rules = append(rules, strings.Trim(strings.TrimSpace(s), `"`))
				}
			}
		}
	}
	if len(rules) == 0 {
		t.Fatal("no rules found in the chart's policy ConfigMap")
	}
	return rules
}
