package detect

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	clocktesting "k8s.io/utils/clock/testing"

	"github.com/remediate-dev/remediate/internal/cluster"
	"github.com/remediate-dev/remediate/internal/cluster/clustertest"
	"github.com/remediate-dev/remediate/internal/finding"
	"github.com/remediate-dev/remediate/internal/node"
	"github.com/remediate-dev/remediate/internal/procs"
)

var podsT0 = time.Date(2026, 11, 23, 12, 0, 0, 0, time.UTC)

func stuck(name string, since time.Time) cluster.Pod {
	return cluster.Pod{Namespace: "app", Name: name, UID: "uid-" + name, Created: since, Phase: "Pending",
		SandboxReady: cluster.Condition{Status: "False", Since: since},
		Containers: []cluster.ContainerStatus{{Name: "c", WaitingReason: "ContainerCreating",
			WaitingMessage: `failed to setup network for sandbox: plugin type="calico" failed (add): timeout`}}}
}

func running(name string) cluster.Pod {
	return cluster.Pod{Namespace: "app", Name: name, UID: "uid-" + name, Created: podsT0.Add(-time.Hour), Phase: "Running",
		SandboxReady: cluster.Condition{Status: "True", Since: podsT0.Add(-time.Hour)}, Ready: cluster.Condition{Status: "True"}}
}

func calicoPod(ready bool, restarts int32, lastReason string, lastAt time.Time) cluster.Pod {
	st := "True"
	if !ready {
		st = "False"
	}
	return cluster.Pod{Namespace: "kube-system", Name: "calico-node-abcde", UID: "uid-calico", Labels: map[string]string{"k8s-app": "calico-node"},
		ControllerKind: "DaemonSet", ControllerName: "calico-node", Created: podsT0.Add(-24 * time.Hour), Phase: "Running",
		Ready:      cluster.Condition{Status: st, Since: podsT0.Add(-10 * time.Minute)},
		Containers: []cluster.ContainerStatus{{Name: "calico-node", Ready: ready, RestartCount: restarts, LastTerminatedReason: lastReason, LastTerminatedAt: lastAt, LastTerminatedExitCode: 137}}}
}

func podsNode(view *clustertest.Pods, clk *clocktesting.FakePassiveClock) *node.Node {
	return &node.Node{Name: "node1", Clock: clk, Pods: view}
}

func TestPodsNetworkNotReady(t *testing.T) {
	ctx := context.Background()
	clk := clocktesting.NewFakePassiveClock(podsT0)
	view := clustertest.NewPods(podsT0)
	n := podsNode(view, clk)
	pr := procs.NewFake(1)
	n.Procs, n.XtablesLock = pr, "/run/xtables.lock"
	pr.Add(procs.FakeProcess{Process: procs.Process{Pid: 42, Cmdline: []string{"iptables-restore"}}})
	pr.SetLocks("/run/xtables.lock", procs.FileLocks{Held: true, Holders: []procs.Process{{Pid: 42, Cmdline: []string{"iptables-restore"}}}})
	d := newIssue3Detector(t, "PodsNetworkNotReady", n, nil)

	// Nothing on the node, healthy pods, and a pod stuck for less than
	// 5m: no finding.
	view.Set(running("web-1"), stuck("young", podsT0.Add(-4*time.Minute)), calicoPod(true, 0, "", time.Time{}))
	if fs, err := d.Detect(ctx); err != nil || len(fs) != 0 {
		t.Fatalf("young pod: %v %v", fs, err)
	}
	if j := d.(Judged).Judged(); !strings.Contains(j, "0 of 3 pods") || !strings.Contains(j, "1 waiting less") {
		t.Errorf("judged %q", j)
	}
	// Past 5 minutes: one finding naming it, with the evidence of the
	// node.
	clk.SetTime(podsT0.Add(2 * time.Minute))
	fs, err := d.Detect(ctx)
	if err != nil || len(fs) != 1 {
		t.Fatalf("stuck pod: %v %v", fs, err)
	}
	f := fs[0]
	if f.Target != cluster.NodePodsTarget || f.Evidence["stuckPods"] != 1 || !strings.Contains(f.Message, "app/young") {
		t.Errorf("finding %+v", f)
	}
	for _, want := range []string{"CNI agent kube-system/calico-node-abcde Ready", "xtables lock held by iptables-restore (pid 42)"} {
		if !strings.Contains(f.Message, want) {
			t.Errorf("message %q lacks %q", f.Message, want)
		}
	}
	if ps := f.Evidence["pods"].([]map[string]any); !strings.Contains(fmt.Sprint(ps[0]["message"]), "calico") {
		t.Errorf("pods evidence %v", ps)
	}
	// Many stuck pods: still one finding, the list bounded, the count whole.
	for i := 0; i < 30; i++ {
		view.Set(stuck(fmt.Sprintf("batch-%02d", i), podsT0.Add(-time.Duration(10+i)*time.Minute)))
	}
	fs, _ = d.Detect(ctx)
	if len(fs) != 1 || fs[0].Evidence["stuckPods"] != 31 || len(fs[0].Evidence["pods"].([]map[string]any)) != 10 {
		t.Fatalf("many: %+v", fs)
	}
	if !strings.Contains(fs[0].Message, "oldest app/batch-29") || !strings.Contains(fs[0].Message, "and 21 more") {
		t.Errorf("many message %q", fs[0].Message)
	}
	// Fixed: sandbox ready, finding clears.
	for _, p := range view.NodePods() {
		if p.Namespace == "app" {
			view.Set(running(p.Name))
		}
	}
	if fs, _ := d.Detect(ctx); len(fs) != 0 {
		t.Fatalf("after fix: %+v", fs)
	}
	// An older kubelet: no PodReadyToStartContainers, ContainerCreating
	// since scheduling counts; terminating and succeeded pods never do.
	old := stuck("old-kubelet", podsT0.Add(-time.Hour))
	old.SandboxReady = cluster.Condition{}
	old.Scheduled = cluster.Condition{Status: "True", Since: podsT0.Add(-time.Hour)}
	gone := stuck("gone", podsT0.Add(-time.Hour))
	gone.Terminating = true
	done := stuck("done", podsT0.Add(-time.Hour))
	done.Phase = "Succeeded"
	pulling := running("pulling")
	pulling.Containers = []cluster.ContainerStatus{{Name: "c", WaitingReason: "ContainerCreating"}} // sandbox True: image pull, not network
	view.Set(old, gone, done, pulling)
	fs, _ = d.Detect(ctx)
	if len(fs) != 1 || fs[0].Evidence["stuckPods"] != 1 || !strings.Contains(fs[0].Message, "app/old-kubelet") {
		t.Fatalf("old kubelet: %+v", fs)
	}
	// An unsynced watch or no cluster access: skip, never "healthy".
	view.SetFreshness(cluster.Freshness{})
	if _, err := d.Detect(ctx); err == nil {
		t.Error("unsynced view did not skip")
	} else if _, ok := finding.IsSkip(err); !ok {
		t.Errorf("unsynced: %v", err)
	}
	view.SetFreshness(cluster.Freshness{Synced: true, Connected: false, LastError: fmt.Errorf("watch broke")})
	if _, err := d.Detect(ctx); err == nil || !strings.Contains(err.Error(), "disconnected (watch broke)") {
		t.Errorf("disconnected: %v", err)
	}
	n.Pods = nil
	n.Unavailable = map[string]string{"kubernetes": "no cluster access: test"}
	if _, err := d.Detect(ctx); err == nil || !strings.Contains(err.Error(), "no cluster access: test") {
		t.Errorf("no access: %v", err)
	}
}

func TestCNIAgentUnhealthy(t *testing.T) {
	ctx := context.Background()
	clk := clocktesting.NewFakePassiveClock(podsT0)
	view := clustertest.NewPods(podsT0)
	n := podsNode(view, clk)
	d := newIssue3Detector(t, "CNIAgentUnhealthy", n, nil)
	// No agent pod: skip naming the agents looked for.
	view.Set(running("web"))
	if _, err := d.Detect(ctx); err == nil || !strings.Contains(err.Error(), "calico-node, cilium, flannel") {
		t.Fatalf("no agent: %v", err)
	}
	view.Set(calicoPod(true, 3, "Error", podsT0.Add(-time.Hour)))
	if fs, err := d.Detect(ctx); err != nil || len(fs) != 0 {
		t.Fatalf("healthy agent (old restarts): %v %v", fs, err)
	}
	// Not Ready for 10m: critical.
	view.Set(calicoPod(false, 3, "Error", podsT0.Add(-time.Hour)))
	fs, _ := d.Detect(ctx)
	if len(fs) != 1 || fs[0].Severity != finding.Critical || fs[0].Target != "node-agent/kube-system/calico-node" || !strings.Contains(fs[0].Message, "not Ready for 10m0s") {
		t.Fatalf("not ready: %+v", fs)
	}
	if fs[0].Evidence[cluster.EvidenceAgent] != "calico-node" || fs[0].Evidence["restartCount"] != int32(3) ||
		fs[0].Evidence["pod"] != "calico-node-abcde" || fs[0].Evidence[cluster.EvidencePodUID] != "uid-calico" {
		t.Errorf("evidence %v", fs[0].Evidence)
	}
	// The target is the agent, not the pod: the DaemonSet's replacement
	// (another name and UID) is the same target, its pod the evidence;
	// a pod of another DaemonSet is another target; a pod with no
	// controller is named by its agent.
	for _, tc := range []struct{ name, uid, ds, want string }{
		{"calico-node-fghij", "uid-repl", "calico-node", "node-agent/kube-system/calico-node"},
		{"calico-node-win-x", "uid-win", "calico-node-windows", "node-agent/kube-system/calico-node-windows"},
		{"calico-node-bare", "uid-bare", "", "node-agent/kube-system/calico-node"},
	} {
		p := calicoPod(false, 3, "Error", podsT0.Add(-time.Hour))
		p.Name, p.UID, p.ControllerName = tc.name, tc.uid, tc.ds
		if tc.ds == "" {
			p.ControllerKind = ""
		}
		view.Set(p)
		view.Delete("kube-system", "calico-node-abcde")
		fs, _ := d.Detect(ctx)
		if len(fs) != 1 || fs[0].Target != tc.want || fs[0].Evidence["pod"] != tc.name || fs[0].Evidence[cluster.EvidencePodUID] != tc.uid {
			t.Errorf("%s: %+v, want target %s", tc.name, fs, tc.want)
		}
		view.Delete("kube-system", tc.name)
	}
	// Ready again: clears.
	view.Set(calicoPod(true, 3, "Error", podsT0.Add(-time.Hour)))
	if fs, _ := d.Detect(ctx); len(fs) != 0 {
		t.Fatalf("ready again: %+v", fs)
	}
	// The restart count rises (the last exit time unknown): warning,
	// until restartWindow passes.
	p := calicoPod(true, 4, "", time.Time{})
	view.Set(p)
	fs, _ = d.Detect(ctx)
	if len(fs) != 1 || fs[0].Severity != finding.Warning || !strings.Contains(fs[0].Message, "restarting (4 restarts") {
		t.Fatalf("rising: %+v", fs)
	}
	clk.SetTime(podsT0.Add(16 * time.Minute))
	if fs, _ := d.Detect(ctx); len(fs) != 0 {
		t.Fatalf("after the window: %+v", fs)
	}
	// OOM-killed a minute ago: named, with the reason; clears after the
	// window.
	view.Set(calicoPod(true, 5, "OOMKilled", clk.Now().Add(-time.Minute)))
	fs, _ = d.Detect(ctx)
	if len(fs) != 1 || fs[0].Evidence["oomKilled"] != true || fs[0].Evidence["lastTerminatedReason"] != "OOMKilled" || !strings.Contains(fs[0].Message, "OOM-killed") {
		t.Fatalf("oom: %+v", fs)
	}
	clk.SetTime(clk.Now().Add(15 * time.Minute))
	if fs, _ := d.Detect(ctx); len(fs) != 0 {
		t.Fatalf("oom after the window: %+v", fs)
	}
	// A last exit without a time (no kubelet leaves it out) is not
	// taken as recent.
	view.Set(calicoPod(true, 5, "Error", time.Time{}))
	if fs, _ := d.Detect(ctx); len(fs) != 0 {
		t.Fatalf("exit without time: %+v", fs)
	}
	// A pod in another namespace with the label is no agent.
	view.Delete("kube-system", "calico-node-abcde")
	impostor := calicoPod(false, 0, "", time.Time{})
	impostor.Namespace = "default"
	view.Set(impostor)
	if _, err := d.Detect(ctx); err == nil {
		t.Error("a labelled pod outside the agent's namespaces was taken for the agent")
	}
}

func TestCNIConfig(t *testing.T) {
	ctx := context.Background()
	root := t.TempDir()
	conf, bin := filepath.Join(root, "net.d"), filepath.Join(root, "bin")
	n := &node.Node{Name: "node1", CNIConfDir: conf, CNIBinDir: bin, Clock: clocktesting.NewFakePassiveClock(podsT0)}
	d := newIssue3Detector(t, "CNIConfig", n, nil)
	expect := func(sev finding.Severity, want string) {
		t.Helper()
		fs, err := d.Detect(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if want == "" {
			if len(fs) != 0 {
				t.Fatalf("unexpected %+v", fs)
			}
			return
		}
		if len(fs) != 1 || fs[0].Severity != sev || !strings.Contains(fs[0].Message, want) || fs[0].Target != CNIConfigTarget {
			t.Fatalf("got %+v, want %s %q", fs, sev, want)
		}
	}
	// Not evidently a Kubernetes node (no cluster access, no kubelet; a
	// developer's machine): a missing or empty directory is skipped, with
	// the reason.
	ps := procs.NewFake(1)
	ps.Add(procs.FakeProcess{Process: procs.Process{Pid: 7, Cmdline: []string{"/usr/sbin/sshd"}}})
	n.Procs = ps
	expectSkip := func(want string) {
		t.Helper()
		fs, err := d.Detect(ctx)
		if reason, ok := finding.IsSkip(err); !ok || !strings.Contains(reason, want) || len(fs) != 0 {
			t.Fatalf("got %+v, %v; want a skip %q", fs, err, want)
		}
	}
	expectSkip("does not exist and this is not evidently a Kubernetes node (no cluster access and no kubelet process)")
	must(t, os.MkdirAll(conf, 0o755))
	must(t, os.MkdirAll(bin, 0o755))
	expectSkip("holds no network configuration")
	// A kubelet runs: the same directory is a finding, with the evidence.
	ps.Add(procs.FakeProcess{Process: procs.Process{Pid: 42, Cmdline: []string{"/usr/bin/kubelet", "--config=/var/lib/kubelet/config.yaml"}}})
	expect(finding.Critical, "holds no network configuration")
	if fs, _ := d.Detect(ctx); len(fs) != 1 || fs[0].Evidence["kubernetesNode"] != "kubelet running (pid 42)" {
		t.Errorf("evidence %+v", fs)
	}
	ps.Remove(42)
	expectSkip("holds no network configuration")
	// Cluster access (the watch of this node's pods) is evidence enough,
	// without a kubelet process in sight (another PID namespace).
	n.Pods = clustertest.NewPods(podsT0)
	must(t, os.Remove(conf))
	expect(finding.Critical, "does not exist")
	n.Pods = nil
	n.Procs = nil
	expectSkip("does not exist and this is not evidently a Kubernetes node (no cluster access and procs is not configured")
	n.Pods = clustertest.NewPods(podsT0)
	must(t, os.MkdirAll(conf, 0o755))
	expect(finding.Critical, "holds no network configuration")
	must(t, os.WriteFile(filepath.Join(conf, "10-flannel.conflist"), []byte(`{"name":"cbr0","cniVersion":"1.0.0","plugins":[{"type":"flannel"},{"type":"portmap"}]}`), 0o644))
	expect(finding.Critical, "names plugins missing from "+bin+": flannel, portmap")
	for _, p := range []string{"flannel", "portmap"} {
		must(t, os.WriteFile(filepath.Join(bin, p), []byte("#!/bin/sh\n"), 0o755))
	}
	expect("", "")
	if j := d.(Judged).Judged(); !strings.Contains(j, "10-flannel.conflist (network cbr0, plugins flannel, portmap) loadable") {
		t.Errorf("judged %q", j)
	}
	must(t, os.WriteFile(filepath.Join(conf, "99-old.conf"), []byte(`{"name":`), 0o644))
	expect(finding.Warning, "99-old.conf")
	must(t, os.WriteFile(filepath.Join(conf, "10-flannel.conflist"), []byte(`{"name":"cbr0","cniVersion":"1.0.0","plug`), 0o644))
	expect(finding.Critical, "10-flannel.conflist cannot be loaded")
	n.CNIConfDir = ""
	if _, err := d.Detect(ctx); err == nil {
		t.Error("no conf dir configured: no skip")
	}
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}
