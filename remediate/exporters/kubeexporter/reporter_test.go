package kubeexporter

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/remediate-dev/remediate/internal/finding"
	"github.com/remediate-dev/remediate/internal/kube"
	"github.com/remediate-dev/remediate/remediate"
)

func TestReporterFake(t *testing.T) {
	ctx := context.Background()
	cs := fake.NewClientset(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1"}})
	clk := clocktesting.NewFakeClock(time.Date(2026, 11, 21, 12, 0, 0, 0, time.UTC))
	var published []string
	r := New(cs, Options{Node: "n1", Clock: clk, Hysteresis: Hysteresis{ProblemAfter: time.Minute, ClearAfter: 2 * time.Minute},
		Firing: func(_ context.Context, rules []string) error { published = rules; return nil }})
	sick := &remediate.Report{
		Findings:  []remediate.ReportFinding{{Rule: "stale", Finding: finding.Finding{Detector: "KubeProxySyncStale", Target: "kube-proxy/IPv4", Severity: finding.Critical, Message: "no sync for 90s"}}},
		Decisions: []remediate.Decision{{Rule: "stale", Action: "RestartKubeProxy", Target: "kube-proxy/IPv4", Outcome: remediate.OutcomeDryRun, Reason: "audit mode: would delete pod"}},
	}
	for i := 0; i < 3; i++ {
		if err := r.Report(ctx, sick); err != nil {
			t.Fatal(err)
		}
		clk.Step(30 * time.Second)
	}
	if err := r.Flush(ctx); err != nil { // the count is written every 5 minutes, or now
		t.Fatal(err)
	}
	evs, _ := cs.EventsV1().Events("kube-system").List(ctx, metav1.ListOptions{})
	var dry, cond int
	for _, e := range evs.Items {
		switch e.Reason {
		case ReasonDryRun:
			dry++
			if e.Series == nil || e.Series.Count != 3 || e.Regarding.Name != "n1" || e.Type != "Normal" {
				t.Errorf("dry-run event not deduplicated into a series of 3: %+v", e)
			}
		case ReasonProblem:
			cond++
		}
	}
	if dry != 1 || cond != 1 {
		t.Fatalf("events: %d dry-run, %d condition; all: %+v", dry, cond, evs.Items)
	}
	if len(published) != 1 || published[0] != "stale" {
		t.Errorf("firing published %v", published)
	}
	cond1 := nodeCondition(t, cs)
	if cond1.Status != corev1.ConditionFalse || cond1.Reason != "KubeProxySyncStale" || !strings.Contains(cond1.Message, "no sync for 90s") {
		t.Fatalf("condition %+v", cond1)
	}
	// Healthy again: True only after ClearAfter.
	healthy := &remediate.Report{}
	_ = r.Report(ctx, healthy)
	clk.Step(time.Minute)
	_ = r.Report(ctx, healthy)
	if c := nodeCondition(t, cs); c.Status != corev1.ConditionFalse {
		t.Fatalf("cleared too early: %+v", c)
	}
	clk.Step(90 * time.Second)
	_ = r.Report(ctx, healthy)
	if c := nodeCondition(t, cs); c.Status != corev1.ConditionTrue || c.Reason != ReasonHealthy {
		t.Fatalf("not cleared: %+v", c)
	}
}

func nodeCondition(t *testing.T, cs *fake.Clientset) corev1.NodeCondition {
	t.Helper()
	n, err := cs.CoreV1().Nodes().Get(context.Background(), "n1", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range n.Status.Conditions {
		if c.Type == DefaultConditionType {
			return c
		}
	}
	t.Fatalf("no condition on %+v", n.Status)
	return corev1.NodeCondition{}
}

func TestReporterUncordon(t *testing.T) {
	ctx := context.Background()
	cs := fake.NewClientset(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1"}})
	clk := clocktesting.NewFakeClock(time.Date(2026, 11, 21, 12, 0, 0, 0, time.UTC))
	taint := &corev1.Taint{Key: "remediate.dev/dataplane", Effect: corev1.TaintEffectNoSchedule}
	if _, err := kube.Cordon(ctx, cs, "n1", kube.CordonRecord{Detector: "KubeProxySyncStale", Target: "kube-proxy/IPv4", Time: clk.Now(), Taint: taint}); err != nil {
		t.Fatal(err)
	}
	r := New(cs, Options{Node: "n1", Clock: clk, UncordonAfter: time.Minute})
	firing := &remediate.Report{Findings: []remediate.ReportFinding{{Rule: "cordon", Finding: finding.Finding{Detector: "KubeProxySyncStale", Target: "kube-proxy/IPv4", Severity: finding.Warning}}}}
	skipped := &remediate.Report{Skipped: []remediate.SkippedCheck{{Rule: "cordon", Detector: "KubeProxySyncStale", Reason: "no cluster access"}}}
	clean := &remediate.Report{}
	steps := []struct {
		rep         *remediate.Report
		step        time.Duration
		unscheduled bool
	}{
		{firing, 0, true}, {clean, time.Minute / 2, true}, {skipped, time.Minute, true}, {clean, time.Minute / 2, true},
		{clean, time.Minute / 2, true}, {clean, time.Minute / 2, false},
	}
	for i, s := range steps {
		clk.Step(s.step)
		_ = r.Report(ctx, s.rep)
		n, _ := cs.CoreV1().Nodes().Get(ctx, "n1", metav1.GetOptions{})
		if n.Spec.Unschedulable != s.unscheduled {
			t.Fatalf("step %d: unschedulable=%v", i, n.Spec.Unschedulable)
		}
		if !s.unscheduled && (len(n.Spec.Taints) != 0 || n.Annotations[kube.AnnotationCordonedBy] != "") {
			t.Fatalf("taint/annotation left: %+v", n)
		}
	}
	// A node cordoned by someone else is not touched.
	n, _ := cs.CoreV1().Nodes().Get(ctx, "n1", metav1.GetOptions{})
	n.Spec.Unschedulable = true
	_, _ = cs.CoreV1().Nodes().Update(ctx, n, metav1.UpdateOptions{})
	if _, err := kube.Cordon(ctx, cs, "n1", kube.CordonRecord{Detector: "x"}); err != kube.ErrCordonedByOther {
		t.Fatalf("cordon over another's: %v", err)
	}
	clk.Step(time.Hour)
	_ = r.Report(ctx, clean)
	n, _ = cs.CoreV1().Nodes().Get(ctx, "n1", metav1.GetOptions{})
	if !n.Spec.Unschedulable {
		t.Fatal("uncordoned a node remediate did not cordon")
	}
}

func TestEventFor(t *testing.T) {
	for _, tc := range []struct {
		d      remediate.Decision
		reason string
	}{
		{remediate.Decision{Outcome: remediate.OutcomeExecuted}, ReasonExecuted},
		{remediate.Decision{Outcome: remediate.OutcomeDryRun}, ReasonDryRun},
		{remediate.Decision{Outcome: remediate.OutcomeFailed}, ReasonFailed},
		{remediate.Decision{Outcome: remediate.OutcomeFailed, Phase: remediate.PhaseEscalated}, ReasonEscalated},
		{remediate.Decision{Outcome: remediate.OutcomeBlocked, Guardrail: "storm-guard"}, ReasonStorm},
		{remediate.Decision{Outcome: remediate.OutcomeBlocked, Guardrail: "cooldown"}, ""},
		{remediate.Decision{Outcome: remediate.OutcomeSkipped}, ""},
		{remediate.Decision{Outcome: remediate.OutcomeSkipped, Phase: remediate.PhaseEscalated}, ""},
	} {
		_, reason, _, ok := eventFor(tc.d)
		if ok != (tc.reason != "") || reason != tc.reason {
			t.Errorf("%+v: got %q %v, want %q", tc.d, reason, ok, tc.reason)
		}
	}
}

// TestConditionNotPatchedForAChangingMessage: a persistent problem whose
// message carries its age (PodsNetworkNotReady's "for 1h0m31s") patches
// the Node when the condition turns False, then only at the heartbeat
// (with the message of then), not every cycle; other problems (a new
// target) are written at once. Each cycle's patch was 1.5 writes a minute
// per sick node (bench-fleet), ~125 a second for a fleet of 5,000 (the
// kubelets' own node status reports: ~17 a second).
func TestConditionNotPatchedForAChangingMessage(t *testing.T) {
	ctx := context.Background()
	cs := fake.NewClientset(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1"}})
	clk := clocktesting.NewFakeClock(time.Date(2026, 11, 21, 12, 0, 0, 0, time.UTC))
	r := New(cs, Options{Node: "n1", Clock: clk, Heartbeat: 5 * time.Minute,
		Hysteresis: Hysteresis{ProblemAfter: time.Minute, ClearAfter: 2 * time.Minute}})
	sick := func(targets ...string) *remediate.Report {
		rep := &remediate.Report{}
		for _, tg := range targets {
			rep.Findings = append(rep.Findings, remediate.ReportFinding{Rule: "pods", Finding: finding.Finding{Detector: "PodsNetworkNotReady",
				Target: tg, Severity: finding.Critical, Message: "no sandbox for " + clk.Now().Format("15:04:05")}})
		}
		return rep
	}
	patches := func() int {
		n := 0
		for _, a := range cs.Actions() {
			if a.GetVerb() == "patch" && a.GetResource().Resource == "nodes" {
				n++
			}
		}
		return n
	}
	for i := 0; i < 10; i++ { // 0..4m30s: False at 1m, then the same problem
		if err := r.Report(ctx, sick("pod/a")); err != nil {
			t.Fatal(err)
		}
		clk.Step(30 * time.Second)
	}
	if n := patches(); n != 1 {
		t.Fatalf("%d Node patches in 10 cycles of one problem with a changing message, want 1 (the turn to False)", n)
	}
	for i := 0; i < 2; i++ { // 5m, 5m30s: the heartbeat is due at 6m (1m + 5m)
		_ = r.Report(ctx, sick("pod/a"))
		clk.Step(30 * time.Second)
	}
	_ = r.Report(ctx, sick("pod/a")) // 6m
	if n := patches(); n != 2 {
		t.Fatalf("%d Node patches after the heartbeat, want 2", n)
	}
	if c := nodeCondition(t, cs); !strings.Contains(c.Message, "no sandbox for 12:06:00") {
		t.Errorf("heartbeat did not carry the current message: %+v", c)
	}
	clk.Step(30 * time.Second)
	_ = r.Report(ctx, sick("pod/a", "pod/b")) // another problem, 30 s after the last write: debounced
	if n := patches(); n != 2 {
		t.Fatalf("%d Node patches 30 s after the last write, want 2 (a new problem set is debounced for RewriteAfter)", n)
	}
	clk.Step(30 * time.Second)
	_ = r.Report(ctx, sick("pod/a", "pod/c")) // 1 min after the last write: the latest set
	if n := patches(); n != 3 {
		t.Fatalf("%d Node patches a minute after the last write, want 3", n)
	}
	if c := nodeCondition(t, cs); !strings.Contains(c.Message, "pod/c") {
		t.Errorf("the debounced rewrite does not carry the latest problems: %+v", c)
	}
	// Churn: the problem set changes every cycle for 5 minutes: at most
	// one rewrite a minute (10 before).
	for i := 0; i < 10; i++ {
		clk.Step(30 * time.Second)
		_ = r.Report(ctx, sick("pod/a", fmt.Sprintf("pod/churn-%d", i)))
	}
	if n := patches(); n > 3+5 {
		t.Fatalf("%d Node patches over 10 cycles of churn, want at most one a minute (%d)", n-3, 5)
	}
	// The status turning is written at once, debounce or not.
	for i := 0; i < 5; i++ { // ClearAfter 2 m
		clk.Step(30 * time.Second)
		_ = r.Report(ctx, &remediate.Report{})
	}
	if c := nodeCondition(t, cs); c.Status != corev1.ConditionTrue {
		t.Errorf("not cleared after ClearAfter: %+v", c)
	}
}

// TestEventSeriesWrittenEveryInterval: a dry-run decision repeated every
// 30 s cycle for 10 minutes is one Event whose series is written at most
// every SeriesInterval (5m): 1 create and 2 PATCHes for 21 occurrences
// (20 PATCHes before), with the count on the server the true one at each
// write, the last one written by the flush once the decision stops, and
// a changed decision a new Event at once.
func TestEventSeriesWrittenEveryInterval(t *testing.T) {
	ctx := context.Background()
	cs := fake.NewClientset(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1"}})
	clk := clocktesting.NewFakeClock(time.Date(2026, 11, 21, 12, 0, 0, 0, time.UTC))
	r := New(cs, Options{Node: "n1", Clock: clk})
	dec := func(outcome remediate.Outcome) *remediate.Report {
		return &remediate.Report{Decisions: []remediate.Decision{{Rule: "stale", Action: "RestartKubeProxy", Target: "kube-proxy/IPv4",
			Outcome: outcome, Reason: "audit mode: would delete pod"}}}
	}
	writes := func(verb string) int { // of the dry-run Event (the condition has its own)
		n := 0
		for _, a := range cs.Actions() {
			switch a := a.(type) {
			case k8stesting.CreateAction:
				if e, ok := a.GetObject().(*eventsv1.Event); ok && verb == "create" && e.Reason == ReasonDryRun {
					n++
				}
			case k8stesting.PatchAction:
				if verb == "patch" && a.GetResource().Resource == "events" {
					n++
				}
			}
		}
		return n
	}
	series := func(reason string) (int32, time.Time) {
		evs, err := cs.EventsV1().Events("kube-system").List(ctx, metav1.ListOptions{})
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range evs.Items {
			if e.Reason == reason {
				if e.Series == nil {
					return 1, e.EventTime.Time
				}
				return e.Series.Count, e.Series.LastObservedTime.Time
			}
		}
		t.Fatalf("no %s event in %+v", reason, evs.Items)
		return 0, time.Time{}
	}
	for i := 0; i <= 20; i++ { // 12:00:00 .. 12:10:00
		if err := r.Report(ctx, dec(remediate.OutcomeDryRun)); err != nil {
			t.Fatal(err)
		}
		switch i {
		case 9: // 12:04:30: not yet
			if c, _ := series(ReasonDryRun); c != 1 {
				t.Fatalf("series written before 5 minutes: count %d", c)
			}
		case 10: // 12:05:00: the 11 occurrences
			if c, last := series(ReasonDryRun); c != 11 || !last.Equal(clk.Now()) {
				t.Fatalf("at 5m: count %d last %v, want 11 at %v", c, last, clk.Now())
			}
		}
		clk.Step(30 * time.Second)
	}
	if c, p := writes("create"), writes("patch"); c != 1 || p != 2 {
		t.Fatalf("21 occurrences in 10 minutes: %d creates, %d patches of events, want 1 and 2 (one every 5 minutes)", c, p)
	}
	// The decision stops at 12:10:00 (written then); one more occurrence
	// at 12:10:30, then none: written 5 minutes after the last write.
	_ = r.Report(ctx, dec(remediate.OutcomeDryRun))
	lastSeen := clk.Now()
	for i := 0; i < 10; i++ {
		clk.Step(30 * time.Second)
		_ = r.Report(ctx, &remediate.Report{})
	}
	if c, last := series(ReasonDryRun); c != 22 || !last.Equal(lastSeen) {
		t.Fatalf("after the decision stopped: count %d last %v, want 22 at %v", c, last, lastSeen)
	}
	// A changed decision is a new Event at once; its repeats are written by
	// Flush (shutdown) before their interval.
	_ = r.Report(ctx, dec(remediate.OutcomeFailed))
	if c, _ := series(ReasonFailed); c != 1 {
		t.Fatalf("failed: count %d", c)
	}
	clk.Step(30 * time.Second)
	_ = r.Report(ctx, dec(remediate.OutcomeFailed))
	p := writes("patch")
	if err := r.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	if c, _ := series(ReasonFailed); c != 2 || writes("patch") != p+1 {
		t.Fatalf("flush: count %d, %d patches (before %d)", c, writes("patch"), p)
	}
	if err := r.Flush(ctx); err != nil || writes("patch") != p+1 {
		t.Fatalf("a second flush with nothing pending wrote: %v, %d patches", err, writes("patch"))
	}
}
