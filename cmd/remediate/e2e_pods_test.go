package main

import (
	"bufio"
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/remediate-dev/remediate/internal/cluster"
	"github.com/remediate-dev/remediate/internal/kube"
	"github.com/remediate-dev/remediate/internal/testing/controlplane"
	"github.com/remediate-dev/remediate/internal/testing/deploytest"
	"github.com/remediate-dev/remediate/internal/testing/fakekubelet"
	"github.com/remediate-dev/remediate/remediate/guardrails"
	"github.com/remediate-dev/remediate/remediate/journal"
)

// podsE2ENS is the test-made namespace of the workload pods; the CNI
// agent's pods live in kube-system (Calico's manifest install).
const podsE2ENS = "pods-e2e"

// startPodsControlPlane starts a control plane whose apiserver writes an
// audit log of pod deletes (with the request body: the DeleteOptions and
// their preconditions) to the returned path, applies the enforce overlay
// of deploy/ (the ServiceAccount's RBAC and the admission policy the
// binary then runs under, through the kubeconfig it returns: the
// ServiceAccount on node1, as a bound pod token authenticates), and
// creates what pods need without a controller-manager: the namespaces'
// default ServiceAccounts, and Nodes node1 and node2.
func startPodsControlPlane(t *testing.T) (cp *controlplane.ControlPlane, auditLog, kubeconfig string) {
	t.Helper()
	dir := t.TempDir()
	auditPolicy := filepath.Join(dir, "audit-policy.yaml")
	auditLog = filepath.Join(dir, "audit.log")
	if err := os.WriteFile(auditPolicy, []byte(`apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: [RequestReceived]
rules:
- level: Request
  verbs: [delete, deletecollection]
  resources: [{group: "", resources: [pods]}]
- level: None
`), 0o644); err != nil {
		t.Fatal(err)
	}
	cp = controlplane.Start(t, controlplane.Options{ExtraAPIServerArgs: []string{
		"--audit-policy-file", auditPolicy, "--audit-log-path", auditLog, "--audit-log-mode", "blocking"}})
	ctx := context.Background()
	for _, ns := range []string{podsE2ENS, deploytest.Namespace} {
		if _, err := cp.Client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	deploytest.ApplyOverlay(t, cp, "enforce", false)
	for _, ns := range []string{podsE2ENS, "kube-system"} {
		if _, err := cp.Client.CoreV1().ServiceAccounts(ns).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "default"}}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
			t.Fatal(err)
		}
	}
	for _, n := range []string{"node1", "node2"} {
		if _, err := cp.Client.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: n}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	return cp, auditLog, deploytest.DaemonKubeconfig(t, cp, "node1")
}

// podDeletes are the pod deletes the apiserver's audit log recorded: who
// (the impersonated user, when impersonating), which pod, and the UID
// precondition the request carried.
type podDelete struct {
	User, Namespace, Name, UID string
	Code                       int
	GracePeriod                *int64 // the kubelet's confirmation has 0
}

func podDeletes(t *testing.T, auditLog string) []podDelete {
	t.Helper()
	b, err := os.ReadFile(auditLog)
	if err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	var out []podDelete
	for _, l := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		if l == "" {
			continue
		}
		var ev struct {
			Stage            string                     `json:"stage"`
			Verb             string                     `json:"verb"`
			User             struct{ Username string }  `json:"user"`
			ImpersonatedUser *struct{ Username string } `json:"impersonatedUser"`
			ObjectRef        struct {
				Namespace, Name string
			} `json:"objectRef"`
			ResponseStatus struct{ Code int } `json:"responseStatus"`
			RequestObject  struct {
				Preconditions      struct{ UID string } `json:"preconditions"`
				GracePeriodSeconds *int64               `json:"gracePeriodSeconds"`
			} `json:"requestObject"`
		}
		if err := json.Unmarshal([]byte(l), &ev); err != nil {
			t.Fatalf("audit log line %q: %v", l, err)
		}
		if ev.Stage == "ResponseComplete" && ev.Verb == "delete" {
			user := ev.User.Username
			if ev.ImpersonatedUser != nil {
				user = ev.ImpersonatedUser.Username
			}
			out = append(out, podDelete{User: user, Namespace: ev.ObjectRef.Namespace, Name: ev.ObjectRef.Name,
				UID: ev.RequestObject.Preconditions.UID, Code: ev.ResponseStatus.Code, GracePeriod: ev.RequestObject.GracePeriodSeconds})
		}
	}
	return out
}

// e2ePodsPolicy is the pod rules of examples/audit.yaml, as written there.
const e2ePodsPolicy = `apiVersion: remediate.dev/v1alpha1
kind: RemediationPolicy
mode: audit
rules:
- name: pods-network-not-ready
  detector: {type: PodsNetworkNotReady, minAge: 5m, maxListed: 10}
  for: 1m
- name: cni-agent-unhealthy
  detector: {type: CNIAgentUnhealthy, notReadyFor: 1m, restartWindow: 15m}
  for: 2m
  action: {type: RestartNodeAgent, readyTimeout: 50s}
  cooldown: 1h
  rateLimit: {max: 2, per: 12h}
  maxAttempts: 1
  verifyAfter: 2m
`

// TestE2EPodFindingsOnce runs the real binary's `--once --dry-run` against
// the real kube-apiserver with node1's pods written as a kubelet would
// (no kubelet runs): twelve pods without sandbox/network for longer than
// minAge (eleven with PodReadyToStartContainers False, one of an older
// kubelet only waiting in ContainerCreating), one waiting less, one of
// node2 and node1's calico-node not Ready, restarting and OOM-killed give
// exit 2, one PodsNetworkNotReady finding counting twelve, naming ten and
// the oldest, with the agent's state, and a critical CNIAgentUnhealthy
// whose RestartNodeAgent is a dry run naming the pod's UID (nothing
// deleted); with the kubelet's status fixed, exit 0 with both checks ok.
func TestE2EPodFindingsOnce(t *testing.T) {
	parallelE2E(t)
	cp, auditLog, kubeconfig := startPodsControlPlane(t)
	admin := cp.Client
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	now := time.Now()
	podNS := "POD_NAMESPACE=" + deploytest.Namespace // as in the DaemonSet's pod (kubectl remediate runs --once there)

	var stuck []string
	for i := 0; i < 11; i++ {
		name := fmt.Sprintf("stuck-%02d", i)
		fakekubelet.Create(t, admin, fakekubelet.Workload(podsE2ENS, name, "node1"), fakekubelet.SandboxNotReady(now.Add(-time.Duration(20-i)*time.Minute)))
		stuck = append(stuck, podsE2ENS+"/"+name)
	}
	// An older kubelet (no PodReadyToStartContainers): ContainerCreating
	// since it was scheduled, 30 minutes ago, the oldest.
	old := fakekubelet.SandboxNotReady(now.Add(-30 * time.Minute))
	old.Conditions = old.Conditions[1:2]
	fakekubelet.Create(t, admin, fakekubelet.Workload(podsE2ENS, "old-kubelet", "node1"), old)
	stuck = append(stuck, podsE2ENS+"/old-kubelet")
	fakekubelet.Create(t, admin, fakekubelet.Workload(podsE2ENS, "young", "node1"), fakekubelet.SandboxNotReady(now.Add(-time.Minute)))
	fakekubelet.Create(t, admin, fakekubelet.Workload(podsE2ENS, "healthy", "node1"), fakekubelet.Running(0, nil))
	fakekubelet.Create(t, admin, fakekubelet.Workload(podsE2ENS, "other-node", "node2"), fakekubelet.SandboxNotReady(now.Add(-time.Hour)))
	oom := &corev1.ContainerStateTerminated{Reason: "OOMKilled", ExitCode: 137, FinishedAt: metav1.NewTime(now.Add(-2 * time.Minute))}
	agent := fakekubelet.Create(t, admin, fakekubelet.CalicoNode("kube-system", "calico-node-n1", "node1"), fakekubelet.NotReady(now.Add(-5*time.Minute), 4, oom))
	fakekubelet.Create(t, admin, fakekubelet.CalicoNode("kube-system", "calico-node-n2", "node2"), fakekubelet.NotReady(now.Add(-time.Hour), 9, nil))

	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	pol := filepath.Join(dir, "policy.yaml")
	if err := os.WriteFile(pol, []byte(e2ePodsPolicy), 0o644); err != nil {
		t.Fatal(err)
	}
	once := func(t *testing.T) (int, e2eReport) {
		t.Helper()
		var rep e2eReport
		code := onceInNetNSEnv(ctx, t, cp, self, &rep, []string{podNS}, "--dry-run", "--policy", pol, "--kubeconfig", kubeconfig,
			"--state-dir", filepath.Join(dir, "state"), "--node-name", "node1", "--proc-root", "/proc")
		return code, rep
	}

	t.Run("stuck", func(t *testing.T) {
		code, rep := once(t)
		if code != 2 {
			t.Errorf("exit %d, want 2 (findings)", code)
		}
		byRule := map[string]int{}
		for i, f := range rep.Findings {
			byRule[f.Rule]++
			t.Logf("finding %s %s %s: %s", f.Rule, f.Target, f.Severity, f.Message)
			switch f.Rule {
			case "pods-network-not-ready":
				if f.Target != cluster.NodePodsTarget || f.Severity != "warning" {
					t.Errorf("pods finding: target %q severity %q", f.Target, f.Severity)
				}
				checkStuckPodsMessage(t, f.Message, stuck)
				if !strings.HasPrefix(f.Message, "12 pods on node node1 have had no sandbox/network for more than 5m0s (oldest "+podsE2ENS+"/old-kubelet for 30m") {
					t.Errorf("pods finding does not count twelve and name the oldest: %s", f.Message)
				}
				if !strings.Contains(f.Message, "CNI agent kube-system/calico-node-n1 not Ready (4 restarts)") {
					t.Errorf("pods finding without the agent's state: %s", f.Message)
				}
				ev := rep.Findings[i].Evidence
				if ev["stuckPods"] != float64(12) || ev["nodePods"] != float64(15) || len(ev["pods"].([]any)) != 10 {
					t.Errorf("pods evidence: stuckPods %v nodePods %v, %d listed", ev["stuckPods"], ev["nodePods"], len(ev["pods"].([]any)))
				}
			case "cni-agent-unhealthy":
				if f.Target != "node-agent/kube-system/calico-node" || f.Severity != "critical" || f.Evidence["pod"] != "calico-node-n1" ||
					!strings.Contains(f.Message, "not Ready for 5m") || !strings.Contains(f.Message, "OOM-killed (container calico-node)") ||
					!strings.Contains(f.Message, "restarting (4 restarts, container calico-node last ended OOMKilled with exit code 137)") {
					t.Errorf("agent finding: %s %s %s", f.Target, f.Severity, f.Message)
				}
			}
		}
		if byRule["pods-network-not-ready"] != 1 || byRule["cni-agent-unhealthy"] != 1 || len(rep.Findings) != 2 {
			t.Fatalf("findings per rule %v, want one each", byRule)
		}
		// The action is planned against the live pod, and not run.
		var dec []string
		for _, d := range rep.Decisions {
			if d.Action == "" {
				continue // the report-only rule
			}
			dec = append(dec, fmt.Sprintf("%s %s %s %s: %s", d.Rule, d.Action, d.Target, d.Outcome, d.Reason))
		}
		want := fmt.Sprintf("cni-agent-unhealthy RestartNodeAgent node-agent/kube-system/calico-node dry-run: --dry-run: would delete calico-node pod kube-system/calico-node-n1 (uid %s) on node node1", agent.UID)
		if len(dec) != 1 || !strings.HasPrefix(dec[0], want) {
			t.Errorf("decisions:\n%s\nwant one starting %q", strings.Join(dec, "\n"), want)
		}
		p, err := admin.CoreV1().Pods("kube-system").Get(ctx, "calico-node-n1", metav1.GetOptions{})
		if err != nil || p.UID != agent.UID || p.DeletionTimestamp != nil {
			t.Errorf("the agent pod after a dry run: %v, uid %s, deletion %v", err, p.UID, p.DeletionTimestamp)
		}
		if d := podDeletes(t, auditLog); len(d) != 0 {
			t.Errorf("pod deletes in a dry run: %+v", d)
		}
	})

	t.Run("fixed", func(t *testing.T) {
		// The CNI plugin works again: the kubelet writes the sandboxes
		// ready and the containers running; the agent is Ready, its last
		// exit long ago.
		for _, key := range stuck {
			_, name, _ := strings.Cut(key, "/")
			fakekubelet.SetStatus(t, admin, podsE2ENS, name, fakekubelet.Running(0, nil))
		}
		oom.FinishedAt = metav1.NewTime(now.Add(-time.Hour))
		fakekubelet.SetStatus(t, admin, "kube-system", "calico-node-n1", fakekubelet.Running(4, oom))
		code, rep := once(t)
		judged := map[string]string{}
		for _, o := range rep.OK {
			judged[o.Rule] = o.Judged
		}
		if code != 0 || len(rep.Findings) != 0 ||
			judged["pods-network-not-ready"] != "0 of 15 pods on node node1 without sandbox/network longer than 5m0s (1 waiting less)" ||
			!strings.HasPrefix(judged["cni-agent-unhealthy"], "CNI agent pods kube-system/calico-node-n1 Ready") {
			t.Errorf("after the fix: exit %d, findings %+v, decisions %+v, ok %v", code, rep.Findings, rep.Decisions, judged)
		}
	})
}

// checkStuckPodsMessage checks that the message names exactly ten of the
// stuck pods, the other two counted as "and 2 more", and no other pod.
func checkStuckPodsMessage(t *testing.T, msg string, stuck []string) {
	t.Helper()
	named := 0
	for _, k := range stuck {
		if regexp.MustCompile(regexp.QuoteMeta(k) + `\b`).MatchString(msg) {
			named++
		}
	}
	if named != 10 || !strings.Contains(msg, " and 2 more") {
		t.Errorf("the message names %d of the %d stuck pods (want 10 and \"and 2 more\"): %s", named, len(stuck), msg)
	}
	for _, other := range []string{"young", "healthy", "other-node"} {
		if strings.Contains(msg, podsE2ENS+"/"+other) {
			t.Errorf("the message names %s: %s", other, msg)
		}
	}
}

// e2eRestartPolicy enables RestartNodeAgent for the CNI agent finding,
// with windows short enough for a test: the finding after the agent is
// not Ready for 2 s and has been found for 2 s; one restart per hour.
const e2eRestartPolicy = `apiVersion: remediate.dev/v1alpha1
kind: RemediationPolicy
mode: %MODE%
interval: 1s
jitter: 0
detectorTimeout: 1s
rules:
- name: restart-unready-cni-agent
  detector: {type: CNIAgentUnhealthy, notReadyFor: 2s, restartWindow: 1m}
  for: 2s
  action: {type: RestartNodeAgent, readyTimeout: 20s, pollInterval: 250ms}
  cooldown: 1h
  rateLimit: {max: 1, per: 1h}
  maxAttempts: 1
  verifyAfter: 2s
`

// TestE2ERestartNodeAgentByEngine runs the real daemon against the real
// kube-apiserver, node1's calico-node pod (a DaemonSet's, grace period
// 30 s) not Ready. The test plays the DaemonSet controller and the
// kubelet. In audit mode the daemon journals the plan and deletes nothing.
// Then in enforce mode, on the same state dir, with deploy/'s RBAC, a
// fleet pause holds the restart, from the first cycle although the pause
// ConfigMap is listed 3 s after the rest; once lifted, it journals the intent,
// deletes exactly that pod with its UID as precondition (the apiserver's
// audit log shows the request), waits for the Ready replacement, journals
// the outcome naming it and verifies the finding cleared. The finding's
// target is the agent (node-agent/<ns>/<DaemonSet>), not the pod: when the
// replacement is not Ready in turn, the finding is back on the same
// target, and the rule's cooldown (1 hour, per target) blocks a second
// restart: no delete, no second journal intent.
func TestE2ERestartNodeAgentByEngine(t *testing.T) {
	parallelE2E(t)
	cp, auditLog, kubeconfig := startPodsControlPlane(t)
	admin := cp.Client
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	const ns, oldName, newName, rule = "kube-system", "calico-node-n1", "calico-node-n1-b", "restart-unready-cni-agent"
	const target = "node-agent/" + ns + "/calico-node" // the DaemonSet's name
	pod := fakekubelet.CalicoNode(ns, oldName, "node1")
	pod.Spec.TerminationGracePeriodSeconds = ptr.To[int64](30) // a delete waits for the kubelet
	agent := fakekubelet.Create(t, admin, pod, fakekubelet.NotReady(time.Now().Add(-time.Minute), 3, nil))
	fakekubelet.Create(t, admin, fakekubelet.CalicoNode(ns, "calico-node-n2", "node2"), fakekubelet.NotReady(time.Now().Add(-time.Minute), 3, nil))

	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	state := filepath.Join(dir, "state")
	const metricsAddr = "127.0.0.1:19808" // inside the control plane's namespace
	daemon := func(mode, kubeconfig string) (*logBuf, func()) {
		pol := filepath.Join(dir, mode+".yaml")
		if err := os.WriteFile(pol, []byte(strings.Replace(e2eRestartPolicy, "%MODE%", mode, 1)), 0o644); err != nil {
			t.Fatal(err)
		}
		cmd := mainCmd("ip", "netns", "exec", cp.NetNS.Name, self, "--policy", pol, "--kubeconfig", kubeconfig,
			"--state-dir", state, "--metrics-addr", metricsAddr, "--node-name", "node1", "--proc-root", "/proc", "--log-level", "debug")
		cmd.Env = append(cmd.Env, "POD_NAMESPACE="+deploytest.Namespace) // as the DaemonSet sets it: its Leases go there
		return startLogged(t, cmd)
	}
	records := func() []journal.Record {
		rs, err := journal.ReadAll(state)
		if err != nil && !os.IsNotExist(err) {
			t.Fatal(err)
		}
		return rs
	}
	find := func(kind, target string) *journal.Record {
		for _, r := range records() {
			if r.Kind == kind && r.Target == target {
				return &r
			}
		}
		return nil
	}

	// Every request the daemon makes is allowed to its ServiceAccount.
	noForbidden := func(t *testing.T, logs *logBuf) {
		t.Helper()
		if logs.has("forbidden") {
			t.Errorf("the daemon was refused a request:\n%s", logs.String())
		}
	}
	t.Run("audit", func(t *testing.T) {
		logs, stop := daemon("audit", kubeconfig)
		defer stop()
		var dry *journal.Record
		waitUntil(t, 40*time.Second, "the dry-run journal record", func() bool { dry = find(journal.KindDryRun, target); return dry != nil })
		want := fmt.Sprintf("would delete calico-node pod %s/%s (uid %s) on node node1", ns, oldName, agent.UID)
		if dry.Rule != rule || dry.Action != "RestartNodeAgent" || !strings.HasPrefix(dry.Summary, want) || dry.Details["uid"] != string(agent.UID) {
			t.Errorf("dry-run record %+v, want summary %q", dry, want)
		}
		time.Sleep(2 * time.Second) // more cycles: still nothing done
		stop()
		noForbidden(t, logs)
		p, err := admin.CoreV1().Pods(ns).Get(ctx, oldName, metav1.GetOptions{})
		if err != nil || p.UID != agent.UID || p.DeletionTimestamp != nil {
			t.Fatalf("the agent pod after audit mode: %v, deletion %v", err, p.DeletionTimestamp)
		}
		if d := podDeletes(t, auditLog); len(d) != 0 {
			t.Fatalf("pod deletes in audit mode: %+v", d)
		}
		for _, r := range records() {
			if r.Kind == journal.KindIntent || r.Kind == journal.KindOutcome {
				t.Errorf("audit mode journaled %s: %+v", r.Kind, r)
			}
		}
	})

	t.Run("enforce", func(t *testing.T) {
		// The DaemonSet controller and the kubelet: once the daemon has
		// deleted the pod (graceful: it is terminating), a replacement is
		// created, the old pod's deletion confirmed, and a second later
		// the replacement is Running and Ready.
		played := make(chan error, 1)
		go func() { played <- playDaemonSet(ctx, cp, ns, oldName, newName) }()
		// First with the fleet paused (the ConfigMap the daemon reads by
		// name, with deploy/'s RBAC): the restart is held.
		pause := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: kube.FleetConfigMap, Namespace: deploytest.Namespace},
			Data: map[string]string{kube.PauseKey: "e2e: upgrading"}}
		if _, err := admin.CoreV1().ConfigMaps(deploytest.Namespace).Create(ctx, pause, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		// Its API connection goes through a proxy that holds ConfigMap
		// requests for 3 s: the pause is listed after the rest of the
		// cluster, and must still hold the first cycle's restart.
		logs, stop := daemon("enforce", slowConfigMaps(t, cp, "127.0.0.1:16443", 3*time.Second, kubeconfig))
		defer stop()
		hc := cp.NetNS.HTTPClient(5 * time.Second)
		metricAbove0 := func(series string) bool {
			resp, err := hc.Get("http://" + metricsAddr + "/metrics")
			if err != nil {
				return false
			}
			defer resp.Body.Close()
			b, _ := io.ReadAll(resp.Body)
			return regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(series) + ` [1-9]`).Match(b)
		}
		waitUntil(t, 40*time.Second, "the restart held by the fleet pause", func() bool {
			return metricAbove0(fmt.Sprintf(`remediate_guardrail_blocks_total{guardrail=%q,rule=%q}`, guardrails.GuardFleetPause, rule))
		})
		if p, err := admin.CoreV1().Pods(ns).Get(ctx, oldName, metav1.GetOptions{}); err != nil || p.DeletionTimestamp != nil ||
			!metricAbove0("remediate_fleet_paused") || find(journal.KindIntent, target) != nil {
			t.Fatalf("the fleet pause did not hold the restart: %v, deletion %v, journal %+v", err, p.DeletionTimestamp, records())
		}
		if err := admin.CoreV1().ConfigMaps(deploytest.Namespace).Delete(ctx, kube.FleetConfigMap, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		var verified *journal.Record
		waitUntil(t, 60*time.Second, "the verified journal record", func() bool {
			verified = find(journal.KindVerified, target)
			return verified != nil
		})
		if err := <-played; err != nil {
			t.Fatalf("playing the DaemonSet controller and the kubelet: %v", err)
		}
		intent, outcome := find(journal.KindIntent, target), find(journal.KindOutcome, target)
		if intent == nil || outcome == nil || intent.ID != outcome.ID || !intent.Time.Before(outcome.Time) || outcome.Time.After(verified.Time) {
			t.Fatalf("journal: intent %+v outcome %+v verified %+v", intent, outcome, verified)
		}
		if intent.Action != "RestartNodeAgent" || intent.Details["uid"] != string(agent.UID) ||
			outcome.Outcome != "executed" || outcome.Details["oldUID"] != string(agent.UID) || outcome.Details["newPod"] != newName ||
			!strings.HasPrefix(outcome.Summary, "deleted calico-node pod "+ns+"/"+oldName+"; replacement "+newName+" Ready after") {
			t.Errorf("journal: intent %+v\noutcome %+v", intent, outcome)
		}
		t.Logf("journal: %s | %s | %s", journal.Format(*intent), journal.Format(*outcome), journal.Format(*verified))
		// Two deletes of that pod, both with its UID as precondition: the
		// daemon's, as its ServiceAccount (graceful: the pod's own grace
		// period), then the kubelet's confirmation (grace period 0, the
		// test's).
		d := podDeletes(t, auditLog)
		if len(d) != 2 || d[0].User != deploytest.SAUser || d[0].Name != oldName || d[0].UID != string(agent.UID) || d[0].GracePeriod != nil || d[0].Code != 200 ||
			d[1].Name != oldName || d[1].GracePeriod == nil || *d[1].GracePeriod != 0 {
			t.Errorf("pod deletes %+v: want the daemon's of %s with precondition uid %s, then the kubelet's", d, oldName, agent.UID)
		} else {
			t.Logf("the daemon's delete: %+v", d[0])
		}
		if _, err := admin.CoreV1().Pods(ns).Get(ctx, "calico-node-n2", metav1.GetOptions{}); err != nil {
			t.Errorf("node2's agent pod: %v", err)
		}

		// The replacement is not Ready in turn: the finding is back on
		// the same target, its pod the replacement, so the rule's
		// cooldown (kept per target) blocks a second restart.
		fakekubelet.SetStatus(t, admin, ns, newName, fakekubelet.NotReady(time.Now().Add(-10*time.Second), 0, nil))
		waitUntil(t, 30*time.Second, "a cooldown block", func() bool {
			return metricAbove0(fmt.Sprintf(`remediate_guardrail_blocks_total{guardrail=%q,rule=%q}`, guardrails.GuardCooldown, rule))
		})
		if !logs.has(`"msg":"finding appeared","rule":"` + rule + `","detector":"CNIAgentUnhealthy","target":"` + target + `","severity":"critical","message":"CNI agent calico-node pod ` + ns + "/" + newName) {
			t.Errorf("no finding on the agent naming the replacement logged")
		}
		p, err := admin.CoreV1().Pods(ns).Get(ctx, newName, metav1.GetOptions{})
		if err != nil || p.DeletionTimestamp != nil {
			t.Errorf("the replacement after the block: %v, deletion %v", err, p.DeletionTimestamp)
		}
		intents := 0
		for _, r := range records() {
			if r.Kind == journal.KindIntent {
				intents++
			}
		}
		if intents != 1 || len(podDeletes(t, auditLog)) != len(d) {
			t.Errorf("a second restart went ahead: %+v", records())
		}
		stop()
		noForbidden(t, logs)
	})
}

// slowConfigMaps starts an HTTPS reverse proxy to the apiserver at addr
// inside the control plane's namespace that holds every request for
// ConfigMaps for delay (the rest passes at once), and returns a copy of
// kubeconfig that points at it.
func slowConfigMaps(t *testing.T, cp *controlplane.ControlPlane, addr string, delay time.Duration, kubeconfig string) string {
	t.Helper()
	target, err := url.Parse(controlplane.APIServerURL)
	if err != nil {
		t.Fatal(err)
	}
	rp := httputil.NewSingleHostReverseProxy(target)
	rp.FlushInterval = -1 // watches stream
	rp.Transport = &http.Transport{DialContext: cp.NetNS.DialContext, ForceAttemptHTTP2: true,
		TLSClientConfig: &tls.Config{InsecureSkipVerify: true}} // the apiserver's self-signed certificate
	l, err := cp.NetNS.Listen("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if strings.Contains(r.URL.Path, "/configmaps") {
			select {
			case <-time.After(delay):
			case <-r.Context().Done():
				return
			}
		}
		rp.ServeHTTP(w, r)
	}))
	srv.Listener.Close()
	srv.Listener = l
	srv.EnableHTTP2 = true
	srv.StartTLS()
	t.Cleanup(func() { srv.CloseClientConnections(); srv.Close() })
	b, err := os.ReadFile(kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(t.TempDir(), "slow-configmaps.kubeconfig")
	if err := os.WriteFile(out, []byte(strings.Replace(string(b), controlplane.APIServerURL, "https://"+addr, 1)), 0o600); err != nil {
		t.Fatal(err)
	}
	return out
}

// playDaemonSet plays the DaemonSet controller and the kubelet for one
// restart of the agent pod oldName: when it is terminating, it creates
// newName (Pending, ContainerCreating), confirms the old pod's deletion as
// the kubelet does once its containers stopped (grace period 0, UID
// precondition), and a second later writes newName Running and Ready.
func playDaemonSet(ctx context.Context, cp *controlplane.ControlPlane, ns, oldName, newName string) error {
	pods := cp.Client.CoreV1().Pods(ns)
	for {
		p, err := pods.Get(ctx, oldName, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return fmt.Errorf("%s deleted at once: it should wait for the kubelet (grace period 30 s)", oldName)
		}
		if err == nil && p.DeletionTimestamp != nil {
			repl, err := pods.Create(ctx, fakekubelet.CalicoNode(ns, newName, p.Spec.NodeName), metav1.CreateOptions{})
			if err != nil {
				return err
			}
			pending := fakekubelet.SandboxNotReady(time.Now())
			pending.ContainerStatuses[0].Name = repl.Spec.Containers[0].Name
			repl.Status = pending
			if repl, err = pods.UpdateStatus(ctx, repl, metav1.UpdateOptions{}); err != nil {
				return err
			}
			if err := pods.Delete(ctx, oldName, metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0), Preconditions: metav1.NewUIDPreconditions(string(p.UID))}); err != nil {
				return err
			}
			time.Sleep(time.Second)
			ready := fakekubelet.Running(0, nil)
			ready.ContainerStatuses[0].Name = repl.Spec.Containers[0].Name
			ready.Conditions[1].LastTransitionTime = metav1.Now()
			repl.Status = ready
			_, err = pods.UpdateStatus(ctx, repl, metav1.UpdateOptions{})
			return err
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%s never deleted: %w", oldName, ctx.Err())
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// startLogged starts cmd (a daemon), collects its stderr log lines, and
// returns them with a stop function (SIGINT, then SIGKILL after 10 s; the
// log is printed when the test failed), also run at cleanup.
func startLogged(t *testing.T, cmd *exec.Cmd) (*logBuf, func()) {
	t.Helper()
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	logs := &logBuf{}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	scanned := make(chan struct{})
	go func() {
		defer close(scanned)
		sc := bufio.NewScanner(stderr)
		sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
		for sc.Scan() {
			logs.add(sc.Text())
		}
	}()
	var once sync.Once
	stop := func() {
		once.Do(func() {
			_ = cmd.Process.Signal(os.Interrupt)
			done := make(chan struct{})
			go func() { <-scanned; _ = cmd.Wait(); close(done) }()
			select {
			case <-done:
			case <-time.After(10 * time.Second):
				_ = cmd.Process.Kill()
				<-done
			}
			if t.Failed() {
				t.Logf("%s log:\n%s", strings.Join(cmd.Args, " "), logs.String())
			}
		})
	}
	t.Cleanup(stop)
	return logs, stop
}
