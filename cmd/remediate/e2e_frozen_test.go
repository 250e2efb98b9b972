package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/remediate-dev/remediate/internal/testing/controlplane"
	"github.com/remediate-dev/remediate/internal/testing/deploytest"
	"github.com/remediate-dev/remediate/internal/testing/fakekubelet"
	"github.com/remediate-dev/remediate/internal/testing/podcgroup"
	"github.com/remediate-dev/remediate/remediate/journal"
)

// procState is the one-letter state of pid from /proc/<pid>/stat.
func procState(t *testing.T, pid int) string {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		t.Fatal(err)
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 || i+2 >= len(s) {
		t.Fatalf("stat of %d: %q", pid, s)
	}
	return s[i+2 : i+3]
}

// freezeKubeProxy SIGSTOPs kube-proxy by PID (as a deadlock or a process
// stuck in the kernel leaves it: its listening sockets accept, nothing
// answers) and continues it at cleanup so it can be stopped.
func freezeKubeProxy(t *testing.T, kp *controlplane.KubeProxy) {
	t.Helper()
	t.Cleanup(func() { _ = kp.Signal(syscall.SIGCONT) })
	if err := kp.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, 10*time.Second, "kube-proxy stopped (state T)", func() bool { return procState(t, kp.Pid()) == "T" })
}

// createLateService creates Service late (80/TCP) with one ready endpoint
// in ns and returns when it was created.
func createLateService(ctx context.Context, t *testing.T, cp *controlplane.ControlPlane, ns string) time.Time {
	t.Helper()
	if _, err := cp.Client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	svc := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "late", Namespace: ns},
		Spec: corev1.ServiceSpec{Ports: []corev1.ServicePort{{Name: "http", Port: 80, Protocol: corev1.ProtocolTCP}}}}
	created := time.Now()
	if _, err := cp.Client.CoreV1().Services(ns).Create(ctx, svc, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	es := &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Name: "late-1", Namespace: ns, Labels: map[string]string{discoveryv1.LabelServiceName: "late"}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       []discoveryv1.EndpointPort{{Name: ptr.To("http"), Port: ptr.To[int32](8080), Protocol: ptr.To(corev1.ProtocolTCP)}},
		Endpoints:   []discoveryv1.Endpoint{{Addresses: []string{"10.244.0.9"}, Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true)}}},
	}
	if _, err := cp.Client.DiscoveryV1().EndpointSlices(ns).Create(ctx, es, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	return created
}

// TestE2EFrozenKubeProxyDriftOnce freezes the real kube-proxy v1.34.4
// (SIGSTOP by PID) in iptables mode and, beside it on a control plane of
// its own, in nftables mode, creates a Service, and runs `remediate
// --once` with the shipped
// examples/audit.yaml (proxyMode auto, syncPeriod 30s, so a grace of 90 s)
// every interval (30 s, the example's): the same report carries
// KubeProxyUnreachable and DataplaneDrift naming the Service, within grace
// + 2 intervals of its creation, its evidence naming the node's marks the
// mode was read from. On main DataplaneDrift skipped ("cannot read
// kube-proxy proxy mode").
func TestE2EFrozenKubeProxyDriftOnce(t *testing.T) {
	parallelE2E(t)
	const (
		grace    = 90 * time.Second // 3 x the example's syncPeriod (30s): /configz does not answer
		interval = 30 * time.Second // the example's
	)
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	policy, err := filepath.Abs("../../examples/audit.yaml")
	if err != nil {
		t.Fatal(err)
	}
	for _, mode := range []string{"iptables", "nftables"} {
		t.Run(mode, func(t *testing.T) {
			// Each mode waits out the grace on a control plane of its
			// own, beside the other (parallelE2E).
			parallelE2E(t)
			cp := controlplane.Start(t, controlplane.Options{})
			ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
			defer cancel()
			kp := cp.StartKubeProxy(controlplane.KubeProxyOptions{NodeName: "node-" + mode, Mode: mode, SyncPeriod: 10 * time.Second})
			t.Cleanup(func() { _ = kp.Signal(syscall.SIGCONT) }) // stopped by PID after
			freezeKubeProxy(t, kp)
			ns := "frozen-" + mode
			created := createLateService(ctx, t, cp, ns)
			target := "dataplane/IPv4/" + ns + "/late:http"
			dir := t.TempDir()
			for run := 0; ; run++ {
				var rep e2eReport
				start := time.Now()
				code := onceInNetNS(ctx, t, cp, self, &rep, "--sample", "0", "--policy", policy, "--kubeconfig", cp.AdminKubeconfig,
					"--state-dir", filepath.Join(dir, "state"), "--node-name", kp.NodeName, "--proc-root", "/proc")
				var unreachable, drift bool
				for _, f := range rep.Findings {
					if f.Detector == "KubeProxyUnreachable" && f.Target == "kube-proxy/metrics" {
						unreachable = true
					}
					if f.Detector == "DataplaneDrift" && f.Target == target {
						drift = true
						src, _ := f.Evidence["proxyModeSource"].(string)
						if f.Evidence["proxyMode"] != mode || !strings.HasPrefix(src, "node: ") || !strings.Contains(f.Message, "kube-proxy does not answer") ||
							!strings.Contains(f.Message, "10.244.0.9:8080") {
							t.Errorf("drift finding %+v", f)
						}
						t.Logf("run %d (%v, exit %d): %s %s: %s (mode from %s)", run, time.Since(start).Round(time.Second), code, f.Detector, f.Target, f.Message, src)
					}
				}
				if !unreachable {
					t.Fatalf("run %d: no KubeProxyUnreachable finding for the stopped kube-proxy: %+v", run, rep.Findings)
				}
				if drift {
					if code != 2 {
						t.Errorf("exit %d, want 2 (findings)", code)
					}
					age := time.Since(created)
					t.Logf("%s mode: named %v after the Service's creation (grace %v, interval %v)", mode, age.Round(time.Second), grace, interval)
					if age > grace+2*interval {
						t.Errorf("named after %v, want within grace + 2 intervals (%v)", age, grace+2*interval)
					}
					break
				}
				if time.Since(created) > grace+2*interval {
					t.Fatalf("not named %v after the Service's creation: %+v", time.Since(created).Round(time.Second), rep.Findings)
				}
				if d := interval - time.Since(start); d > 0 {
					time.Sleep(d)
				}
			}
			if st := procState(t, kp.Pid()); st != "T" {
				t.Errorf("kube-proxy state %s after the runs, want T (nothing may touch it in audit)", st)
			}
		})
	}
}

// e2eFrozenPolicy is the enforce example's restart-frozen-kube-proxy rule
// with CI-sized windows (minSilence 40s instead of 2m, so that the drift's
// grace of 3 x 10 s has passed when it is first reported; for 5s instead of
// 1m; a 5 s interval) and DataplaneDrift beside it.
const e2eFrozenPolicy = `apiVersion: remediate.dev/v1alpha1
kind: RemediationPolicy
mode: %MODE%
interval: 5s
jitter: 0
detectorTimeout: 5s
kubeProxy: {syncPeriod: 10s, scrapeTimeout: 1s}
cluster: {budgetSlots: 1, budgetTTL: 10m, stormMaxShare: 0.3, stormMinNodes: 3}
rules:
- name: restart-frozen-kube-proxy
  detector: {type: KubeProxyFrozen, minSilence: 40s}
  for: 5s
  action: {type: RestartKubeProxy, namespace: kube-system, labelSelector: k8s-app=kube-proxy, readyTimeout: 50s, pollInterval: 500ms}
  cooldown: 1h
  rateLimit: {max: 1, per: 1h}
  maxAttempts: 1
  verifyAfter: 10s
- name: dataplane-drift
  detector: {type: DataplaneDrift, graceSyncPeriods: 1, families: [IPv4]}
- name: kube-proxy-unreachable
  detector: {type: KubeProxyUnreachable}
`

// TestE2ERestartFrozenKubeProxyByEngine runs the daemon in enforce mode
// (deploy/'s RBAC and admission policy, the ServiceAccount on node1)
// against the real apiserver and the real kube-proxy v1.34.4, SIGSTOPped by
// PID with a Service created after: once kube-proxy has answered nothing
// for minSilence and the rule's for, the daemon deletes its pod (a
// DaemonSet's, the test playing the DaemonSet controller and the kubelet:
// the stopped process killed by PID and started again, a Ready
// replacement), under the cluster budget, journaled with the drift as
// evidence, and verified; the restarted kube-proxy programs the Service.
// A kube-proxy that answers is never restarted (first phase).
func TestE2ERestartFrozenKubeProxyByEngine(t *testing.T) {
	parallelE2E(t)
	cp, auditLog, kubeconfig := startPodsControlPlane(t)
	admin := cp.Client
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	kp := cp.StartKubeProxy(controlplane.KubeProxyOptions{NodeName: "node1", SyncPeriod: 10 * time.Second})
	t.Cleanup(func() { _ = kp.Signal(syscall.SIGCONT) })
	const ns, oldName, newName, target = "kube-system", "kube-proxy-n1", "kube-proxy-n1-b", "kube-proxy/frozen"
	pod := func(name string) *corev1.Pod {
		p := fakekubelet.Workload(ns, name, "node1")
		p.Labels = map[string]string{"k8s-app": "kube-proxy"}
		p.OwnerReferences = []metav1.OwnerReference{{APIVersion: "apps/v1", Kind: "DaemonSet", Name: "kube-proxy", UID: "kube-proxy-ds", Controller: ptr.To(true)}}
		p.Spec.Containers[0].Name = "kube-proxy"
		p.Spec.TerminationGracePeriodSeconds = ptr.To[int64](30) // a delete waits for the kubelet
		return p
	}
	old := fakekubelet.Create(t, admin, pod(oldName), fakekubelet.Running(0, nil))
	// The process is the pod's, as under a kubelet: in a cgroup named as
	// the kubelet names the pod's container (the daemon tells kube-proxy
	// by its cgroup and the API, not by its name).
	cg := podcgroup.New(t, "e2e")
	cg.Into(t, string(old.UID), strings.Repeat("ab", 32), kp.Pid())

	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	state := filepath.Join(dir, "state")
	pol := filepath.Join(dir, "enforce.yaml")
	if err := os.WriteFile(pol, []byte(strings.Replace(e2eFrozenPolicy, "%MODE%", "enforce", 1)), 0o644); err != nil {
		t.Fatal(err)
	}
	cmd := mainCmd("ip", "netns", "exec", cp.NetNS.Name, self, "--policy", pol, "--kubeconfig", kubeconfig,
		"--state-dir", state, "--metrics-addr", "127.0.0.1:19809", "--node-name", "node1", "--proc-root", "/proc", "--log-level", "debug")
	cmd.Env = append(cmd.Env, "POD_NAMESPACE="+deploytest.Namespace) // its Leases (the cluster budget) go there
	logs, stop := startLogged(t, cmd)
	defer stop()
	find := func(kind string) *journal.Record {
		rs, err := journal.ReadAll(state)
		if err != nil && !os.IsNotExist(err) {
			t.Fatal(err)
		}
		for _, r := range rs {
			if r.Kind == kind && r.Target == target {
				return &r
			}
		}
		return nil
	}

	// kube-proxy answering: 20 s (4 cycles), nothing judged frozen,
	// nothing deleted.
	time.Sleep(20 * time.Second)
	if logs.has(`"detector":"KubeProxyFrozen","target":"kube-proxy/frozen"`) || find(journal.KindIntent) != nil || len(podDeletes(t, auditLog)) != 0 {
		t.Fatalf("an answering kube-proxy was judged frozen:\n%s", logs.String())
	}

	freezeKubeProxy(t, kp)
	frozen := time.Now()
	createLateService(ctx, t, cp, "frozen-e2e")

	// The DaemonSet controller and the kubelet: once the daemon deleted
	// the pod (graceful: terminating), the stopped process is killed by
	// PID and started again, a Ready replacement appears, and the old
	// pod's deletion is confirmed.
	waitUntil(t, 120*time.Second, "the daemon deletes kube-proxy's pod", func() bool {
		p, err := admin.CoreV1().Pods(ns).Get(ctx, oldName, metav1.GetOptions{})
		return err == nil && p.DeletionTimestamp != nil
	})
	deleted := time.Since(frozen)
	if err := kp.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	kp.Restart()
	fresh := fakekubelet.Create(t, admin, pod(newName), fakekubelet.Running(0, nil))
	cg.Into(t, string(fresh.UID), strings.Repeat("ab", 32), kp.Pid())
	if err := admin.CoreV1().Pods(ns).Delete(ctx, oldName, metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0), Preconditions: metav1.NewUIDPreconditions(string(old.UID))}); err != nil {
		t.Fatal(err)
	}
	var verified *journal.Record
	waitUntil(t, 90*time.Second, "the verified journal record", func() bool { verified = find(journal.KindVerified); return verified != nil })
	intent, outcome := find(journal.KindIntent), find(journal.KindOutcome)
	if intent == nil || outcome == nil || intent.Action != "RestartKubeProxy" || intent.Rule != "restart-frozen-kube-proxy" ||
		outcome.Outcome != "executed" || outcome.Details["oldUID"] != string(old.UID) || outcome.Details["newPod"] != newName {
		t.Fatalf("journal: intent %+v outcome %+v", intent, outcome)
	}
	t.Logf("pod deleted %v after the freeze (minSilence 40s + for 5s + cycles); journal: %s | %s | %s",
		deleted.Round(time.Second), journal.Format(*intent), journal.Format(*outcome), journal.Format(*verified))
	// The finding the restart acted on: the process, its state, the drift.
	if !logs.has(`"detector":"KubeProxyFrozen","target":"kube-proxy/frozen","severity":"critical"`) {
		t.Errorf("no KubeProxyFrozen finding logged:\n%s", logs.String())
	}
	// The daemon reported the drift beside the unreachable kube-proxy.
	if !logs.has(`"detector":"DataplaneDrift","target":"dataplane/IPv4/frozen-e2e/late:http"`) ||
		!logs.has(`"detector":"KubeProxyUnreachable","target":"kube-proxy/metrics"`) {
		t.Errorf("the daemon did not report the drift and the unreachable kube-proxy:\n%s", logs.String())
	}
	if !logs.has("state T (stopped (SIGSTOP))") || !logs.has("frozen-e2e/late:http (IPv4)") {
		t.Errorf("the finding does not name the stopped process and the unprogrammed Service:\n%s", logs.String())
	}
	d := podDeletes(t, auditLog)
	if len(d) < 1 || d[0].Name != oldName || d[0].UID != string(old.UID) || d[0].Code != 200 {
		t.Errorf("pod deletes %+v: want the daemon's of %s with precondition uid %s", d, oldName, old.UID)
	}
	// The restarted kube-proxy programs the Service.
	waitUntil(t, 60*time.Second, "the restarted kube-proxy programs frozen-e2e/late", func() bool {
		c := exec.Command("ip", "netns", "exec", cp.NetNS.Name, "iptables-legacy-save", "-t", "nat")
		c.Env = kp.Env()
		out, _ := c.Output()
		return strings.Contains(string(out), "frozen-e2e/late:http")
	})
	stop()
	if logs.has("forbidden") {
		t.Errorf("the daemon was refused a request:\n%s", logs.String())
	}
}
