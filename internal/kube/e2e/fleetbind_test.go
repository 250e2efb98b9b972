package e2e

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap/zaptest"
	coordv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/clock"
	"k8s.io/utils/ptr"

	"github.com/remediate-dev/remediate/internal/testing/controlplane"
	"github.com/remediate-dev/remediate/internal/testing/deploytest"
	"github.com/remediate-dev/remediate/remediate/exporters/fleetview"
	"github.com/remediate-dev/remediate/remediate/exporters/kubeexporter"
	"github.com/remediate-dev/remediate/remediate/guardrails"
)

// The admission policy's refusals (deploy/base/admission.yaml).
const (
	holderMsg   = "may write a Lease only with its own node as the holder"
	labelMsg    = "Leases carry the label remediate.dev/lease of their kind"
	durationMsg = "Lease duration must be between 1s and 24h"
	aheadMsg    = "more than a minute after the apiserver's time"
	eventMsg    = "may write only Events about its own Node"
)

// TestOneNodeCannotReachTheFleet (issue 38, "one node reaches the fleet";
// issue 39 part 5): with the enforce overlay's RBAC and admission policy
// on the real kube-apiserver, the daemon on fb-1 (a real pod-bound
// ServiceAccount token, the node name put in by the apiserver) cannot
// write a Lease or an Event that speaks for fb-2, and what it can still
// write (its own Leases, with a clock that runs ahead, or a renewTime in
// 2099) holds no slot and counts in no storm beyond one Lease duration of
// the other nodes' observation.
//
//   - leases: another node as holder, another node's status Lease, a
//     release of another node's slot, a renewal of another node's slot, a
//     create renewed in 2099, a duration of 10^7 s, a budget Lease
//     labelled as node status: refused; the daemon's own code (Budget's
//     take, renew and release; Storm's Publish) goes through.
//   - events: an Event about fb-2, or about fb-1 reported as fb-2, through
//     events.k8s.io or the core API, and a patch of fb-2's own Event:
//     refused; the Reporter's Event and its series go through. The fleet
//     view does not show an Event about fb-2 reported by fb-1 (written by
//     someone the policy does not bind) as fb-2's action.
//   - skewed-clock: fb-2's daemon, its clock a day ahead, never takes the
//     slot fb-1 holds and renews; it takes it only after fb-1 stopped
//     renewing and the Lease's duration passed; it cannot create a slot
//     Lease at all (admission: its times are ahead of the apiserver's).
//   - forged-2099: fb-1 renews its slot and its node-status Lease with
//     renewTime 2099 (an update: the policy sees no time there): fb-2
//     takes the slot one Lease duration after it first saw the forged
//     renewal, and the storm guard stops counting fb-1 as live then.
func TestOneNodeCannotReachTheFleet(t *testing.T) {
	cp := controlplane.Start(t, controlplane.Options{})
	ctx := context.Background()
	if _, err := cp.Client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: deploytest.Namespace}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	for _, n := range []string{"fb-1", "fb-2"} {
		mkNode(t, cp.Client, n)
	}
	deploytest.ApplyOverlay(t, cp, "enforce", false)
	n1 := kubernetes.NewForConfigOrDie(deploytest.AsBoundPod(t, cp, deploytest.Namespace, "remediate", "fb-1"))
	n2 := kubernetes.NewForConfigOrDie(deploytest.AsBoundPod(t, cp, deploytest.Namespace, "remediate", "fb-2"))
	// The policy takes a moment to be enforced after its creation (waited
	// for with a refusal older than this test's, so that on a policy
	// without the bindings every subtest still runs and fails).
	waitFor(t, 30*time.Second, "the admission policy", func() (bool, string) {
		_, err := n1.CoordinationV1().Leases(deploytest.Namespace).Create(ctx, slotLease("not-remediates", "fb-1", time.Now(), 60),
			metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		return err != nil && strings.Contains(err.Error(), "remediate may write only its own Leases"), fmt.Sprint(err)
	})
	t.Run("leases", func(t *testing.T) { testLeaseBinding(t, n1, n2) })
	t.Run("events", func(t *testing.T) { testEventBinding(t, cp, n1, n2) })
	t.Run("skewed-clock", func(t *testing.T) { testSkewedContender(t, n1, n2) })
	t.Run("forged-2099", func(t *testing.T) { testForged2099(t, n1, n2) })
}

// slotLease is a budget slot Lease as guardrails.Budget writes it.
func slotLease(name, holder string, renew time.Time, seconds int32) *coordv1.Lease {
	mt := metav1.NewMicroTime(renew)
	return &coordv1.Lease{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: deploytest.Namespace,
			Labels: map[string]string{guardrails.LabelLease: guardrails.LeaseBudget}},
		Spec: coordv1.LeaseSpec{HolderIdentity: ptr.To(holder), LeaseDurationSeconds: ptr.To(seconds),
			AcquireTime: &mt, RenewTime: &mt},
	}
}

func wantDenied(t *testing.T, what string, err error, msg string) {
	t.Helper()
	if err == nil || !strings.Contains(err.Error(), msg) {
		t.Errorf("%s: %v, want refused with %q", what, err, msg)
	}
}

func testLeaseBinding(t *testing.T, n1, n2 kubernetes.Interface) {
	ctx := context.Background()
	l1 := n1.CoordinationV1().Leases(deploytest.Namespace)
	dry := metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}}
	now := time.Now()
	create := func(l *coordv1.Lease) error { _, err := l1.Create(ctx, l, dry); return err }

	wantDenied(t, "fb-1 creates a slot held by fb-2", create(slotLease("remediate-budget-x-0", "fb-2", now, 600)), holderMsg)
	status := slotLease(guardrails.StatusLeaseName("fb-1"), "fb-2", now, 300)
	status.Labels[guardrails.LabelLease] = guardrails.LeaseNodeStatus
	wantDenied(t, "fb-1 writes its status Lease in fb-2's name", create(status), holderMsg)
	wantDenied(t, "fb-1 creates its slot renewed in 2099", create(slotLease("remediate-budget-x-0", "fb-1", time.Date(2099, 1, 1, 0, 0, 0, 0, time.UTC), 600)), aheadMsg)
	wantDenied(t, "fb-1 creates its slot renewed a day ahead", create(slotLease("remediate-budget-x-0", "fb-1", now.Add(24*time.Hour), 600)), aheadMsg)
	wantDenied(t, "fb-1 creates a slot for 10^7 s", create(slotLease("remediate-budget-x-0", "fb-1", now, 10_000_000)), durationMsg)
	mislabelled := slotLease("remediate-budget-x-0", "fb-1", now, 600)
	mislabelled.Labels[guardrails.LabelLease] = guardrails.LeaseNodeStatus
	wantDenied(t, "fb-1 creates a slot labelled as node status (counted by the storm guard)", create(mislabelled), labelMsg)
	if err := create(slotLease("remediate-budget-x-0", "fb-1", now, 600)); err != nil {
		t.Errorf("fb-1 creating its own slot: %v", err)
	}

	// The daemon's own code, with the bound token.
	const prefix = "remediate-budget-bind"
	b1 := guardrails.NewBudget(n1, guardrails.BudgetOptions{Namespace: deploytest.Namespace, Node: "fb-1", Slots: 1, TTL: time.Minute, Prefix: prefix})
	r := restartReq("fb-1")
	if err := b1.Check(ctx, r); err != nil {
		t.Fatalf("fb-1's budget taking a slot: %v", err)
	}
	b1.Renew(ctx)
	l2 := n2.CoordinationV1().Leases(deploytest.Namespace)
	held, err := l2.Get(ctx, prefix+"-0", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if !held.Spec.RenewTime.After(held.Spec.AcquireTime.Time) {
		t.Errorf("fb-1's renewal did not go through: acquired %v, renewed %v", held.Spec.AcquireTime, held.Spec.RenewTime)
	}
	upd := metav1.UpdateOptions{DryRun: []string{metav1.DryRunAll}}
	release := held.DeepCopy()
	release.Spec.HolderIdentity, release.Spec.RenewTime, release.Spec.AcquireTime = nil, nil, nil
	_, err = l2.Update(ctx, release, upd)
	wantDenied(t, "fb-2 releases fb-1's slot", err, holderMsg)
	renew := held.DeepCopy()
	renew.Spec.RenewTime = &metav1.MicroTime{Time: time.Date(2099, 1, 1, 0, 0, 0, 0, time.UTC)}
	_, err = l2.Update(ctx, renew, upd)
	wantDenied(t, "fb-2 renews fb-1's slot into 2099", err, holderMsg)
	b1.Release(ctx, r)
	if l, err := l2.Get(ctx, prefix+"-0", metav1.GetOptions{}); err != nil || holderOf(l) != "" {
		t.Errorf("fb-1's release did not go through: holder %q, %v", holderOf(l), err)
	}
	if err := guardrails.NewStorm(n1, guardrails.StormOptions{Namespace: deploytest.Namespace, Node: "fb-1"}).Publish(ctx, []string{"rule-a"}); err != nil {
		t.Errorf("fb-1's node-status Lease: %v", err)
	}
}

// nodeEvent is an Event about node as kubeexporter writes it, reported as
// instanceOf's daemon.
func nodeEvent(name, node, instanceOf string) *eventsv1.Event {
	const ctl = "remediate.dev/remediate"
	return &eventsv1.Event{
		ObjectMeta:          metav1.ObjectMeta{Name: name, Namespace: "kube-system"},
		EventTime:           metav1.NewMicroTime(time.Now()),
		ReportingController: ctl, ReportingInstance: kubeexporter.ReportingInstance(ctl, instanceOf),
		Action: "CordonNode", Reason: kubeexporter.ReasonExecuted, Type: corev1.EventTypeNormal,
		Note:      "rule r, target " + node + ": cordoned",
		Regarding: corev1.ObjectReference{Kind: "Node", APIVersion: "v1", Name: node, UID: types.UID(node)},
	}
}

func testEventBinding(t *testing.T, cp *controlplane.ControlPlane, n1, n2 kubernetes.Interface) {
	ctx := context.Background()
	ev1 := n1.EventsV1().Events("kube-system")
	_, err := ev1.Create(ctx, nodeEvent("forged-1", "fb-2", "fb-2"), metav1.CreateOptions{})
	wantDenied(t, "fb-1 creates an Event about fb-2", err, eventMsg)
	_, err = ev1.Create(ctx, nodeEvent("forged-2", "fb-1", "fb-2"), metav1.CreateOptions{})
	wantDenied(t, "fb-1 creates an Event about itself reported as fb-2", err, eventMsg)

	// The Reporter's own Events and series, with the bound tokens.
	rep := func(cs kubernetes.Interface, node string) *kubeexporter.Reporter {
		return kubeexporter.New(cs, kubeexporter.Options{Node: node, SeriesInterval: time.Nanosecond, Log: zaptest.NewLogger(t)})
	}
	r1, r2 := rep(n1, "fb-1"), rep(n2, "fb-2")
	for i := range 2 { // the second is the series' patch
		if err := r1.Emit(ctx, "k", corev1.EventTypeNormal, kubeexporter.ReasonExecuted, "RestartKubeProxy", "restarted"); err != nil {
			t.Fatalf("fb-1's Reporter, Event %d: %v", i, err)
		}
	}
	if err := r2.Emit(ctx, "k", corev1.EventTypeNormal, kubeexporter.ReasonExecuted, "RestartKubeProxy", "restarted"); err != nil {
		t.Fatalf("fb-2's Reporter: %v", err)
	}
	l, err := cp.Client.EventsV1().Events("kube-system").List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var fb2 string
	for _, e := range l.Items {
		if e.Regarding.Name == "fb-2" {
			fb2 = e.Name
		}
	}
	if fb2 == "" {
		t.Fatal("fb-2's Reporter wrote no Event")
	}
	_, err = ev1.Patch(ctx, fb2, types.MergePatchType, []byte(`{"series":{"count":99,"lastObservedTime":"2099-01-01T00:00:00.000000Z"}}`), metav1.PatchOptions{})
	wantDenied(t, "fb-1 patches fb-2's Event", err, eventMsg)

	// Through the core API (the same storage): granted here for the test
	// (the shipped RBAC refuses core Event writes), refused by the policy.
	// The core API keeps an Event about a cluster-scoped object in default.
	role := &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Name: "test-core-events", Namespace: "default"},
		Rules: []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"events"}, Verbs: []string{"create"}}}}
	rb := &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "test-core-events", Namespace: "default"},
		RoleRef:  rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "Role", Name: role.Name},
		Subjects: []rbacv1.Subject{{Kind: "ServiceAccount", Name: "remediate", Namespace: deploytest.Namespace}}}
	if _, err := cp.Client.RbacV1().Roles("default").Create(ctx, role, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := cp.Client.RbacV1().RoleBindings("default").Create(ctx, rb, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	defer func() {
		_ = cp.Client.RbacV1().RoleBindings("default").Delete(ctx, rb.Name, metav1.DeleteOptions{})
		_ = cp.Client.RbacV1().Roles("default").Delete(ctx, role.Name, metav1.DeleteOptions{})
	}()
	core := func(name, node string) error {
		_, err := n1.CoreV1().Events("default").Create(ctx, &corev1.Event{
			ObjectMeta:     metav1.ObjectMeta{Name: name, Namespace: "default"},
			InvolvedObject: corev1.ObjectReference{Kind: "Node", APIVersion: "v1", Name: node, UID: types.UID(node)},
			Reason:         kubeexporter.ReasonExecuted, Message: "cordoned", Type: corev1.EventTypeNormal,
			Source: corev1.EventSource{Component: "remediate.dev/remediate"}}, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		return err
	}
	waitFor(t, 30*time.Second, "the test's core Event grant", func() (bool, string) {
		err := core("core-wait", "fb-2")
		return err == nil || !strings.Contains(err.Error(), "cannot create resource"), fmt.Sprint(err)
	})
	wantDenied(t, "fb-1 creates a core Event about fb-2", core("core-forged", "fb-2"), eventMsg)

	// The fleet view: an Event about fb-2 that fb-1's daemon reported,
	// written by someone the policy does not bind (here the admin), is not
	// fb-2's last action; fb-1's own is fb-1's.
	if _, err := cp.Client.EventsV1().Events("kube-system").Create(ctx, nodeEvent("forged-admin", "fb-2", "fb-1"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	f, _, err := fleetview.Collect(ctx, cp.Client, fleetview.CollectOptions{Options: fleetview.Options{Namespace: deploytest.Namespace}}, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range f.Nodes {
		switch {
		case n.Name == "fb-2" && (n.LastAction == nil || n.LastAction.Action != "RestartKubeProxy"):
			t.Errorf("fleet view: fb-2's last action %+v, want its own RestartKubeProxy (not the CordonNode fb-1 reported)", n.LastAction)
		case n.Name == "fb-1" && (n.LastAction == nil || n.LastAction.Action != "RestartKubeProxy" || n.LastAction.Count != 2):
			t.Errorf("fleet view: fb-1's last action %+v, want its RestartKubeProxy x2", n.LastAction)
		}
	}
}

// skewedClock is a node's clock whose wall time runs ahead by skew (its
// monotonic reading, as a real node's, is unaffected).
type skewedClock struct {
	clock.RealClock
	skew time.Duration
}

func (c skewedClock) Now() time.Time { return time.Now().Add(c.skew) }

func testSkewedContender(t *testing.T, n1, n2 kubernetes.Interface) {
	const (
		prefix = "remediate-budget-skew"
		ttl    = 3 * time.Second
	)
	ctx := context.Background()
	holder := guardrails.NewBudget(n1, guardrails.BudgetOptions{Namespace: deploytest.Namespace, Node: "fb-1", Slots: 1, TTL: ttl, Prefix: prefix})
	if err := holder.Check(ctx, restartReq("fb-1")); err != nil {
		t.Fatalf("fb-1 taking the slot: %v", err)
	}
	hctx, stop := context.WithCancel(ctx)
	renewing := make(chan struct{})
	go func() { defer close(renewing); holder.Run(hctx) }()
	ahead := guardrails.NewBudget(n2, guardrails.BudgetOptions{Namespace: deploytest.Namespace, Node: "fb-2", Slots: 1, TTL: ttl, Prefix: prefix,
		Clock: skewedClock{skew: 24 * time.Hour}})
	// fb-1 renews every TTL/3; fb-2, a day ahead, asks every 100 ms for
	// three Lease durations: the slot is live all along.
	checks := 0
	for end := time.Now().Add(3 * ttl); time.Now().Before(end); time.Sleep(100 * time.Millisecond) {
		checks++
		err := ahead.Check(ctx, restartReq("fb-2"))
		var b *guardrails.Blocked
		if !errors.As(err, &b) || b.Guardrail != guardrails.GuardBudget {
			stop()
			t.Fatalf("check %d: fb-2, its clock a day ahead, got %v on the slot fb-1 holds and renews every %v, want blocked", checks, err, ttl/3)
		}
	}
	stop()
	<-renewing
	l, err := n2.CoordinationV1().Leases(deploytest.Namespace).Get(ctx, prefix+"-0", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if holderOf(l) != "fb-1" {
		t.Fatalf("slot holder %q after fb-1's renewals, want fb-1", holderOf(l))
	}
	lastRenewal := l.Spec.RenewTime.Time // fb-1's clock is this machine's
	var took time.Time
	for end := time.Now().Add(ttl + 5*time.Second); time.Now().Before(end); time.Sleep(100 * time.Millisecond) {
		if err := ahead.Check(ctx, restartReq("fb-2")); err == nil {
			took = time.Now()
			break
		}
	}
	if took.IsZero() {
		t.Fatalf("fb-2 did not take the slot within %v of fb-1's last renewal", ttl+5*time.Second)
	}
	if took.Before(lastRenewal.Add(ttl)) {
		t.Errorf("fb-2 took the slot at %s, before it expired (last renewal %s + %v)", took.Format(time.StampMicro), lastRenewal.Format(time.StampMicro), ttl)
	}
	t.Logf("fb-2 (a day ahead): %d checks blocked while fb-1 renewed; took the slot %v after it expired", checks, took.Sub(lastRenewal.Add(ttl)).Round(time.Millisecond))
	// With its clock ahead it cannot create a slot Lease: it fails closed.
	fresh := guardrails.NewBudget(n2, guardrails.BudgetOptions{Namespace: deploytest.Namespace, Node: "fb-2", Slots: 1, TTL: ttl, Prefix: "remediate-budget-skew-new",
		Clock: skewedClock{skew: 24 * time.Hour}})
	if err := fresh.Check(ctx, restartReq("fb-2")); err == nil || !strings.Contains(err.Error(), aheadMsg) {
		t.Errorf("fb-2, a day ahead, creating a slot Lease: %v, want refused with %q", err, aheadMsg)
	}
}

func testForged2099(t *testing.T, n1, n2 kubernetes.Interface) {
	const (
		prefix = "remediate-budget-forged"
		ttl    = 3 * time.Second
		rule   = "kube-proxy-sync-stale"
	)
	ctx := context.Background()
	l1 := n1.CoordinationV1().Leases(deploytest.Namespace)
	in2099 := metav1.NewMicroTime(time.Date(2099, 1, 1, 0, 0, 0, 0, time.UTC))
	// fb-1 creates its slot (now), then renews it into 2099: the update
	// carries no time of the apiserver's for the policy to compare with.
	l, err := l1.Create(ctx, slotLease(prefix+"-0", "fb-1", time.Now(), int32(ttl/time.Second)), metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	l.Spec.RenewTime = &in2099
	if _, err := l1.Update(ctx, l, metav1.UpdateOptions{}); err != nil {
		t.Fatalf("fb-1 renewing its own slot into 2099: %v", err)
	}
	if err := guardrails.NewStorm(n1, guardrails.StormOptions{Namespace: deploytest.Namespace, Node: "fb-1", TTL: ttl}).Publish(ctx, []string{rule}); err != nil {
		t.Fatal(err)
	}
	sl, err := l1.Get(ctx, guardrails.StatusLeaseName("fb-1"), metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	sl.Spec.RenewTime = &in2099
	if _, err := l1.Update(ctx, sl, metav1.UpdateOptions{}); err != nil {
		t.Fatalf("fb-1 renewing its node-status Lease into 2099: %v", err)
	}

	b2 := guardrails.NewBudget(n2, guardrails.BudgetOptions{Namespace: deploytest.Namespace, Node: "fb-2", Slots: 1, TTL: ttl, Prefix: prefix})
	storm := guardrails.NewStorm(n2, guardrails.StormOptions{Namespace: deploytest.Namespace, Node: "fb-2", MinNodes: 2, MaxShare: 0.3, TTL: ttl, ListTTL: -1})
	start := time.Now()
	storming := func() bool {
		err := storm.Check(ctx, restartReq("fb-2"))
		var b *guardrails.Blocked
		if err != nil && !(errors.As(err, &b) && b.Guardrail == guardrails.GuardStorm) {
			t.Fatalf("storm check: %v", err)
		}
		return err != nil
	}
	if !storming() {
		t.Fatal("fb-1's firing Lease, just seen, is not counted: 2 of 2 nodes firing should be a storm")
	}
	var took, calm time.Time
	for end := start.Add(ttl + 7*time.Second); time.Now().Before(end) && (took.IsZero() || calm.IsZero()); time.Sleep(100 * time.Millisecond) {
		if took.IsZero() && b2.Check(ctx, restartReq("fb-2")) == nil {
			took = time.Now()
		}
		if calm.IsZero() && !storming() {
			calm = time.Now()
		}
	}
	if took.IsZero() {
		t.Errorf("a slot renewed in 2099 is still held %v after fb-2 first saw it (Lease duration %v): the fleet's disruptive actions are frozen", time.Since(start).Round(time.Millisecond), ttl)
	} else if took.Sub(start) < ttl-200*time.Millisecond {
		t.Errorf("fb-2 took the slot %v after first seeing its renewal, before one Lease duration (%v)", took.Sub(start), ttl)
	}
	if calm.IsZero() {
		t.Errorf("fb-1's node-status Lease renewed in 2099 still counts %v after fb-2 first saw it (duration %v)", time.Since(start).Round(time.Millisecond), ttl)
	}
	if took.IsZero() || calm.IsZero() {
		return
	}
	t.Logf("forged 2099: slot free for fb-2 %v, storm vote gone %v after first seen (Lease duration %v)",
		took.Sub(start).Round(time.Millisecond), calm.Sub(start).Round(time.Millisecond), ttl)
}
