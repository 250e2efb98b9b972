// Package action holds the remedies the engine can apply: killing a hung
// iptables-restore, raising nf_conntrack_max, flushing conntrack entries,
// deleting stale IPVS servers, restarting kube-proxy, cordoning.
//
// Each action type registers itself by name with a parameter struct (its
// bounds). An Action is always called through the engine, which journals the
// intent before Execute and the outcome after, and applies every guardrail
// first. Actions still re-check their own preconditions immediately before
// changing anything (the world may have moved since detection) and refuse
// when the target's identity is ambiguous.
package action

import (
	"context"
	"fmt"

	"github.com/remediate-dev/remediate/detect"
	"github.com/remediate-dev/remediate/internal/node"
	"github.com/remediate-dev/remediate/internal/registry"
)

// Plan describes what Execute would do, computed without side effects. It is
// what audit mode and dry-run report. Summary is imperative ("kill pid 1234
// ..."): the engine prefixes "would" for dry runs.
type Plan struct {
	Summary string         `json:"summary"`
	Details map[string]any `json:"details,omitempty"`
}

// Result is what Execute did. Details should include previous values (for
// example the old nf_conntrack_max) so an operator can undo from the journal.
type Result struct {
	Summary string         `json:"summary"`
	Details map[string]any `json:"details,omitempty"`
}

// Action remedies one finding.
type Action interface {
	// Plan returns what Execute would do for f. It must not change anything.
	// An error means the action cannot apply (for example the target is
	// gone or ambiguous); return detect.Skip(...) to say so without failing.
	Plan(ctx context.Context, f detect.Finding) (Plan, error)
	// Execute performs the action, bounded by ctx's deadline.
	Execute(ctx context.Context, f detect.Finding) (Result, error)
}

// Type describes a registered action type.
type Type struct {
	// Name is the type name used in the policy (e.g. "KillProcess").
	Name string
	// Doc is a one-line description.
	Doc string
	// Disruptive actions (restart kube-proxy, cordon, delete IPVS servers)
	// additionally need a cluster-wide budget slot.
	Disruptive bool
	// NewParams returns a pointer to a fresh parameter struct with defaults.
	NewParams func() any
	// New builds the action from validated parameters and the node adapters.
	New func(params any, n *node.Node) (Action, error)
}

var typeRegistry = registry.New[Type]("action")

// Register adds a action type. It panics on a duplicate or incomplete
// registration: that is a programming error, found at init.
func Register(t Type) {
	if t.Name == "" || t.NewParams == nil || t.New == nil {
		panic(fmt.Sprintf("action: incomplete registration %+v", t))
	}
	typeRegistry.Add(t.Name, t)
}

// Lookup returns the registered type with that name.
func Lookup(name string) (Type, bool) { return typeRegistry.Get(name) }

// Types returns all registered types sorted by name.
func Types() []Type { return typeRegistry.All() }
