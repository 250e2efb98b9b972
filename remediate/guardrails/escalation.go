package guardrails

import "context"

// Escalation blocks targets whose attempts are exhausted.
type Escalation struct{ L Ledger }

// Name implements Guardrail.
func (g Escalation) Name() string { return GuardEscalation }

// Check implements Guardrail.
func (g Escalation) Check(_ context.Context, r *Request) error {
	if n, last, ok := g.L.Escalated(r.Key()); ok {
		return Block(GuardEscalation, "escalated after %d failed attempts (last: %s); no more actions until the finding clears", n, last)
	}
	return nil
}
