package remediate

// The decide-and-act path of one (rule, target) whose action is due, in
// named steps: plan → admit → commit → execute → settle.

import (
	"context"
	"errors"
	"fmt"
	"runtime/debug"
	"time"

	"go.uber.org/zap"

	"github.com/remediate-dev/remediate/internal/finding"
	"github.com/remediate-dev/remediate/remediate/action"
	"github.com/remediate-dev/remediate/remediate/guardrails"
	"github.com/remediate-dev/remediate/remediate/journal"
)

// attempt is one decide-and-act pass on a (rule, target), handed from step
// to step: plan → admit → commit → execute → settle. A step that ends the
// attempt has written the decision and released what it held.
type attempt struct {
	rr   *ruleRuntime
	f    finding.Finding
	key  string
	tm   Timing
	dec  *Decision
	log  *zap.Logger
	now  time.Time
	req  *guardrails.Request
	plan action.Plan
	held []heldGuard
	hi   int    // index of the attempt's record in the history (commit)
	id   string // journal id shared by intent and outcome (commit)
}

func (c *cycle) decideAndAct(ctx context.Context, rr *ruleRuntime, f finding.Finding, key string, tm Timing, dec *Decision, log *zap.Logger) {
	a := &attempt{rr: rr, f: f, key: key, tm: tm, dec: dec, log: log, now: c.e.opts.Clock.Now()}
	if !c.plan(ctx, a) || !c.admit(ctx, a) || !c.commit(ctx, a) {
		return
	}
	res, err := c.execute(ctx, a)
	c.settle(ctx, a, res, err)
}

// plan asks the action what it would do. It comes first: an action that
// cannot apply is skipped before any guardrail takes a resource.
func (c *cycle) plan(ctx context.Context, a *attempt) bool {
	r, at := a.rr.rule, a.rr.actType
	why := guardrails.DryRunReason(c.pol, r, c.e.opts.ForceDryRun)
	a.req = &guardrails.Request{Rule: r, ActionType: at.Name, Disruptive: at.Disruptive, NeedsAPI: at.NeedsAPI, Finding: a.f, DryRun: why != "", Now: a.now}
	p, err := c.runPlan(ctx, a.rr, a.f)
	if err != nil {
		reason, ok := finding.IsSkip(err)
		if !ok {
			reason = "cannot plan action: " + err.Error()
		}
		a.dec.Outcome, a.dec.Reason = OutcomeSkipped, reason
		return false
	}
	a.plan = p
	return true
}

// admit runs the guardrail chain (guardrails.Chain: the node's guardrails
// and the engine's Options.Cluster) in order; the first that blocks
// decides (dry-run, the last, turns the attempt into a report). Resources
// taken by holders are kept in a.held.
func (c *cycle) admit(ctx context.Context, a *attempt) bool {
	n := guardrails.Node{Ledger: c.st, MaxActionsPerHour: c.pol.Guardrails.MaxActionsPerHour,
		MaxTargetsPerCycle: c.pol.Guardrails.MaxTargetsPerCycle, Acted: c.acted}
	for _, g := range guardrails.Chain(n, c.e.opts.Cluster, guardrails.DryRunReason(c.pol, a.req.Rule, c.e.opts.ForceDryRun)) {
		err := g.Check(ctx, a.req)
		if err == nil {
			if h, ok := g.(guardrails.Holder); ok && !a.req.DryRun {
				a.held = append(a.held, heldGuard{h, *a.req})
			}
			continue
		}
		b := guardrails.AsBlocked(g.Name(), err)
		releaseAll(ctx, a.held)
		if b.Guardrail == guardrails.GuardDryRun {
			c.dryRun(a, b)
			return false
		}
		a.dec.Outcome, a.dec.Reason, a.dec.Guardrail = OutcomeBlocked, b.Error(), b.Guardrail
		c.x.GuardrailBlocks = append(c.x.GuardrailBlocks, GuardrailBlock{b.Guardrail, a.rr.rule.Name})
		return false
	}
	return true
}

// dryRun reports what would be done and journals it once per episode.
func (c *cycle) dryRun(a *attempt, b *guardrails.Blocked) {
	*c.acted++
	a.dec.Outcome, a.dec.Reason = OutcomeDryRun, fmt.Sprintf("%s: would %s", b.Reason, a.plan.Summary)
	ts, stored := c.st.Targets[a.key]
	if ts.DryRunReported && !c.e.opts.Once {
		return
	}
	if stored && !c.e.opts.Once {
		ts.DryRunReported = true
		c.st.Targets[a.key] = ts
	}
	c.e.journal(journal.Record{Kind: journal.KindDryRun, Rule: a.rr.rule.Name, Target: a.f.Target, Action: a.rr.actType.Name,
		Outcome: string(OutcomeDryRun), Summary: "would " + a.plan.Summary, Details: a.plan.Details}, c.rep)
}

// commit makes the attempt count against every limit before it runs, and
// puts that on disk, then appends the journal intent. It refuses to go on
// when stopping (SIGTERM: finish the cycle, start nothing new) or when
// either write fails.
func (c *cycle) commit(ctx context.Context, a *attempt) bool {
	r, name := a.rr.rule, a.rr.actType.Name
	if err := ctx.Err(); err != nil {
		releaseAll(ctx, a.held)
		a.dec.Outcome, a.dec.Reason = OutcomeSkipped, "not acting: stopping ("+err.Error()+")"
		return false
	}
	*c.acted++
	a.id = attemptID(a.now, a.key)
	c.st.History = append(c.st.History, ActionRecord{Time: a.now, Rule: r.Name, Target: a.f.Target, Action: name, Outcome: historyPending, ID: a.id})
	a.hi = len(c.st.History) - 1
	if err := c.e.store.Save(c.st); err != nil {
		releaseAll(ctx, a.held)
		a.dec.Outcome, a.dec.Reason = OutcomeSkipped, "not acting: cannot persist guardrail state: "+err.Error()
		return false
	}
	if err := c.e.opts.Journal.Append(journal.Record{Time: a.now, ID: a.id, Kind: journal.KindIntent, Node: c.e.opts.Node.Name,
		Rule: r.Name, Target: a.f.Target, Action: name, Summary: a.plan.Summary, Details: a.plan.Details}); err != nil {
		releaseAll(ctx, a.held)
		c.st.History[a.hi].Outcome = historyNotRun
		a.dec.Outcome, a.dec.Reason = OutcomeSkipped, "not acting: cannot write journal intent: "+err.Error()
		return false
	}
	return true
}

// execute runs the action (guarded: deadline, panic recovery) and times it.
func (c *cycle) execute(ctx context.Context, a *attempt) (action.Result, error) {
	name := a.rr.actType.Name
	a.log.Info("executing action", zap.String("target", a.f.Target), zap.String("action", name), zap.String("plan", a.plan.Summary))
	res, err := c.runExecute(ctx, a.rr, a.f)
	c.x.ActionDurations = append(c.x.ActionDurations, ActionDuration{name, c.e.opts.Clock.Since(a.now)})
	return res, err
}

// settle records the outcome: in the history, the target's state machine,
// the decision and the journal. A refusal at execution (the target is
// gone, changed, someone else's) changed nothing: it is neither a failed
// attempt nor a use of the rate budget. What was held is kept only for a
// target that now verifies.
func (c *cycle) settle(ctx context.Context, a *attempt, res action.Result, err error) {
	r, name := a.rr.rule, a.rr.actType.Name
	done := c.e.opts.Clock.Now()
	out := journal.Record{Time: done, ID: a.id, Kind: journal.KindOutcome, Node: c.e.opts.Node.Name, Rule: r.Name,
		Target: a.f.Target, Action: name, Summary: res.Summary, Details: res.Details}
	if reason, skipped := finding.IsSkip(err); skipped {
		c.st.History[a.hi].Outcome = string(OutcomeSkipped)
		out.Outcome, out.Summary = string(OutcomeSkipped), reason
		a.dec.Outcome, a.dec.Reason = OutcomeSkipped, "refused at execution: "+reason
		releaseAll(ctx, a.held)
		c.e.journal(out, c.rep)
		return
	}
	ts := Record(c.st.Targets[a.key], ActOutcome{Err: err}, done, a.tm)
	c.st.Targets[a.key] = ts
	a.dec.Phase = ts.Phase
	if err != nil {
		c.st.History[a.hi].Outcome = string(OutcomeFailed)
		out.Outcome, out.Error = string(OutcomeFailed), err.Error()
		a.dec.Outcome, a.dec.Reason = OutcomeFailed, fmt.Sprintf("%v (attempt %d of %d)", err, ts.Attempts, a.tm.MaxAttempts)
		a.log.Warn("action failed", zap.String("target", a.f.Target), zap.Error(err))
		releaseAll(ctx, a.held)
	} else {
		c.st.History[a.hi].Outcome = string(OutcomeExecuted)
		out.Outcome = string(OutcomeExecuted)
		a.dec.Outcome, a.dec.Reason = OutcomeExecuted, res.Summary
		c.e.held[a.key] = append(c.e.held[a.key], a.held...)
	}
	c.e.journal(out, c.rep)
	if ts.Phase == PhaseEscalated {
		// After the outcome that caused it, so the journal reads in order.
		c.escalate(r, a.f, name, ts, a.log)
	}
}

// runPlan runs Action.Plan with the action timeout and panic recovery.
func (c *cycle) runPlan(ctx context.Context, rr *ruleRuntime, f finding.Finding) (action.Plan, error) {
	p, err := guarded(c, ctx, rr, "plan", func(ctx context.Context) (action.Plan, error) { return rr.act.Plan(ctx, f) })
	if err == nil && p.Summary == "" {
		p.Summary = fmt.Sprintf("run %s on %s", rr.actType.Name, f.Target)
	}
	return p, err
}

// runExecute runs Action.Execute with the action timeout and panic recovery.
func (c *cycle) runExecute(ctx context.Context, rr *ruleRuntime, f finding.Finding) (action.Result, error) {
	return guarded(c, ctx, rr, "execute", func(ctx context.Context) (action.Result, error) { return rr.act.Execute(ctx, f) })
}

// guardedResult is what a guarded call's goroutine hands back.
type guardedResult[T any] struct {
	v        T
	err      error
	panicked bool
}

// guarded runs fn under the action deadline; a panic or an overrun becomes
// an error and a finding about the daemon. An action that ignores its
// context is abandoned (its goroutine is left to finish; its late result is
// dropped) rather than stalling the loop, and is not started again while
// it still runs.
func guarded[T any](c *cycle, ctx context.Context, rr *ruleRuntime, what string, fn func(context.Context) (T, error)) (T, error) {
	var zero T
	if err := ctx.Err(); err != nil {
		return zero, fmt.Errorf("action %s %s not started: %w", rr.actType.Name, what, err)
	}
	if !rr.actBusy.CompareAndSwap(false, true) {
		since := time.Unix(0, rr.actSince.Load())
		return zero, fmt.Errorf("action %s still running since %s (hung?); not started again", rr.actType.Name, since.UTC().Format(time.RFC3339))
	}
	rr.actSince.Store(c.e.opts.Clock.Now().UnixNano())
	timeout := c.pol.ActionTimeout.Duration
	actx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	ch := make(chan guardedResult[T], 1)
	go func() {
		var r guardedResult[T]
		defer func() {
			if p := recover(); p != nil {
				c.e.opts.Log.Error("action panicked", zap.String("rule", rr.rule.Name), zap.Any("panic", p), zap.ByteString("stack", debug.Stack()))
				r = guardedResult[T]{err: fmt.Errorf("action %s %s panicked: %v", rr.actType.Name, what, p), panicked: true}
			}
			rr.actBusy.Store(false) // before the result: the next call may follow at once
			ch <- r
		}()
		r.v, r.err = fn(actx)
	}()
	var r guardedResult[T]
	select {
	case r = <-ch:
	case <-actx.Done():
		select {
		case r = <-ch: // it did return: its result, not a timeout
		default:
			r.err = fmt.Errorf("action %s %s did not finish within %s: %w", rr.actType.Name, what, timeout, actx.Err())
		}
	}
	// A panic, or a failure once our deadline fired (abandoned, or the
	// action gave up on it), is a fault of the daemon's, not of the node.
	if r.panicked || (r.err != nil && errors.Is(actx.Err(), context.DeadlineExceeded)) {
		c.rep.Findings = append(c.rep.Findings, ReportFinding{Rule: rr.rule.Name, Finding: finding.Finding{
			Detector: SelfDetector, Target: "action/" + rr.rule.Name, Severity: finding.Warning,
			Message: r.err.Error(), Evidence: map[string]any{"actionType": rr.actType.Name, "phase": what},
		}})
	}
	return r.v, r.err
}
