package action

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/remediate-dev/remediate/internal/cluster"
	"github.com/remediate-dev/remediate/internal/finding"
	"github.com/remediate-dev/remediate/internal/node"
	"github.com/remediate-dev/remediate/internal/procs"
	"github.com/remediate-dev/remediate/policy"
)

func agentPod(ns, name, nodeName string, uid types.UID, lbl map[string]string, ready bool) *corev1.Pod {
	p := kpPod(name, nodeName, uid, ready, "DaemonSet")
	p.Namespace, p.Labels = ns, lbl
	return p
}

func newRestartAgent(t *testing.T, n *node.Node, timeout time.Duration) Action {
	t.Helper()
	typ, ok := Lookup("RestartNodeAgent")
	if !ok {
		t.Fatal("RestartNodeAgent not registered")
	}
	p := typ.NewParams().(*RestartNodeAgentParams)
	p.ReadyTimeout, p.PollInterval = policy.D(timeout), policy.D(20*time.Millisecond)
	if errs := p.Validate(); len(errs) != 0 && timeout >= 10*time.Second {
		t.Fatal(errs)
	}
	a, err := typ.New(p, n)
	if err != nil {
		t.Fatal(err)
	}
	return a
}

func TestRestartNodeAgent(t *testing.T) {
	ctx := context.Background()
	calico := map[string]string{"k8s-app": "calico-node"}
	static := agentPod("kube-system", "calico-static", "n1", "s", calico, true)
	static.OwnerReferences = nil
	cs := fake.NewClientset(
		agentPod("calico-system", "calico-node-a", "n1", "a", calico, true),
		agentPod("calico-system", "calico-node-b", "n2", "b", calico, true),
		agentPod("kube-system", "coredns-x", "n1", "x", map[string]string{"k8s-app": "kube-dns"}, true),
		agentPod("default", "fake-calico", "n1", "f", calico, true),
		kpPod("kp-1", "n1", "k", true, "DaemonSet"),
		static,
	)
	// The proc root of the lock-holder case: pid 77 runs in kp-1's cgroup.
	root := t.TempDir()
	if err := os.MkdirAll(filepath.Join(root, "77"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(root, "77", "cgroup"), []byte("0::/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod1b2c3d4e_0f1a_4b2c_8d3e_4f5a6b7c8d9e.slice/cri-containerd-1.scope\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	pr := procs.NewFake(1)
	pr.Add(procs.FakeProcess{Process: procs.Process{Pid: 77, CreateTimeMs: 5, Cmdline: []string{"iptables-restore"}}})
	n := &node.Node{Name: "n1", Kube: cs, ProcRoot: root, Procs: pr}
	a := newRestartAgent(t, n, 2*time.Second)

	for _, tc := range []struct {
		kind              finding.Kind
		target, err, skip string
	}{
		{finding.KindPod, "pod/calico-system/calico-node-b", "no pod calico-system/calico-node-b of an allowlisted agent on node n1", ""},
		{finding.KindPod, "pod/kube-system/coredns-x", "no pod kube-system/coredns-x of an allowlisted agent", ""},
		{finding.KindPod, "pod/default/fake-calico", "no pod default/fake-calico of an allowlisted agent", ""},
		{finding.KindPod, "pod/kube-system/calico-static", "", "not managed by a DaemonSet"},
		{finding.KindProcess, "process/77@6", "", "is another process now"},
		{finding.KindProcess, "process/77@5", "is no allowlisted agent's pod", ""},
		{finding.KindIPVSVirtualServer, "ipvs-vs/UDP/10.96.0.10:53", "is no node agent, pod, process or kube-proxy", ""},
		{"", "kube-proxy/IPv4", "is no node agent, pod, process or kube-proxy", ""},
	} {
		_, err := a.Plan(ctx, kindFinding(tc.kind, tc.target))
		if err == nil {
			t.Errorf("%s: planned", tc.target)
			continue
		}
		reason, skipped := finding.IsSkip(err)
		switch {
		case tc.skip != "" && (!skipped || !strings.Contains(reason, tc.skip)):
			t.Errorf("%s: %v, want skip %q", tc.target, err, tc.skip)
		case tc.err != "" && (skipped || !strings.Contains(err.Error(), tc.err)):
			t.Errorf("%s: %v, want refusal %q", tc.target, err, tc.err)
		}
	}
	// The lock holder in kube-proxy's pod: kube-proxy is planned.
	kp, _ := cs.CoreV1().Pods("kube-system").Get(ctx, "kp-1", metav1.GetOptions{})
	kp.UID = "1b2c3d4e-0f1a-4b2c-8d3e-4f5a6b7c8d9e"
	if _, err := cs.CoreV1().Pods("kube-system").Update(ctx, kp, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	if plan, err := a.Plan(ctx, kindFinding(finding.KindProcess, "process/77@5")); err != nil || !strings.Contains(plan.Summary, "kube-proxy pod kube-system/kp-1") {
		t.Errorf("lock holder plan %+v %v", plan, err)
	}
	// A CNI agent's process (CNIAgentChains' kind): its pod, by cgroup, as
	// for any process.
	if plan, err := a.Plan(ctx, kindFinding(finding.KindCNIAgentProcess, "process/77@5")); err != nil || !strings.Contains(plan.Summary, "kube-proxy pod kube-system/kp-1") {
		t.Errorf("CNI agent process plan %+v %v", plan, err)
	}
	if plan, err := a.Plan(ctx, kindFinding(finding.KindKubeProxy, "kube-proxy/IPv4")); err != nil || !strings.Contains(plan.Summary, "kube-proxy pod kube-system/kp-1") {
		t.Errorf("kube-proxy plan %+v %v", plan, err)
	}

	// The CNI agent: deleted, replaced, Ready.
	go func() {
		for {
			if _, err := cs.CoreV1().Pods("calico-system").Get(ctx, "calico-node-a", metav1.GetOptions{}); err != nil {
				break
			}
			time.Sleep(10 * time.Millisecond)
		}
		_, _ = cs.CoreV1().Pods("calico-system").Create(ctx, agentPod("calico-system", "calico-node-z", "n1", "z", calico, false), metav1.CreateOptions{})
		time.Sleep(100 * time.Millisecond)
		_, _ = cs.CoreV1().Pods("calico-system").UpdateStatus(ctx, agentPod("calico-system", "calico-node-z", "n1", "z", calico, true), metav1.UpdateOptions{})
	}()
	res, err := a.Execute(ctx, kindFinding(finding.KindPod, "pod/calico-system/calico-node-a"))
	if err != nil || res.Details["newPod"] != "calico-node-z" || res.Details["agent"] != "calico-node" {
		t.Fatalf("execute %+v %v", res, err)
	}
	// No replacement within readyTimeout: an error (a failed attempt).
	_, err = a.Execute(ctx, kindFinding(finding.KindPod, "pod/calico-system/calico-node-z"))
	if err == nil || !strings.Contains(err.Error(), "no Ready replacement") {
		t.Fatalf("no replacement: %v", err)
	}
	if _, err := cs.CoreV1().Pods("calico-system").Get(ctx, "calico-node-b", metav1.GetOptions{}); err != nil {
		t.Errorf("the other node's agent pod was touched: %v", err)
	}
}

func TestRestartNodeAgentParams(t *testing.T) {
	typ, _ := Lookup("RestartNodeAgent")
	p := typ.NewParams().(*RestartNodeAgentParams)
	if errs := p.Validate(); len(errs) != 0 {
		t.Fatalf("defaults invalid: %v", errs)
	}
	p.Agents[0].LabelSelector = ""
	p.Agents[1].Namespaces = nil
	if errs := p.Validate(); len(errs) != 2 {
		t.Errorf("errors %v", errs)
	}
}

// TestRestartNodeAgentByAgentTarget: a node-agent target (CNIAgentUnhealthy's)
// resolves to the agent's current pod on this node, by its DaemonSet (the
// agent's name for a pod with no controller), skipping a terminating old
// pod; it refuses to act when the pod was replaced since the finding judged
// it (its UID in the evidence).
func TestRestartNodeAgentByAgentTarget(t *testing.T) {
	ctx := context.Background()
	calico := map[string]string{"k8s-app": "calico-node"}
	ds := func(p *corev1.Pod, name string) *corev1.Pod {
		p.OwnerReferences[0].Name, p.OwnerReferences[0].UID = name, types.UID(name)
		return p
	}
	old := ds(agentPod("calico-system", "calico-node-old", "n1", "o", calico, false), "calico-node")
	old.DeletionTimestamp = &metav1.Time{Time: time.Now()}
	bare := agentPod("kube-system", "calico-bare", "n1", "s", calico, true)
	bare.OwnerReferences = nil
	cs := fake.NewClientset(
		ds(agentPod("calico-system", "calico-node-a", "n1", "a", calico, false), "calico-node"),
		old,
		ds(agentPod("calico-system", "calico-node-b", "n2", "b", calico, true), "calico-node"),
		ds(agentPod("calico-system", "calico-node-win-a", "n1", "w", calico, true), "calico-node-windows"),
		bare,
	)
	n := &node.Node{Name: "n1", Kube: cs}
	a := newRestartAgent(t, n, 2*time.Second)
	const target = "node-agent/calico-system/calico-node"
	ev := func(target, uid string) finding.Finding {
		f := kindFinding(finding.KindNodeAgent, target)
		f.Subject.Agent = &finding.Agent{PodUID: uid}
		return f
	}
	plan, err := a.Plan(ctx, ev(target, "a"))
	if err != nil || plan.Details["pod"] != "calico-node-a" || plan.Details["uid"] != "a" {
		t.Fatalf("plan %+v %v", plan, err)
	}
	if plan, err := a.Plan(ctx, kindFinding(finding.KindNodeAgent, "node-agent/calico-system/calico-node-windows")); err != nil || plan.Details["pod"] != "calico-node-win-a" {
		t.Errorf("the other DaemonSet: %+v %v", plan, err)
	}
	for _, tc := range []struct {
		target, uid, err, skip string
	}{
		{target, "gone", "", "replaced since"},
		{"node-agent/calico-system/cilium", "", "", "no pod of node agent calico-system/cilium"},
		{"node-agent/default/calico-node", "", "", "no pod of node agent default/calico-node"},
		{"node-agent/kube-system/calico-node", "s", "", "not managed by a DaemonSet"},
		{"node-agent/calico-system", "", "not a node agent target", ""},
	} {
		_, err := a.Plan(ctx, ev(tc.target, tc.uid))
		reason, skipped := finding.IsSkip(err)
		switch {
		case err == nil:
			t.Errorf("%s (uid %s): planned", tc.target, tc.uid)
		case tc.skip != "" && (!skipped || !strings.Contains(reason, tc.skip)):
			t.Errorf("%s: %v, want skip %q", tc.target, err, tc.skip)
		case tc.err != "" && (skipped || !strings.Contains(err.Error(), tc.err)):
			t.Errorf("%s: %v, want refusal %q", tc.target, err, tc.err)
		}
	}

	// Executed: the current pod is deleted, the replacement awaited.
	go func() {
		for {
			if _, err := cs.CoreV1().Pods("calico-system").Get(ctx, "calico-node-a", metav1.GetOptions{}); err != nil {
				break
			}
			time.Sleep(10 * time.Millisecond)
		}
		_, _ = cs.CoreV1().Pods("calico-system").Create(ctx, ds(agentPod("calico-system", "calico-node-z", "n1", "z", calico, true), "calico-node"), metav1.CreateOptions{})
	}()
	res, err := a.Execute(ctx, ev(target, "a"))
	if err != nil || res.Details["oldPod"] != "calico-node-a" || res.Details["newPod"] != "calico-node-z" {
		t.Fatalf("execute %+v %v", res, err)
	}
	// The same target now names the replacement.
	if plan, err := a.Plan(ctx, ev(target, "z")); err != nil || plan.Details["pod"] != "calico-node-z" {
		t.Errorf("after the restart: %+v %v", plan, err)
	}
}

// kindFinding is a finding about target, of kind (the engine fills the
// kind in from the detector type's declaration).
func kindFinding(kind finding.Kind, target string) finding.Finding {
	return finding.Finding{Target: target, Subject: finding.Subject{Kind: kind}}
}

// TestRestartNodeAgentShapes (issue 37): a kube-proxy the API cannot
// restart is refused with how to restart it instead: a static pod's
// mirror (by the pod, and by its process, whose cgroup carries the static
// pod's UID, not the mirror's), a host process of a systemd unit, and a
// kube-proxy finding whose detector told an embedded shape.
func TestRestartNodeAgentShapes(t *testing.T) {
	ctx := context.Background()
	const hash = "0123456789abcdef0123456789abcdef"
	mirror := kpPod("kube-proxy-n1", "n1", "m", true, "Node")
	mirror.Annotations = map[string]string{cluster.MirrorAnnotation: hash}
	cs := fake.NewClientset(mirror)
	root := t.TempDir()
	if err := os.MkdirAll(filepath.Join(root, "78"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(root, "78", "cgroup"), []byte("0::/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod"+hash+".slice/cri-containerd-"+strings.Repeat("c", 64)+".scope\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Join(root, "79"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(root, "79", "cgroup"), []byte("0::/system.slice/kube-proxy.service\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	pr := procs.NewFake(1)
	pr.Add(procs.FakeProcess{Process: procs.Process{Pid: 78, CreateTimeMs: 5, Cmdline: []string{"kube-proxy"}}})
	pr.Add(procs.FakeProcess{Process: procs.Process{Pid: 79, CreateTimeMs: 5, Cmdline: []string{"kube-proxy"}}})
	a := newRestartAgent(t, &node.Node{Name: "n1", Kube: cs, ProcRoot: root, Procs: pr}, 2*time.Second)
	embedded := kindFinding(finding.KindKubeProxy, "kube-proxy/frozen")
	embedded.Subject.Agent = &finding.Agent{Shape: "embedded", RestartHow: "it runs inside k3s-server: systemctl restart k3s.service"}
	for _, tc := range []struct {
		name string
		f    finding.Finding
		skip string
	}{
		{"mirror pod", kindFinding(finding.KindPod, "pod/kube-system/kube-proxy-n1"), "mirror of a static pod"},
		{"static pod's process", kindFinding(finding.KindProcess, "process/78@5"), "mirror of a static pod"},
		{"kube-proxy of a static pod", kindFinding(finding.KindKubeProxy, "kube-proxy/IPv4"), "mirror of a static pod"},
		{"systemd unit's process", kindFinding(finding.KindProcess, "process/79@5"), "systemctl restart kube-proxy.service"},
		{"embedded", embedded, "not a DaemonSet's pod (embedded): deleting a pod would not restart it: it runs inside k3s-server"},
	} {
		_, err := a.Plan(ctx, tc.f)
		if reason, ok := finding.IsSkip(err); !ok || !strings.Contains(reason, tc.skip) {
			t.Errorf("%s: %v, want a skip saying %q", tc.name, err, tc.skip)
		}
	}
}
