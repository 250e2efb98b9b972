package guardrails

import (
	"context"

	"github.com/remediate-dev/remediate/policy"
)

// DryRun turns the action into a report: audit mode, the rule's dryRun, or
// --dry-run. It runs last so that an audit report shows what enforce mode
// would do, including blocks by the other guardrails. Why is DryRunReason.
type DryRun struct{ Why string }

// Name implements Guardrail.
func (g DryRun) Name() string { return GuardDryRun }

// Check implements Guardrail.
func (g DryRun) Check(_ context.Context, r *Request) error {
	if r.DryRun {
		return Block(GuardDryRun, "%s", g.Why)
	}
	return nil
}

// DryRunReason says why a rule's actions are dry runs, or "" if they are
// not.
func DryRunReason(p *policy.Policy, r *policy.Rule, force bool) string {
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
