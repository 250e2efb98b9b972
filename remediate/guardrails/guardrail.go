package guardrails

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/remediate-dev/remediate/internal/finding"
	"github.com/remediate-dev/remediate/policy"
)

// Request is what a guardrail judges: one intended action of one rule on one
// target, now.
type Request struct {
	// Rule is the rule that fired.
	Rule *policy.Rule
	// ActionType is the registered action type name.
	ActionType string
	// Disruptive is true for actions that need a cluster-wide budget slot.
	Disruptive bool
	// NeedsAPI is true for actions that act through the Kubernetes API or
	// on the cluster view's data (action.NeedsAPI, declared by the action).
	NeedsAPI bool
	// Finding is the finding being remedied.
	Finding finding.Finding
	// DryRun is true when the action will not be executed (audit mode,
	// rule dryRun, --dry-run). Stateful guardrails must not take
	// resources (such as a budget slot) for a dry run; they still say
	// whether they would block.
	DryRun bool
	// Now is the decision time (from the engine's clock).
	Now time.Time
}

// Key is the (rule, target) identity the request is about (TargetKey).
func (r *Request) Key() string { return TargetKey(r.Rule.Name, r.Finding.Target) }

// TargetKey is the one spelling of a (rule, target) identity: the key of
// the engine's target state, the guardrails' held resources and the
// journal's attempt IDs.
func TargetKey(rule, target string) string { return rule + "|" + target }

// RuleOfKey is the rule of a TargetKey.
func RuleOfKey(key string) string {
	rule, _, _ := strings.Cut(key, "|")
	return rule
}

// Guardrail is one check that may block an action. Check returns nil to
// allow, a *Blocked to block with a reason; any other error also blocks
// (guardrails fail closed) and is reported as the reason.
type Guardrail interface {
	Name() string
	Check(ctx context.Context, r *Request) error
}

// Holder is implemented by guardrails that hold a resource from a successful
// Check until the attempt on that (rule, target) is over (verified,
// failed or escalated), e.g. a cluster-wide budget slot. The engine calls
// Release exactly once per successful non-dry-run Check.
type Holder interface {
	Release(ctx context.Context, r *Request)
}

// Blocked is a guardrail's refusal with its reason.
type Blocked struct {
	Guardrail string
	Reason    string
}

func (b *Blocked) Error() string { return b.Guardrail + ": " + b.Reason }

// Block returns a *Blocked for guardrail g.
func Block(g, format string, args ...any) error {
	return &Blocked{Guardrail: g, Reason: fmt.Sprintf(format, args...)}
}

// AsBlocked turns any guardrail error into a *Blocked: a *Blocked is
// returned as is, any other error becomes "guardrail error (fail closed)".
func AsBlocked(g string, err error) *Blocked {
	if err == nil {
		return nil
	}
	var b *Blocked
	if errors.As(err, &b) {
		return b
	}
	return &Blocked{Guardrail: g, Reason: "guardrail error, failing closed: " + err.Error()}
}
