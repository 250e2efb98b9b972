package realnode_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/remediate-dev/remediate/internal/testing/realnode"
)

// Scenario (g) of the lane: a hung iptables-restore behind a held xtables
// lock, with the chart's default capabilities (no SYS_PTRACE). The node's
// xtables lock is held from the host by flock (a host process: named as
// the holder, never a target: not an iptables program) and behind it wait
//   - kube-proxy's restore: a real `iptables-legacy-restore -w` started in
//     kube-proxy's container (ctr exec: kube-proxy's pod's cgroup, as a
//     restore kube-proxy runs), which the daemon reports (audit) and kills
//     (enforce);
//   - an impostor: the same real `iptables-legacy-restore -w`, with
//     CAP_NET_ADMIN in the node's network namespace and the node's lock
//     mounted, in a user pod (lane-impostor): another pod's cgroup, never
//     a target whatever its executable;
//   - a busy one: a process called iptables-restore in kube-proxy's
//     container that spins on a CPU: old enough, but making progress, so
//     never judged hung and never killed.
// The lane's policy scales the rule's minAge to 20s with no `for`.

// hungRestoreRule is the shipped policy's rule that kills a hung restore.
const hungRestoreRule = "kill-hung-iptables-restore"

// laneProc is a process the scenario started: its host PID and start time
// (never a PID reused since).
type laneProc struct {
	what  string
	pid   int
	start string
}

func (p laneProc) alive() bool {
	st, err := realnode.StartTime(p.pid)
	return err == nil && st == p.start
}

// kill sends SIGKILL to that process only, if it is still that one.
func (p laneProc) kill() {
	if p.pid > 1 && p.alive() {
		_ = syscall.Kill(p.pid, syscall.SIGKILL)
	}
}

// stuckRestores are the processes of scenario (g).
type stuckRestores struct {
	holder   *exec.Cmd
	kp       laneProc // kube-proxy's restore, waiting on the lock
	impostor laneProc // a real restore in a user pod, waiting on the lock
	busy     laneProc // iptables-restore by name in kube-proxy's container, spinning
	kpPod    *corev1.Pod
}

// restoreScript runs a real legacy restore of an empty filter table that
// waits for the xtables lock without a time limit (-w), as a restore stuck
// behind a held lock does.
const restoreScript = "exec iptables-legacy-restore -w -v --noflush <<'EOF'\n*filter\nCOMMIT\nEOF\n"

// restoreMarker tells the scenario's restores from kube-proxy's own (which
// run `iptables-restore -w 5 -W 100000 --noflush --counters` at each sync):
// only these are verbose.
const restoreMarker = "\x00-v\x00"

// startStuckRestores holds the node's lock and starts the three processes;
// all are stopped (by PID) and the lock released at the test's cleanup.
func startStuckRestores(ctx context.Context, t *testing.T, n *realnode.Node, tag string) *stuckRestores {
	t.Helper()
	s := &stuckRestores{}
	// The holder: flock on the node's lock file, from the host.
	s.holder = exec.Command("flock", "-x", n.XtablesLock, "sleep", "900")
	s.holder.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := s.holder.Start(); err != nil {
		t.Fatalf("flock: %v", err)
	}
	holderDone := make(chan struct{})
	go func() { _ = s.holder.Wait(); close(holderDone) }()
	t.Cleanup(func() {
		_ = syscall.Kill(-s.holder.Process.Pid, syscall.SIGKILL)
		<-holderDone
	})
	if err := n.Poll(ctx, "the node's xtables lock held by flock", 30*time.Second, func(ctx context.Context) (bool, string) {
		// flock -n fails (exit 1) while the lock is held by another.
		out, err := exec.CommandContext(ctx, "flock", "-n", "-x", n.XtablesLock, "true").CombinedOutput()
		return err != nil, string(out)
	}); err != nil {
		t.Fatal(err)
	}

	kpPod, err := kubeProxyPod(ctx, n)
	if err != nil {
		t.Fatal(err)
	}
	s.kpPod = kpPod
	s.kp = execInPod(ctx, t, n, kpPod, "kube-proxy", "lane-restore-"+tag, "iptables-legacy-restore", restoreMarker, "kube-proxy's restore", "sh", "-c", restoreScript)
	s.busy = execInPod(ctx, t, n, kpPod, "kube-proxy", "lane-busy-"+tag, "iptables-restore", "while :", "the busy restore",
		"nice", "-n", "10", "bash", "-c", `exec -a iptables-restore bash -c 'while :; do :; done'`)

	// The impostor: a user pod, hostNetwork, CAP_NET_ADMIN, the node's
	// lock mounted where iptables looks for it.
	imp := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "lane-impostor-" + tag, Namespace: "default"},
		Spec: corev1.PodSpec{
			HostNetwork:                   true,
			TerminationGracePeriodSeconds: ptr.To[int64](0),
			Containers: []corev1.Container{{
				Name: "restore", Image: realnode.KubeProxyImage, ImagePullPolicy: corev1.PullNever,
				Command:         []string{"sh", "-c", restoreScript},
				SecurityContext: &corev1.SecurityContext{Capabilities: &corev1.Capabilities{Add: []corev1.Capability{"NET_ADMIN", "NET_RAW"}}},
				VolumeMounts:    []corev1.VolumeMount{{Name: "xtables-lock", MountPath: "/run/xtables.lock"}},
			}},
			Volumes: []corev1.Volume{{Name: "xtables-lock", VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{
				Path: n.XtablesLock, Type: ptr.To(corev1.HostPathFileOrCreate)}}}},
		},
	}
	imp, err = n.Client.CoreV1().Pods("default").Create(ctx, imp, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		s.impostor.kill()
		_ = n.Client.CoreV1().Pods("default").Delete(context.Background(), imp.Name, metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)})
	})
	s.impostor = waitProcessInPod(ctx, t, n, string(imp.UID), "iptables-legacy-restore", restoreMarker, "the impostor's restore")
	for _, p := range []laneProc{s.kp, s.impostor, s.busy} {
		t.Logf("%s: pid %d", p.what, p.pid)
	}
	return s
}

// execInPod starts argv in the pod's container and returns the process
// whose argv[0] is argv0 and whose argv contains marker (kube-proxy's
// container runs short restores of the same name at every sync) in the
// pod's cgroup; it is killed (by PID) at the
// test's cleanup, then ctr is waited for.
func execInPod(ctx context.Context, t *testing.T, n *realnode.Node, pod *corev1.Pod, container, execID, argv0, marker, what string, argv ...string) laneProc {
	t.Helper()
	before, _ := realnode.ProcessInPod(string(pod.UID), argv0, marker)
	cmd, err := n.ExecInContainer(ctx, pod, container, execID, argv...)
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	p := waitProcessInPod(ctx, t, n, string(pod.UID), argv0, marker, what, before...)
	t.Cleanup(func() {
		p.kill()
		select {
		case <-done:
		case <-time.After(30 * time.Second):
			_ = cmd.Process.Kill()
			<-done
		}
	})
	return p
}

// waitProcessInPod waits for a new process (not one of old) named argv0
// in the pod's cgroup.
func waitProcessInPod(ctx context.Context, t *testing.T, n *realnode.Node, podUID, argv0, marker, what string, old ...int) laneProc {
	t.Helper()
	var p laneProc
	if err := n.Poll(ctx, what+" started", 2*time.Minute, func(ctx context.Context) (bool, string) {
		pids, err := realnode.ProcessInPod(podUID, argv0, marker)
		if err != nil {
			return false, err.Error()
		}
		for _, pid := range pids {
			isOld := false
			for _, o := range old {
				isOld = isOld || o == pid
			}
			if isOld {
				continue
			}
			st, err := realnode.StartTime(pid)
			if err != nil {
				continue
			}
			p = laneProc{what: what, pid: pid, start: st}
			return true, ""
		}
		return false, fmt.Sprintf("pids named %s in pod %s: %v", argv0, podUID, pids)
	}); err != nil {
		t.Fatal(err)
	}
	return p
}

// targets returns the journal records of the rule whose target is pid's.
func targets(recs []journalRecord, rule string, pid int) []journalRecord {
	var out []journalRecord
	prefix := "process/" + strconv.Itoa(pid) + "@"
	for _, r := range recs {
		if r.Rule == rule && strings.HasPrefix(r.Target, prefix) {
			out = append(out, r)
		}
	}
	return out
}

// hungRestoreAudit is (g) with enforce off: kube-proxy's restore is
// reported critical, waiting on the lock with its holder named, identity
// by cgroup and API, and journaled once as a dry-run; the impostor is
// reported as not a target; the busy one is not hung; after auditCycles
// more cycles nothing was signalled (all three alive, no intent).
func hungRestoreAudit(t *testing.T, n *realnode.Node) {
	ctx := context.Background()
	s := startStuckRestores(ctx, t, n, "audit")
	t0 := time.Now()

	var dry journalRecord
	if err := n.Poll(ctx, "a dry-run record of "+hungRestoreRule+" for kube-proxy's restore", 3*time.Minute, func(ctx context.Context) (bool, string) {
		recs, _ := journalRecords(t, n)
		for _, r := range targets(recs, hungRestoreRule, s.kp.pid) {
			if r.Kind == "dry-run" {
				dry = r
				return true, ""
			}
		}
		m, _ := scrape(ctx, n)
		return false, fmt.Sprintf("findings=%v", metricValue(m, "remediate_findings", `rule="`+hungRestoreRule+`"`))
	}); err != nil {
		t.Fatal(err)
	}
	t.Logf("dry-run after %.0fs: %s", time.Since(t0).Seconds(), dry.Summary)

	// What the on-call engineer sees: the one-shot report through the
	// kubectl plugin.
	out, err := run(t, n, 3*time.Minute, pluginBin, realnode.NodeName, "-o", "json")
	if err != nil && !strings.Contains(err.Error(), "exit status 2") {
		t.Fatalf("kubectl remediate: %v", err)
	}
	start := strings.Index(out, "\n{\n")
	if start < 0 {
		t.Fatalf("no report in the plugin's output:\n%s", out)
	}
	var r report
	if err := json.Unmarshal([]byte(out[start+1:]), &r); err != nil {
		t.Fatalf("report: %v\n%s", err, out)
	}
	var kpMsg, impMsg, busyMsg string
	for _, f := range r.Findings {
		if f.Detector != "HungIPTablesRestore" {
			continue
		}
		switch {
		case strings.Contains(f.Message, fmt.Sprintf("(pid %d)", s.kp.pid)):
			kpMsg = f.Severity + ": " + f.Message
			if f.Severity != "critical" {
				t.Errorf("kube-proxy's stuck restore reported %s, want critical: %s", f.Severity, f.Message)
			}
			if !strings.Contains(f.Message, fmt.Sprintf("flock (pid %d)", s.holder.Process.Pid)) {
				t.Errorf("kube-proxy's stuck restore: the holder flock (pid %d) is not named: %s", s.holder.Process.Pid, f.Message)
			}
			if strings.Contains(f.Message, "not a target") {
				t.Errorf("kube-proxy's stuck restore is not a target: %s", f.Message)
			}
		case strings.Contains(f.Message, fmt.Sprintf("(pid %d)", s.impostor.pid)):
			impMsg = f.Severity + ": " + f.Message
			if !strings.Contains(f.Message, "not a target") {
				t.Errorf("the impostor's restore (a user pod) is a target: %s", f.Message)
			}
		case strings.Contains(f.Message, fmt.Sprintf("(pid %d)", s.busy.pid)):
			busyMsg = f.Severity + ": " + f.Message
			if f.Severity == "critical" || f.Severity == "warning" {
				t.Errorf("the busy restore (spinning on a CPU) is judged hung: %s", f.Message)
			}
		}
	}
	for _, sk := range r.Skipped {
		if sk.Detector == "HungIPTablesRestore" || sk.Detector == "XtablesLockContention" {
			t.Errorf("%s/%s skipped with the chart's defaults: %s", sk.Rule, sk.Detector, sk.Reason)
		}
	}
	t.Logf("kube-proxy's: %s", kpMsg)
	t.Logf("impostor's: %s", impMsg)
	t.Logf("busy: %s", busyMsg)
	if kpMsg == "" {
		t.Errorf("no HungIPTablesRestore finding names kube-proxy's stuck restore (pid %d)", s.kp.pid)
	}

	// auditCycles more cycles: nothing signalled, nothing else journaled.
	m, err := scrape(ctx, n)
	if err != nil {
		t.Fatal(err)
	}
	c0 := metricValue(m, "remediate_cycle_duration_seconds_count")
	if err := n.Poll(ctx, fmt.Sprintf("%d more cycles", auditCycles), 3*time.Minute, func(ctx context.Context) (bool, string) {
		m, err := scrape(ctx, n)
		if err != nil {
			return false, err.Error()
		}
		c := metricValue(m, "remediate_cycle_duration_seconds_count")
		return c-c0 >= auditCycles, fmt.Sprintf("cycles %v (from %v)", c, c0)
	}); err != nil {
		t.Fatal(err)
	}
	recs, _ := journalRecords(t, n)
	for _, p := range []laneProc{s.kp, s.impostor, s.busy} {
		if !p.alive() {
			t.Errorf("%s (pid %d) is gone in audit mode", p.what, p.pid)
		}
		for _, r := range targets(recs, hungRestoreRule, p.pid) {
			if r.Kind != "dry-run" {
				t.Errorf("audit mode journaled %s for %s: %+v", r.Kind, p.what, r)
			}
		}
	}
	for _, p := range []laneProc{s.impostor, s.busy} {
		for _, rule := range []string{hungRestoreRule, "xtables-lock-holder"} {
			if rs := targets(recs, rule, p.pid); len(rs) > 0 {
				t.Errorf("%s (pid %d) has journal records of %s: %+v", p.what, p.pid, rule, rs)
			}
		}
	}
}

// hungRestore is (g) in enforce: kube-proxy's stuck restore is killed
// (intent, outcome executed, the process gone, verified), the impostor and
// the busy one are never signalled and the holder is left alone.
func hungRestore(t *testing.T, n *realnode.Node) {
	ctx := context.Background()
	s := startStuckRestores(ctx, t, n, "enforce")
	t0 := time.Now()
	var intent, outcome journalRecord
	if err := n.Poll(ctx, hungRestoreRule+" executed for kube-proxy's restore", 4*time.Minute, func(ctx context.Context) (bool, string) {
		recs, _ := journalRecords(t, n)
		last := ""
		for _, r := range targets(recs, hungRestoreRule, s.kp.pid) {
			last = fmt.Sprintf("%s %s %s %s", r.Kind, r.Outcome, r.Summary, r.Error)
			switch r.Kind {
			case "intent":
				intent = r
			case "outcome":
				outcome = r
			}
		}
		m, _ := scrape(ctx, n)
		return outcome.Kind != "", fmt.Sprintf("last record %q; findings=%v blocks=%v", last,
			metricValue(m, "remediate_findings", `rule="`+hungRestoreRule+`"`), metricValue(m, "remediate_guardrail_blocks_total", `rule="`+hungRestoreRule+`"`))
	}); err != nil {
		t.Fatal(err)
	}
	t.Logf("intent %q; outcome after %.0fs: %s %s %s", intent.Summary, time.Since(t0).Seconds(), outcome.Outcome, outcome.Summary, outcome.Error)
	if outcome.Outcome != "executed" {
		t.Fatalf("%s outcome %q (%s %s), want executed", hungRestoreRule, outcome.Outcome, outcome.Summary, outcome.Error)
	}
	if s.kp.alive() {
		t.Errorf("kube-proxy's stuck restore (pid %d) still exists after an executed kill", s.kp.pid)
	}
	v := waitJournal(t, n, hungRestoreRule, "verified", 2*time.Minute)
	t.Logf("verified after %.0fs: %s", time.Since(t0).Seconds(), v.Summary)

	// Two more cycles with the impostor and the busy one still there.
	m, err := scrape(ctx, n)
	if err != nil {
		t.Fatal(err)
	}
	c0 := metricValue(m, "remediate_cycle_duration_seconds_count")
	if err := n.Poll(ctx, "2 more cycles", 2*time.Minute, func(ctx context.Context) (bool, string) {
		m, err := scrape(ctx, n)
		if err != nil {
			return false, err.Error()
		}
		c := metricValue(m, "remediate_cycle_duration_seconds_count")
		return c-c0 >= 2, fmt.Sprintf("cycles %v (from %v)", c, c0)
	}); err != nil {
		t.Fatal(err)
	}
	recs, _ := journalRecords(t, n)
	for _, p := range []laneProc{s.impostor, s.busy} {
		if !p.alive() {
			t.Errorf("%s (pid %d) was killed; %s", p.what, p.pid, whoKilled(ctx, n, s, p))
		}
		for _, rule := range []string{hungRestoreRule, "xtables-lock-holder"} {
			if rs := targets(recs, rule, p.pid); len(rs) > 0 {
				t.Errorf("%s (pid %d) has journal records of %s: %+v", p.what, p.pid, rule, rs)
			}
		}
	}
	if err := s.holder.Process.Signal(syscall.Signal(0)); err != nil {
		t.Errorf("the lock holder flock (pid %d) is gone: %v", s.holder.Process.Pid, err)
	}
}

// whoKilled gathers what can tell why a process of the scenario is gone:
// kube-proxy's container restarted or its pod replaced (every process
// exec'd in it dies), the daemon's log lines naming the PID.
func whoKilled(ctx context.Context, n *realnode.Node, s *stuckRestores, p laneProc) string {
	var out []string
	if now, err := n.Client.CoreV1().Pods(s.kpPod.Namespace).Get(ctx, s.kpPod.Name, metav1.GetOptions{}); err != nil {
		out = append(out, fmt.Sprintf("kube-proxy pod %s: %v", s.kpPod.Name, err))
	} else {
		for i, cs := range now.Status.ContainerStatuses {
			before := ""
			if i < len(s.kpPod.Status.ContainerStatuses) {
				before = s.kpPod.Status.ContainerStatuses[i].ContainerID
			}
			out = append(out, fmt.Sprintf("kube-proxy container %s restarts %d, id %s (was %s), last state %+v", cs.Name, cs.RestartCount, cs.ContainerID, before, cs.LastTerminationState.Terminated))
		}
	}
	if rp, err := n.Client.CoreV1().Pods(releaseNS).List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/name=remediate"}); err == nil && len(rp.Items) > 0 {
		for _, l := range strings.Split(podLog(ctx, n, &rp.Items[0]), "\n") {
			if strings.Contains(l, strconv.Itoa(p.pid)) {
				out = append(out, "daemon: "+l)
			}
		}
	}
	return strings.Join(out, "; ")
}
