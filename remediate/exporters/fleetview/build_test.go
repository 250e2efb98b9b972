package fleetview

import (
	"strings"
	"testing"
	"time"

	coordv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/remediate-dev/remediate/remediate/exporters/kubeexporter"
	"github.com/remediate-dev/remediate/remediate/guardrails"
)

var t0 = time.Date(2026, 11, 25, 12, 0, 0, 0, time.UTC)

func node(name string, st corev1.ConditionStatus, hb time.Time, msg string) corev1.Node {
	n := corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}}
	if st != "" {
		n.Status.Conditions = []corev1.NodeCondition{
			{Type: corev1.NodeReady, Status: corev1.ConditionTrue, LastHeartbeatTime: metav1.NewTime(t0)},
			{Type: kubeexporter.DefaultConditionType, Status: st, Reason: "R", Message: msg,
				LastHeartbeatTime: metav1.NewTime(hb), LastTransitionTime: metav1.NewTime(hb.Add(-time.Hour))}}
	}
	return n
}

func event(nodeName, reason, controller string, at time.Time, series *eventsv1.EventSeries) eventsv1.Event {
	return eventsv1.Event{ObjectMeta: metav1.ObjectMeta{Name: nodeName + reason}, Reason: reason, ReportingController: controller,
		ReportingInstance: kubeexporter.ReportingInstance(controller, nodeName), Action: "RestartKubeProxy", EventTime: metav1.NewMicroTime(at), Series: series,
		Regarding: corev1.ObjectReference{Kind: "Node", Name: nodeName}}
}

func lease(name, kind, holder string, renew time.Time, ann map[string]string) coordv1.Lease {
	mt := metav1.NewMicroTime(renew)
	return coordv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{guardrails.LabelLease: kind}, Annotations: ann},
		Spec: coordv1.LeaseSpec{HolderIdentity: ptr.To(holder), RenewTime: &mt, AcquireTime: &mt, LeaseDurationSeconds: ptr.To(int32(300))}}
}

// Build's rules, one case each: stale past StaleAfter (not at it), a
// missing heartbeat is stale, the newest action Event wins by its series'
// last observation, other controllers' and non-action Events do not
// count, nor an Event about a node reported by another node's daemon, nor
// a node-status Lease under another name than its holder's, an expired
// node-status Lease's firing rules are not shown, an
// expired budget slot is held by nobody, the top finding is the first
// problem of a False condition.
func TestBuild(t *testing.T) {
	const ctl = "remediate.dev/remediate"
	in := Inputs{
		Nodes: []corev1.Node{
			node("b-fresh", corev1.ConditionTrue, t0.Add(-DefaultStaleAfter), ""),
			node("a-stale", corev1.ConditionFalse, t0.Add(-DefaultStaleAfter-time.Second), "r1: t1: m1; r2: t2: m2"),
			node("c-nohb", corev1.ConditionTrue, time.Time{}, ""),
			node("d-none", "", time.Time{}, ""),
		},
		Events: []eventsv1.Event{
			event("a-stale", kubeexporter.ReasonExecuted, ctl, t0.Add(-time.Hour), &eventsv1.EventSeries{Count: 4, LastObservedTime: metav1.NewMicroTime(t0.Add(-time.Minute))}),
			event("a-stale", kubeexporter.ReasonFailed, ctl, t0.Add(-10*time.Minute), nil),
			event("a-stale", kubeexporter.ReasonProblem, ctl, t0, nil),
			event("b-fresh", kubeexporter.ReasonExecuted, "someone-else", t0, nil),
			// Forged by a-stale's daemon (issue 38): about b-fresh, but
			// reported by a-stale.
			func() eventsv1.Event {
				e := event("b-fresh", kubeexporter.ReasonExecuted, ctl, t0, nil)
				e.Action, e.ReportingInstance = "CordonNode", kubeexporter.ReportingInstance(ctl, "a-stale")
				return e
			}(),
		},
		Leases: []coordv1.Lease{
			lease("remediate-node-a-stale", guardrails.LeaseNodeStatus, "a-stale", t0.Add(-time.Minute), map[string]string{guardrails.AnnotationFiring: `["r1"]`}),
			lease("remediate-node-b-fresh", guardrails.LeaseNodeStatus, "b-fresh", t0.Add(-time.Hour), map[string]string{guardrails.AnnotationFiring: `["old"]`}),
			lease("remediate-budget-1", guardrails.LeaseBudget, "b-fresh", t0.Add(-time.Hour), nil),
			lease("remediate-budget-0", guardrails.LeaseBudget, "a-stale", t0.Add(-time.Minute), map[string]string{guardrails.AnnotationRule: "r1"}),
			// Not b-fresh's own node-status Lease: it does not speak for it.
			lease("remediate-node-a-stale-2", guardrails.LeaseNodeStatus, "b-fresh", t0, map[string]string{guardrails.AnnotationFiring: `["forged"]`}),
			// Renewed in 2099 (a clock ahead, or forged): a warning.
			lease("remediate-node-d-none", guardrails.LeaseNodeStatus, "d-none", time.Date(2099, 1, 1, 0, 0, 0, 0, time.UTC), nil),
		},
	}
	f := Build(in, t0, Options{})
	got := map[string]Node{}
	var names []string
	for _, n := range f.Nodes {
		got[n.Name] = n
		names = append(names, n.Name)
	}
	if strings.Join(names, ",") != "a-stale,b-fresh,c-nohb,d-none" {
		t.Errorf("order %v", names)
	}
	a := got["a-stale"]
	if a.Status != "Unknown" || !a.Stale || a.Reported != "False" || a.TopFinding != "r1: t1: m1" {
		t.Errorf("a-stale: %+v", a)
	}
	if a.LastAction == nil || a.LastAction.Outcome != "executed" || a.LastAction.Count != 4 || !a.LastAction.Time.Equal(t0.Add(-time.Minute)) {
		t.Errorf("a-stale last action: %+v", a.LastAction)
	}
	if strings.Join(a.Firing, ",") != "r1" || strings.Join(a.BudgetSlots, ",") != "remediate-budget-0" {
		t.Errorf("a-stale leases: %+v", a)
	}
	b := got["b-fresh"]
	if b.Status != "True" || b.Stale || b.LastAction != nil || len(b.Firing) != 0 || len(b.BudgetSlots) != 0 || b.TopFinding != "" {
		t.Errorf("b-fresh: %+v", b)
	}
	if c := got["c-nohb"]; c.Status != "Unknown" || !c.Stale {
		t.Errorf("c-nohb: %+v", c)
	}
	if d := got["d-none"]; d.Status != StatusNone || d.Stale {
		t.Errorf("d-none: %+v", d)
	}
	if len(f.Budget) != 2 || f.Budget[0].Holder != "a-stale" || f.Budget[0].Rule != "r1" || f.Budget[1].Holder != "" || !f.Budget[1].Expired {
		t.Errorf("budget %+v", f.Budget)
	}
	if f.Pause.Paused {
		t.Error("paused without a ConfigMap")
	}
	if len(f.Warnings) != 1 || !strings.Contains(f.Warnings[0], "Lease remediate-node-d-none (holder d-none) renewed 2099-01-01T00:00:00Z") {
		t.Errorf("warnings %q, want one on the Lease renewed in 2099", f.Warnings)
	}
}

// FuzzBuild: whatever the annotations, messages and times the objects
// carry (they are written by every node's daemon, or anyone with RBAC on
// them), Build does not panic and every row has a known status.
func FuzzBuild(f *testing.F) {
	f.Add(`["r1"]`, "r1: t: m; r2", "pause", int64(0), int64(600))
	f.Add(`{`, "", "", int64(-1<<40), int64(1<<40))
	f.Fuzz(func(t *testing.T, firing, msg, pause string, hbOff, renewOff int64) {
		in := Inputs{
			Nodes:  []corev1.Node{node("n", corev1.ConditionFalse, t0.Add(time.Duration(hbOff)), msg), node("m", corev1.ConditionStatus(msg), t0, msg)},
			Leases: []coordv1.Lease{lease("l", guardrails.LeaseNodeStatus, "n", t0.Add(time.Duration(renewOff)), map[string]string{guardrails.AnnotationFiring: firing})},
			Events: []eventsv1.Event{event("n", kubeexporter.ReasonFailed, "remediate.dev/remediate", t0.Add(time.Duration(hbOff)), nil)},
			Pause:  &corev1.ConfigMap{Data: map[string]string{"pause": pause}},
		}
		for _, n := range Build(in, t0, Options{}).Nodes {
			switch n.Status {
			case "True", "False", "Unknown", StatusNone, msg:
			default:
				t.Fatalf("status %q", n.Status)
			}
		}
	})
}
