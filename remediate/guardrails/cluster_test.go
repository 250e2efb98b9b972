package guardrails

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/remediate-dev/remediate/internal/cluster"
	"github.com/remediate-dev/remediate/internal/finding"
	"github.com/remediate-dev/remediate/policy"
)

func req(rule, target, action string, disruptive, dry bool, now time.Time) *Request {
	return &Request{Rule: &policy.Rule{Name: rule}, ActionType: action, Disruptive: disruptive,
		Finding: finding.Finding{Target: target}, DryRun: dry, Now: now}
}

type fakeView struct{ f cluster.Freshness }

func (v fakeView) Services() []cluster.Service              { return nil }
func (v fakeView) Endpoints(_, _ string) []cluster.Endpoint { return nil }
func (v fakeView) Freshness() cluster.Freshness             { return v.f }

func TestFreshness(t *testing.T) {
	now := time.Date(2026, 11, 21, 12, 0, 0, 0, time.UTC)
	fresh := cluster.Freshness{Synced: true, Connected: true, LastEvent: now}
	down := cluster.Freshness{Synced: true, Connected: false, LastError: errors.New("connection refused"), LastErrorTime: now.Add(-20 * time.Second)}
	for _, tc := range []struct {
		name       string
		view       cluster.View
		action     string
		disruptive bool
		needsAPI   bool   // the action's declaration (action.NeedsAPI)
		want       string // "" allowed, else substring of the reason
	}{
		{"node-local passes without access", nil, "KillProcess", false, false, ""},
		{"api action without access", nil, "CordonNode", false, true, "needs the Kubernetes API: no cluster access: not in a pod"},
		{"disruptive without access", nil, "Whatever", true, false, "no cluster access"},
		{"unsynced", fakeView{cluster.Freshness{Connected: true}}, "RestartKubeProxy", true, true, "not synced"},
		{"disconnected", fakeView{down}, "RestartKubeProxy", true, true, "API server unreachable (last error 20s ago): connection refused"},
		{"declared api action while down", fakeView{down}, "AnyName", false, true, "needs a fresh cluster view: API server unreachable"},
		{"node-local while down", fakeView{down}, "RaiseConntrackMax", false, false, ""},
		// The guard reads the declaration, not the name: a type named as
		// an API action that does not declare it passes.
		{"undeclared passes whatever its name", fakeView{down}, "FlushConntrack", false, false, ""},
		{"fresh", fakeView{fresh}, "RestartKubeProxy", true, true, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var g *Freshness
			if tc.view == nil {
				g = NewFreshness(nil, "no cluster access: not in a pod")
			} else {
				g = NewFreshness(tc.view, "")
			}
			r := req("r", "t", tc.action, tc.disruptive, false, now)
			r.NeedsAPI = tc.needsAPI
			err := g.Check(context.Background(), r)
			if tc.want == "" {
				if err != nil {
					t.Fatalf("blocked: %v", err)
				}
				return
			}
			var b *Blocked
			if !errors.As(err, &b) || !strings.Contains(b.Reason, tc.want) {
				t.Fatalf("got %v, want reason containing %q", err, tc.want)
			}
		})
	}
}

func TestBudgetFakeClient(t *testing.T) {
	ctx := context.Background()
	cs := fake.NewClientset()
	clk := clocktesting.NewFakeClock(time.Date(2026, 11, 21, 12, 0, 0, 0, time.UTC))
	mk := func(node string) *Budget {
		return NewBudget(cs, BudgetOptions{Namespace: "remediate", Slots: 2, TTL: time.Minute, Node: node, Clock: clk})
	}
	a, b, c := mk("a"), mk("b"), mk("c")
	now := clk.Now()
	if err := a.Check(ctx, req("r", "t", "X", false, false, now)); err != nil || len(a.Held()) != 0 {
		t.Fatalf("non-disruptive took a slot: %v %v", err, a.Held())
	}
	if err := a.Check(ctx, req("r", "t", "X", true, true, now)); err != nil || len(a.Held()) != 0 {
		t.Fatalf("dry run took a slot: %v %v", err, a.Held())
	}
	if err := a.Check(ctx, req("r", "t", "X", true, false, now)); err != nil {
		t.Fatal(err)
	}
	if err := b.Check(ctx, req("r", "t", "X", true, false, now)); err != nil {
		t.Fatal(err)
	}
	err := c.Check(ctx, req("r", "t", "X", true, false, now))
	var bl *Blocked
	if !errors.As(err, &bl) || !strings.Contains(bl.Reason, "all 2 cluster-wide") || !strings.Contains(bl.Reason, "a (r on t)") {
		t.Fatalf("third holder: %v", err)
	}
	if err := c.Check(ctx, req("r", "t", "X", true, true, now)); !errors.As(err, &bl) || !strings.Contains(bl.Reason, "would block") {
		t.Fatalf("dry run on full budget: %v", err)
	}
	// Release frees a slot for c.
	a.Release(ctx, req("r", "t", "X", true, false, now))
	if err := c.Check(ctx, req("r", "t", "X", true, false, now)); err != nil {
		t.Fatalf("after release: %v", err)
	}
	// b crashes (never renews); c renews. b's slot is free TTL after a
	// (the taker) first saw b's last renewal, not by b's renewTime: a, which
	// never looked at it before, waits a full TTL from its first look.
	clk.Step(40 * time.Second)
	c.Renew(ctx)
	if err := a.Check(ctx, req("r", "t2", "X", true, false, clk.Now())); err == nil {
		t.Fatal("a took a slot it had never seen renewed")
	}
	clk.Step(30 * time.Second)
	c.Renew(ctx)
	if err := a.Check(ctx, req("r", "t2", "X", true, false, clk.Now())); err == nil {
		t.Fatal("a took b's slot 30s after first seeing it (TTL 1m)")
	}
	clk.Step(30 * time.Second)
	if err := a.Check(ctx, req("r", "t2", "X", true, false, clk.Now())); err != nil {
		t.Fatalf("crashed holder's slot did not expire: %v", err)
	}
	if err := mk("d").Check(ctx, req("r", "t", "X", true, false, clk.Now())); err == nil {
		t.Fatal("renewed slot was taken")
	}
	// No access: blocked.
	if err := NewBudget(nil, BudgetOptions{}).Check(ctx, req("r", "t", "X", true, false, now)); err == nil {
		t.Fatal("no access allowed a disruptive action")
	}
}

func TestStormVerdict(t *testing.T) {
	for _, tc := range []struct {
		live, affected int
		storm          bool
	}{
		{1, 1, false}, {2, 2, false}, {3, 1, false}, {3, 2, true}, {4, 1, false}, {2, 1, false}, {10, 3, false}, {10, 4, true}, {100, 30, false}, {100, 31, true},
	} {
		got := StormVerdict(tc.live, tc.affected, 0.3, 3) != ""
		if got != tc.storm {
			t.Errorf("live=%d affected=%d: storm=%v want %v", tc.live, tc.affected, got, tc.storm)
		}
	}
}

// TestStormVerdictShare: the reason's share is never rounded onto the
// threshold it is said to be above (61 of 200 read "(30%) ... above the 30%").
func TestStormVerdictShare(t *testing.T) {
	for _, tc := range []struct {
		live, affected int
		want           string
	}{
		{200, 61, "61 of 200 nodes (30.5%) report it at once, above the 30% storm threshold"},
		{10, 4, "4 of 10 nodes (40%) report it at once, above the 30% storm threshold"},
		{3, 2, "2 of 3 nodes (66.7%) report it at once, above the 30% storm threshold"},
		{10000, 3001, "3001 of 10000 nodes (30.01%) report it at once, above the 30% storm threshold"},
	} {
		if got := StormVerdict(tc.live, tc.affected, 0.3, 3); got != tc.want {
			t.Errorf("live=%d affected=%d:\n got %s\nwant %s", tc.live, tc.affected, got, tc.want)
		}
	}
}

func TestStormFakeClient(t *testing.T) {
	ctx := context.Background()
	cs := fake.NewClientset()
	clk := clocktesting.NewFakeClock(time.Date(2026, 11, 21, 12, 0, 0, 0, time.UTC))
	guards := map[string]*Storm{}
	for _, n := range []string{"n1", "n2", "n3", "n4", "n5"} {
		// ListTTL -1: each Check lists (the fake clock does not move
		// between a Publish and the Check that must see it).
		guards[n] = NewStorm(cs, StormOptions{Namespace: "remediate", Node: n, TTL: time.Minute, ListTTL: -1, Clock: clk})
		if err := guards[n].Publish(ctx, nil); err != nil {
			t.Fatal(err)
		}
	}
	r := req("restart-kube-proxy", "kube-proxy/IPv4", "RestartKubeProxy", true, false, clk.Now())
	_ = guards["n2"].Publish(ctx, []string{"restart-kube-proxy"})
	if err := guards["n1"].Check(ctx, r); err != nil { // 2 of 5 = 40% > 30%
		if !strings.Contains(err.Error(), "2 of 5 nodes") {
			t.Fatalf("unexpected: %v", err)
		}
	} else {
		t.Fatal("40% not held back")
	}
	_ = guards["n2"].Publish(ctx, []string{"other"})
	if err := guards["n1"].Check(ctx, r); err != nil { // 1 of 5
		t.Fatalf("single node held back: %v", err)
	}
	// Dead nodes' leases expire and stop counting: n3..n5 silent for 2 min,
	// n1 and n2 republish. Then 2 live nodes < MinNodes: no judgement.
	clk.Step(2 * time.Minute)
	_ = guards["n1"].Publish(ctx, nil)
	_ = guards["n2"].Publish(ctx, []string{"restart-kube-proxy"})
	if err := guards["n1"].Check(ctx, r); err != nil {
		t.Fatalf("dead nodes counted: %v", err)
	}
	// Non-disruptive passes unless AllActions.
	if err := guards["n1"].Check(ctx, req("restart-kube-proxy", "x", "Kill", false, false, clk.Now())); err != nil {
		t.Fatal(err)
	}
}

type nodeSrc struct{ n *corev1.Node }

func (s nodeSrc) Node() (*corev1.Node, bool) { return s.n, s.n != nil }

func TestOptOut(t *testing.T) {
	r := req("r", "t", "KillProcess", false, false, time.Now())
	mkNode := func(l, a map[string]string) *corev1.Node {
		return &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1", Labels: l, Annotations: a}}
	}
	for _, tc := range []struct {
		name string
		src  NodeSource
		want string
	}{
		{"no access", nil, ""},
		{"unknown node", nodeSrc{}, ""},
		{"plain", nodeSrc{mkNode(nil, nil)}, ""},
		{"label", nodeSrc{mkNode(map[string]string{OptOutKey: "true"}, nil)}, "label remediate.dev/opt-out=true"},
		{"annotation", nodeSrc{mkNode(nil, map[string]string{OptOutKey: "maintenance"})}, "annotation remediate.dev/opt-out=maintenance"},
		{"explicit false", nodeSrc{mkNode(map[string]string{OptOutKey: "false"}, nil)}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := NewOptOut(tc.src).Check(context.Background(), r)
			if tc.want == "" && err != nil || tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)) {
				t.Fatalf("got %v want %q", err, tc.want)
			}
		})
	}
}

func TestBudgetSlotNoLongerOursIsNotTrusted(t *testing.T) {
	ctx := context.Background()
	cs := fake.NewClientset()
	clk := clocktesting.NewFakeClock(time.Date(2026, 11, 21, 12, 0, 0, 0, time.UTC))
	mk := func(node string) *Budget {
		return NewBudget(cs, BudgetOptions{Namespace: "remediate", Slots: 1, TTL: time.Minute, MaxHold: 2 * time.Minute, Node: node, Clock: clk})
	}
	a, d := mk("a"), mk("d")
	if err := a.Check(ctx, req("r", "t", "X", true, false, clk.Now())); err != nil {
		t.Fatal(err)
	}
	// a keeps renewing until maxHold, then lets the slot expire; d, asking
	// every 30s meanwhile, takes it a TTL after it saw the last renewal.
	for i := range 6 {
		clk.Step(30 * time.Second)
		a.Renew(ctx)
		if i < 4 { // renewed at 30s .. 2m (maxHold)
			if err := d.Check(ctx, req("r2", "t2", "X", true, false, clk.Now())); err == nil {
				t.Fatal("d took a renewed slot")
			}
		}
	}
	clk.Step(2 * time.Minute)
	if err := d.Check(ctx, req("r2", "t2", "X", true, false, clk.Now())); err != nil {
		t.Fatalf("expired slot not free for d: %v", err)
	}
	// a asks again for the same (rule, target): the only slot is d's.
	err := a.Check(ctx, req("r", "t", "X", true, false, clk.Now()))
	var bl *Blocked
	if !errors.As(err, &bl) || !strings.Contains(bl.Reason, "all 1 cluster-wide") {
		t.Fatalf("a was allowed on a slot it no longer holds: %v", err)
	}
	// Once d releases, a can take it for real.
	d.Release(ctx, req("r2", "t2", "X", true, false, clk.Now()))
	if err := a.Check(ctx, req("r", "t", "X", true, false, clk.Now())); err != nil || len(a.Held()) != 1 {
		t.Fatalf("after d released: %v %v", err, a.Held())
	}
}

// TestStormPublishUpdatesWithoutReading: a renewal is one UPDATE of the
// Lease last written, not a GET and an UPDATE (0.54 GETs a minute per
// node in bench-fleet); the Lease read again only the first time and when
// it is gone (re-created), with the firing rules and renewal time right.
func TestStormPublishUpdatesWithoutReading(t *testing.T) {
	ctx := context.Background()
	cs := fake.NewClientset()
	clk := clocktesting.NewFakeClock(time.Date(2026, 11, 21, 12, 0, 0, 0, time.UTC))
	g := NewStorm(cs, StormOptions{Namespace: "remediate", Node: "n1", Clock: clk})
	verbs := func() map[string]int {
		m := map[string]int{}
		for _, a := range cs.Actions() {
			if a.GetResource().Resource == "leases" {
				m[a.GetVerb()]++
			}
		}
		return m
	}
	for i := 0; i < 20; i++ { // 10 minutes of 30 s cycles: renewed every 100 s
		firing := []string(nil)
		if i == 7 {
			firing = []string{"r"} // a change: written at once
		}
		if err := g.Publish(ctx, firing); err != nil {
			t.Fatal(err)
		}
		clk.Step(30 * time.Second)
	}
	if v := verbs(); v["get"] != 1 || v["create"] != 1 || v["update"] != 5 {
		t.Fatalf("lease requests over 10 minutes: %v, want 1 get, 1 create, 5 updates", v)
	}
	if err := cs.CoordinationV1().Leases("remediate").Delete(ctx, StatusLeaseName("n1"), metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	clk.Step(2 * time.Minute)
	if err := g.Publish(ctx, []string{"x"}); err != nil {
		t.Fatal(err)
	}
	if v := verbs(); v["get"] != 2 || v["create"] != 2 || v["update"] != 6 {
		t.Fatalf("after the Lease was deleted: %v, want the update, a get and a create", v)
	}
	l, err := cs.CoordinationV1().Leases("remediate").Get(ctx, StatusLeaseName("n1"), metav1.GetOptions{})
	if err != nil || l.Annotations[AnnotationFiring] != `["x"]` || !l.Spec.RenewTime.Time.Equal(clk.Now()) || l.Labels[LabelLease] != LeaseNodeStatus {
		t.Fatalf("lease %+v %v", l, err)
	}
}

// TestStormKeepsItsList: the node-status Leases listed for one Check serve
// the checks of the next ListTTL (an empty list too), then are listed
// again; ListTTL < 0 lists on every Check.
func TestStormKeepsItsList(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		name    string
		publish bool
		ttl     time.Duration
		want    []int // LISTs after each step
	}{
		{"no Leases yet", false, 0, []int{1, 1, 1, 2}},
		{"Leases", true, 0, []int{1, 1, 1, 2}},
		{"ListTTL -1", true, -1, []int{1, 2, 3, 4}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cs := fake.NewClientset()
			clk := clocktesting.NewFakeClock(time.Date(2026, 11, 28, 3, 0, 0, 0, time.UTC))
			g := NewStorm(cs, StormOptions{Namespace: "remediate", Node: "n1", ListTTL: tc.ttl, Clock: clk})
			if tc.publish {
				if err := g.Publish(ctx, []string{"r"}); err != nil {
					t.Fatal(err)
				}
			}
			lists := func() int {
				n := 0
				for _, a := range cs.Actions() {
					if a.GetVerb() == "list" {
						n++
					}
				}
				return n
			}
			r := req("r", "t", "RestartKubeProxy", true, false, clk.Now())
			for i, step := range []time.Duration{0, time.Second, DefaultStormListTTL - time.Second - time.Nanosecond, time.Nanosecond} {
				clk.Step(step)
				if err := g.Check(ctx, r); err != nil {
					t.Fatal(err)
				}
				if got := lists(); got != tc.want[i] {
					t.Fatalf("after check %d (+%v): %d LISTs, want %d", i, step, got, tc.want[i])
				}
			}
		})
	}
}
