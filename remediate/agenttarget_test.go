package remediate

import (
	"fmt"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/utils/ptr"

	"github.com/remediate-dev/remediate/internal/cluster"
	"github.com/remediate-dev/remediate/internal/kube"
	"github.com/remediate-dev/remediate/remediate/guardrails"
	"github.com/remediate-dev/remediate/remediate/journal"
)

// apiPods is the pod view of node1 over a fake clientset's pods, as the
// pod watch would see them (kube.ToPod).
type apiPods struct{ cs *fake.Clientset }

func (v apiPods) NodePods() []cluster.Pod {
	l, err := v.cs.Tracker().List(corev1.SchemeGroupVersion.WithResource("pods"), corev1.SchemeGroupVersion.WithKind("Pod"), "")
	if err != nil {
		panic(err)
	}
	var out []cluster.Pod
	for _, p := range l.(*corev1.PodList).Items {
		if p.Spec.NodeName == "node1" {
			out = append(out, kube.ToPod(&p))
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Key() < out[j].Key() })
	return out
}

func (apiPods) Freshness() cluster.Freshness { return cluster.Freshness{Synced: true, Connected: true} }

// calicoNodePod is node1's calico-node DaemonSet pod, Ready or not Ready
// since long before t0.
func calicoNodePod(name string, ready bool) *corev1.Pod {
	st := corev1.ConditionFalse
	if ready {
		st = corev1.ConditionTrue
	}
	since := metav1.NewTime(t0.Add(-time.Hour))
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "kube-system", UID: types.UID("uid-" + name), Labels: map[string]string{"k8s-app": "calico-node"},
			CreationTimestamp: since,
			OwnerReferences:   []metav1.OwnerReference{{APIVersion: "apps/v1", Kind: "DaemonSet", Name: "calico-node", UID: "calico-ds", Controller: ptr.To(true)}}},
		Spec: corev1.PodSpec{NodeName: "node1", Containers: []corev1.Container{{Name: "calico-node"}}},
		Status: corev1.PodStatus{Phase: corev1.PodRunning, Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: st, LastTransitionTime: since}},
			ContainerStatuses: []corev1.ContainerStatus{{Name: "calico-node", Ready: ready}}},
	}
}

// TestRestartedAgentKeepsCooldownAndEscalation runs the real
// CNIAgentUnhealthy and RestartNodeAgent in the engine, the fake
// clientset playing the DaemonSet (a delete creates a Ready replacement
// with a new name), the replacement then not Ready in turn. The finding's
// target is the agent, not the pod, so the engine's per-target state
// follows it to the replacement: verification fails (the agent is still
// unhealthy), a second restart within the cooldown is blocked by the
// cooldown (not by the rule's rate limit, which would allow it), and
// once the attempts are used up the target escalates. With a per-pod
// target the deleted pod's finding vanished (verified) and the
// replacement's was a new target, restarted again at once.
func TestRestartedAgentKeepsCooldownAndEscalation(t *testing.T) {
	h := newHarness(t)
	cs := fake.NewClientset(calicoNodePod("calico-node-1", false))
	var (
		mu      sync.Mutex
		deleted []string
	)
	cs.PrependReactor("delete", "pods", func(a k8stesting.Action) (bool, runtime.Object, error) {
		mu.Lock()
		defer mu.Unlock()
		d := a.(k8stesting.DeleteAction)
		deleted = append(deleted, d.GetName())
		repl := calicoNodePod(fmt.Sprintf("calico-node-%d", len(deleted)+1), true)
		return false, nil, cs.Tracker().Add(repl)
	})
	deletes := func() []string { mu.Lock(); defer mu.Unlock(); return append([]string(nil), deleted...) }
	// The replacement of the nth restart turns not Ready.
	unready := func(n int) {
		t.Helper()
		if err := cs.Tracker().Update(corev1.SchemeGroupVersion.WithResource("pods"), calicoNodePod(fmt.Sprintf("calico-node-%d", n), false), "kube-system"); err != nil {
			t.Fatal(err)
		}
	}
	h.opts.Node.Kube, h.opts.Node.Pods = cs, apiPods{cs}
	e := h.engine(mustPolicy(t, `mode: enforce
rules:
- name: restart-cni
  detector: {type: CNIAgentUnhealthy, notReadyFor: 1m, restartWindow: 15m}
  for: 0s
  action: {type: RestartNodeAgent, readyTimeout: 10s, pollInterval: 100ms}
  cooldown: 1h
  rateLimit: {max: 10, per: 1h}
  maxAttempts: 2
  verifyAfter: 30s
`))
	const target = "node-agent/kube-system/calico-node"

	// The first restart.
	if d := decisionFor(h.cycle(e), target); d.Outcome != OutcomeExecuted {
		t.Fatalf("first cycle: %+v", d)
	}
	unready(2)
	// Verification: the agent is still unhealthy (its replacement); the
	// retry is within the cooldown.
	h.clock.Step(31 * time.Second)
	rep := h.cycle(e)
	var verifyFailed bool
	for _, d := range rep.Decisions {
		verifyFailed = verifyFailed || (d.Target == target && d.Outcome == OutcomeFailed && strings.Contains(d.Reason, "verification failed"))
	}
	if d := decisionFor(rep, target); !verifyFailed || d.Outcome != OutcomeBlocked || d.Guardrail != guardrails.GuardCooldown {
		t.Fatalf("second cycle: want a failed verification and a cooldown block: %+v", rep.Decisions)
	}
	if got := deletes(); len(got) != 1 || got[0] != "calico-node-1" {
		t.Fatalf("deletes %v, want calico-node-1 only", got)
	}
	// After the cooldown: the second attempt, on the replacement; it
	// fails in turn and the target escalates.
	h.clock.Step(time.Hour)
	if d := decisionFor(h.cycle(e), target); d.Outcome != OutcomeExecuted {
		t.Fatalf("after the cooldown: %+v", d)
	}
	unready(3)
	h.clock.Step(31 * time.Second)
	if d := decisionFor(h.cycle(e), target); d.Phase != PhaseEscalated {
		t.Fatalf("want escalation: %+v", d)
	}
	h.clock.Step(2 * time.Hour)
	if d := decisionFor(h.cycle(e), target); d.Outcome != OutcomeBlocked || d.Guardrail != guardrails.GuardEscalation {
		t.Fatalf("escalated target: %+v", d)
	}
	if got := deletes(); len(got) != 2 || got[1] != "calico-node-2" {
		t.Fatalf("deletes %v, want calico-node-1, calico-node-2", got)
	}
	recs, err := journal.ReadAll(h.dir)
	if err != nil {
		t.Fatal(err)
	}
	var kinds []string
	for _, r := range recs {
		kinds = append(kinds, r.Kind)
		if r.Target != target {
			t.Errorf("journal record on %s: %+v", r.Target, r)
		}
	}
	if k := strings.Join(kinds, ","); k != "intent,outcome,intent,outcome,escalated" {
		t.Errorf("journal kinds %s", k)
	}
}
