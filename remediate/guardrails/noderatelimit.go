package guardrails

import (
	"context"
	"time"
)

// NodeRateWindow is the window of policy.guardrails.maxActionsPerHour.
const NodeRateWindow = time.Hour

// NodeRateLimit enforces guardrails.maxActionsPerHour across rules.
type NodeRateLimit struct {
	L   Ledger
	Max int
}

// Name implements Guardrail.
func (g NodeRateLimit) Name() string { return GuardNodeRate }

// Check implements Guardrail.
func (g NodeRateLimit) Check(_ context.Context, r *Request) error {
	if u := g.L.UnknownHistorySince(); !u.IsZero() && r.Now.Sub(u) < NodeRateWindow {
		return Block(GuardNodeRate, "action history unknown since %s (state file was corrupt): node limit treated as used", u.UTC().Format(time.RFC3339))
	}
	n, oldest := countSince(g.L.Attempts(), r.Now.Add(-NodeRateWindow), func(Attempt) bool { return true })
	if n >= g.Max {
		return Block(GuardNodeRate, "%d actions on this node in the last hour (max %d); next slot at %s", n, g.Max, oldest.Add(NodeRateWindow).UTC().Format(time.RFC3339))
	}
	return nil
}
