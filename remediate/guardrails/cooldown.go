package guardrails

import (
	"context"
	"time"
)

// Cooldown spaces actions of a rule on one target (rule.cooldown).
type Cooldown struct{ L Ledger }

// Name implements Guardrail.
func (g Cooldown) Name() string { return GuardCooldown }

// Check implements Guardrail.
func (g Cooldown) Check(_ context.Context, r *Request) error {
	cd := r.Rule.Cooldown.Duration
	if cd <= 0 {
		return nil
	}
	if u := g.L.UnknownHistorySince(); !u.IsZero() && r.Now.Sub(u) < cd {
		return Block(GuardCooldown, "action history unknown since %s (state file was corrupt): treated as recent; next allowed after %s", u.UTC().Format(time.RFC3339), u.Add(cd).UTC().Format(time.RFC3339))
	}
	h := g.L.Attempts()
	for i := len(h) - 1; i >= 0; i-- {
		a := h[i]
		if a.Rule == r.Rule.Name && a.Target == r.Finding.Target && a.Changed {
			if r.Now.Sub(a.Time) < cd {
				return Block(GuardCooldown, "last action on this target at %s; cooldown %s until %s", a.Time.UTC().Format(time.RFC3339), cd, a.Time.Add(cd).UTC().Format(time.RFC3339))
			}
			break
		}
	}
	return nil
}
