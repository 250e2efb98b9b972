package remediate

import (
	"context"
	"time"

	"github.com/remediate-dev/remediate/policy"
)

// Names of the built-in guardrails, as they appear in block reasons and the
// remediate_guardrail_blocks_total metric.
const (
	GuardEscalation = "escalation"
	GuardCooldown   = "cooldown"
	GuardRuleRate   = "rule-rate-limit"
	GuardNodeRate   = "node-rate-limit"
	GuardMaxTargets = "max-targets-per-cycle"
	GuardDryRun     = "dry-run"
)

// nodeRateWindow is the window of policy.guardrails.maxActionsPerHour.
const nodeRateWindow = time.Hour

// escalationGuard blocks targets whose attempts are exhausted.
type escalationGuard struct{ st *State }

func (g escalationGuard) Name() string { return GuardEscalation }
func (g escalationGuard) Check(_ context.Context, r *Request) error {
	if ts, ok := g.st.Targets[r.Key()]; ok && ts.Phase == PhaseEscalated {
		return Block(GuardEscalation, "escalated after %d failed attempts (last: %s); no more actions until the finding clears", ts.Attempts, ts.LastError)
	}
	return nil
}

// cooldownGuard spaces actions of a rule on one target.
type cooldownGuard struct{ st *State }

func (g cooldownGuard) Name() string { return GuardCooldown }
func (g cooldownGuard) Check(_ context.Context, r *Request) error {
	cd := r.Rule.Cooldown.Duration
	if cd <= 0 {
		return nil
	}
	if u := g.st.UnknownHistoryAt; !u.IsZero() && r.Now.Sub(u) < cd {
		return Block(GuardCooldown, "action history unknown since %s (state file was corrupt): treated as recent; next allowed after %s", u.UTC().Format(time.RFC3339), u.Add(cd).UTC().Format(time.RFC3339))
	}
	for i := len(g.st.History) - 1; i >= 0; i-- {
		h := g.st.History[i]
		if h.Rule == r.Rule.Name && h.Target == r.Finding.Target && h.changedSomething() {
			if r.Now.Sub(h.Time) < cd {
				return Block(GuardCooldown, "last action on this target at %s; cooldown %s until %s", h.Time.UTC().Format(time.RFC3339), cd, h.Time.Add(cd).UTC().Format(time.RFC3339))
			}
			break
		}
	}
	return nil
}

// ruleRateGuard enforces rule.rateLimit {max, per}.
type ruleRateGuard struct{ st *State }

func (g ruleRateGuard) Name() string { return GuardRuleRate }
func (g ruleRateGuard) Check(_ context.Context, r *Request) error {
	rl := r.Rule.RateLimit
	if u := g.st.UnknownHistoryAt; !u.IsZero() && r.Now.Sub(u) < rl.Per.Duration {
		return Block(GuardRuleRate, "action history unknown since %s (state file was corrupt): rate limit %d per %s treated as used", u.UTC().Format(time.RFC3339), rl.Max, rl.Per.Duration)
	}
	n, oldest := countSince(g.st.History, r.Now.Add(-rl.Per.Duration), func(h ActionRecord) bool { return h.Rule == r.Rule.Name })
	if n >= rl.Max {
		return Block(GuardRuleRate, "%d actions of this rule in the last %s (max %d); next slot at %s", n, rl.Per.Duration, rl.Max, oldest.Add(rl.Per.Duration).UTC().Format(time.RFC3339))
	}
	return nil
}

// nodeRateGuard enforces guardrails.maxActionsPerHour across rules.
type nodeRateGuard struct {
	st  *State
	max int
}

func (g nodeRateGuard) Name() string { return GuardNodeRate }
func (g nodeRateGuard) Check(_ context.Context, r *Request) error {
	if u := g.st.UnknownHistoryAt; !u.IsZero() && r.Now.Sub(u) < nodeRateWindow {
		return Block(GuardNodeRate, "action history unknown since %s (state file was corrupt): node limit treated as used", u.UTC().Format(time.RFC3339))
	}
	n, oldest := countSince(g.st.History, r.Now.Add(-nodeRateWindow), func(ActionRecord) bool { return true })
	if n >= g.max {
		return Block(GuardNodeRate, "%d actions on this node in the last hour (max %d); next slot at %s", n, g.max, oldest.Add(nodeRateWindow).UTC().Format(time.RFC3339))
	}
	return nil
}

// maxTargetsGuard caps targets acted on (or that would be, in a dry run)
// in one cycle.
type maxTargetsGuard struct {
	max   int
	acted *int
}

func (g maxTargetsGuard) Name() string { return GuardMaxTargets }
func (g maxTargetsGuard) Check(_ context.Context, _ *Request) error {
	if *g.acted >= g.max {
		return Block(GuardMaxTargets, "already %d targets this cycle (max %d)", *g.acted, g.max)
	}
	return nil
}

// dryRunGuard turns the action into a report: audit mode, the rule's
// dryRun, or --dry-run. It runs last so that an audit report shows what
// enforce mode would do, including blocks by the other guardrails.
type dryRunGuard struct{ why string }

func (g dryRunGuard) Name() string { return GuardDryRun }
func (g dryRunGuard) Check(_ context.Context, r *Request) error {
	if r.DryRun {
		return Block(GuardDryRun, "%s", g.why)
	}
	return nil
}

// dryRunReason says why a rule's actions are dry runs, or "" if they are not.
func dryRunReason(p *policy.Policy, r *policy.Rule, force bool) string {
	switch {
	case force:
		return "--dry-run"
	case p.Mode != policy.Enforce:
		return "mode audit"
	case r.DryRun:
		return "rule dryRun"
	}
	return ""
}

// countSince counts history records at or after since matching keep, and
// returns the oldest such record's time.
func countSince(h []ActionRecord, since time.Time, keep func(ActionRecord) bool) (int, time.Time) {
	n := 0
	var oldest time.Time
	for i := len(h) - 1; i >= 0 && !h[i].Time.Before(since); i-- {
		if h[i].changedSomething() && keep(h[i]) {
			n++
			oldest = h[i].Time
		}
	}
	return n, oldest
}

// changedSomething is false for attempts known not to have changed anything
// (the action refused at execution, or the journal intent could not be
// written). Pending attempts (a crash mid-action) count.
func (h ActionRecord) changedSomething() bool {
	return h.Outcome != string(OutcomeSkipped) && h.Outcome != "not-run"
}
