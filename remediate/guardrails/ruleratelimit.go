package guardrails

import (
	"context"
	"time"
)

// RuleRateLimit enforces rule.rateLimit {max, per}.
type RuleRateLimit struct{ L Ledger }

// Name implements Guardrail.
func (g RuleRateLimit) Name() string { return GuardRuleRate }

// Check implements Guardrail.
func (g RuleRateLimit) Check(_ context.Context, r *Request) error {
	rl := r.Rule.RateLimit
	if u := g.L.UnknownHistorySince(); !u.IsZero() && r.Now.Sub(u) < rl.Per.Duration {
		return Block(GuardRuleRate, "action history unknown since %s (state file was corrupt): rate limit %d per %s treated as used", u.UTC().Format(time.RFC3339), rl.Max, rl.Per.Duration)
	}
	n, oldest := countSince(g.L.Attempts(), r.Now.Add(-rl.Per.Duration), func(a Attempt) bool { return a.Rule == r.Rule.Name })
	if n >= rl.Max {
		return Block(GuardRuleRate, "%d actions of this rule in the last %s (max %d); next slot at %s", n, rl.Per.Duration, rl.Max, oldest.Add(rl.Per.Duration).UTC().Format(time.RFC3339))
	}
	return nil
}
