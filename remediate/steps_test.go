package remediate

import (
	"context"
	"errors"
	"testing"

	"go.uber.org/zap"

	"github.com/remediate-dev/remediate/internal/finding"
	"github.com/remediate-dev/remediate/internal/node"
	"github.com/remediate-dev/remediate/remediate/action"
	"github.com/remediate-dev/remediate/remediate/guardrails"
)

// stepWorld is one engine and one cycle over enforceRule's rule, for
// driving the decide-and-act steps one at a time.
type stepWorld struct {
	h     *harness
	e     *Engine
	c     *cycle
	acted int
}

func newStepWorld(t *testing.T, src string) *stepWorld {
	h := newHarness(t)
	e := h.engine(mustPolicy(t, src))
	sw := &stepWorld{h: h, e: e}
	st, _ := e.store.Load(h.clock.Now())
	sw.c = &cycle{e: e, pol: e.pol, st: st, rep: &Report{}, x: &CycleExport{}, acted: &sw.acted}
	return sw
}

func (sw *stepWorld) attempt(target string) *attempt {
	rr := sw.e.rules[0]
	f := finding.Finding{Detector: "Fake", Target: target, Severity: finding.Critical}
	r := rr.rule
	tm := Timing{For: r.For.Duration, VerifyAfter: r.VerifyAfter.Duration, MaxAttempts: r.MaxAttempts}
	return &attempt{rr: rr, f: f, key: r.Name + "|" + target, tm: tm, dec: &Decision{}, log: zap.NewNop(), now: sw.h.clock.Now()}
}

func TestStepPlan(t *testing.T) {
	sw := newStepWorld(t, enforceRule)
	a := sw.attempt("process/1")
	if !sw.c.plan(context.Background(), a) || a.plan.Summary != "fix process/1" || a.req == nil || a.req.DryRun || a.req.ActionType != "FakeFix" {
		t.Fatalf("plan: %+v req %+v", a.plan, a.req)
	}
	// An action that cannot plan is a skip, decided before any guardrail.
	sw2 := newStepWorld(t, planFailsRule)
	a2 := sw2.attempt("process/2")
	if sw2.c.plan(context.Background(), a2) || a2.dec.Outcome != OutcomeSkipped || a2.dec.Reason != "target changed" {
		t.Fatalf("skipped plan: %+v", a2.dec)
	}
	a3 := sw2.attempt("process/3")
	if sw2.c.plan(context.Background(), a3) || a3.dec.Outcome != OutcomeSkipped || a3.dec.Reason != "cannot plan action: no such thing" {
		t.Fatalf("failed plan: %+v", a3.dec)
	}
}

func TestStepAdmit(t *testing.T) {
	ctx := context.Background()
	sw := newStepWorld(t, enforceRule)
	a := sw.attempt("process/1")
	sw.c.plan(ctx, a)
	if !sw.c.admit(ctx, a) || a.dec.Outcome != "" {
		t.Fatalf("admit: %+v", a.dec)
	}
	// Escalated: blocked by the first guardrail, with its name.
	sw.c.st.Targets[a.key] = TargetState{Phase: PhaseEscalated, Attempts: 2, LastError: "boom"}
	a = sw.attempt("process/1")
	sw.c.plan(ctx, a)
	if sw.c.admit(ctx, a) || a.dec.Outcome != OutcomeBlocked || a.dec.Guardrail != guardrails.GuardEscalation {
		t.Fatalf("escalated: %+v", a.dec)
	}
	// Audit mode: dry-run, journaled once per episode, counted in acted.
	sa := newStepWorld(t, "mode: audit\n"+enforceRule[len("mode: enforce\n"):])
	sa.c.st.Targets["fix-it|process/3"] = TargetState{Phase: PhaseFiring}
	for i := 0; i < 2; i++ {
		a = sa.attempt("process/3")
		sa.c.plan(ctx, a)
		if sa.c.admit(ctx, a) || a.dec.Outcome != OutcomeDryRun || a.dec.Reason != "mode audit: would fix process/3" {
			t.Fatalf("audit: %+v", a.dec)
		}
	}
	if sa.acted != 2 || !sa.c.st.Targets["fix-it|process/3"].DryRunReported {
		t.Fatalf("acted %d, state %+v", sa.acted, sa.c.st.Targets["fix-it|process/3"])
	}
	if got := journalKinds(t, sa.h.dir); len(got) != 1 || got[0] != "dry-run" {
		t.Fatalf("journal %v, want one dry-run", got)
	}
}

func TestStepCommit(t *testing.T) {
	sw := newStepWorld(t, enforceRule)
	a := sw.attempt("process/1")
	ctx := context.Background()
	sw.c.plan(ctx, a)
	if !sw.c.commit(ctx, a) || sw.acted != 1 || a.id == "" {
		t.Fatalf("commit: acted %d id %q dec %+v", sw.acted, a.id, a.dec)
	}
	// The pending attempt is on disk before anything runs, and the intent
	// is journaled.
	st, _ := sw.e.store.Load(sw.h.clock.Now())
	if len(st.History) != 1 || st.History[0].Outcome != "pending" || st.History[0].Target != "process/1" {
		t.Fatalf("persisted history %+v", st.History)
	}
	if got := journalKinds(t, sw.h.dir); len(got) != 1 || got[0] != "intent" {
		t.Fatalf("journal %v", got)
	}
	// Stopping: nothing is committed.
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	b := sw.attempt("process/2")
	sw.c.plan(ctx, b)
	if sw.c.commit(cctx, b) || b.dec.Outcome != OutcomeSkipped || len(sw.c.st.History) != 1 {
		t.Fatalf("stopping: %+v, history %d", b.dec, len(sw.c.st.History))
	}
}

func TestStepExecuteAndSettle(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		name    string
		err     error
		outcome Outcome
		phase   Phase
		history string
	}{
		{"executed", nil, OutcomeExecuted, PhaseVerifying, "executed"},
		{"failed", errors.New("boom"), OutcomeFailed, PhaseFailed, "failed"},
		{"refused", finding.Skip("pid gone"), OutcomeSkipped, "", "skipped"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			sw := newStepWorld(t, enforceRule)
			a := sw.attempt("process/1")
			sw.c.plan(ctx, a)
			sw.c.commit(ctx, a)
			w.actErr["a"] = tc.err
			res, err := sw.c.execute(ctx, a)
			if got := executed(); len(got) != 1 || got[0] != "a:process/1" {
				t.Fatalf("executed %v", got)
			}
			sw.c.settle(ctx, a, res, err)
			if a.dec.Outcome != tc.outcome || a.dec.Phase != tc.phase || sw.c.st.History[a.hi].Outcome != tc.history {
				t.Fatalf("decision %+v, history %q", a.dec, sw.c.st.History[a.hi].Outcome)
			}
			if got := journalKinds(t, sw.h.dir); len(got) != 2 || got[1] != "outcome" {
				t.Fatalf("journal %v", got)
			}
		})
	}
}

// planFailsRule pairs Fake with StepPlanFails, whose Plan skips on
// process/2 and fails otherwise.
const planFailsRule = `mode: enforce
rules:
- name: plan-fails
  detector: {type: Fake, key: p}
  for: 0s
  action: {type: StepPlanFails}
`

type planFails struct{}

func (planFails) Plan(_ context.Context, f finding.Finding) (action.Plan, error) {
	if f.Target == "process/2" {
		return action.Plan{}, finding.Skip("target changed")
	}
	return action.Plan{}, errors.New("no such thing")
}

func (planFails) Execute(context.Context, finding.Finding) (action.Result, error) {
	return action.Result{}, errors.New("not reached")
}

func init() {
	action.Define("StepPlanFails", "test", func(*struct{}, *node.Node) (action.Action, error) { return planFails{}, nil }, action.ActsOnAnyFinding())
}
