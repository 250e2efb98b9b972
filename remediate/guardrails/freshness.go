package guardrails

import (
	"context"
	"fmt"
	"time"

	"github.com/remediate-dev/remediate/internal/cluster"
)

// Freshness blocks actions that depend on the Kubernetes API (those that
// declare it, Request.NeedsAPI, and every disruptive one) while the
// cluster view is missing, not yet synced, or disconnected. Node-local
// actions pass.
type Freshness struct {
	view           cluster.View
	noAccessReason string
}

// NewFreshness returns the guardrail. view may be nil (no cluster access);
// then noAccessReason is the reason given.
func NewFreshness(view cluster.View, noAccessReason string) *Freshness {
	return &Freshness{view: view, noAccessReason: noAccessReason}
}

// Name implements Guardrail.
func (g *Freshness) Name() string { return GuardFreshness }

// Check implements Guardrail.
func (g *Freshness) Check(_ context.Context, r *Request) error {
	if !r.Disruptive && !r.NeedsAPI {
		return nil
	}
	if g.view == nil {
		reason := g.noAccessReason
		if reason == "" {
			reason = "no cluster access"
		}
		return Block(g.Name(), "%s needs the Kubernetes API: %s", r.ActionType, reason)
	}
	if why := StaleReason(g.view.Freshness(), r.Now); why != "" {
		return Block(g.Name(), "%s needs a fresh cluster view: %s", r.ActionType, why)
	}
	return nil
}

// StaleReason says why a view with freshness f cannot be trusted at now,
// or "" when it can.
func StaleReason(f cluster.Freshness, now time.Time) string {
	switch {
	case !f.Synced:
		return "cluster view not synced yet (initial list incomplete)"
	case f.OverBudget != "":
		return f.OverBudget
	case !f.Connected:
		if f.LastError != nil {
			return fmt.Sprintf("API server unreachable (last error %s ago): %v",
				now.Sub(f.LastErrorTime).Round(time.Second), f.LastError)
		}
		return "API server unreachable"
	}
	return ""
}
