// Package action holds the remedies the engine can apply: killing a hung
// iptables-restore, raising nf_conntrack_max, flushing conntrack entries,
// deleting stale IPVS servers, restarting kube-proxy and the other node
// agents (RestartNodeAgent: the one action that restarts kube-proxy;
// RestartKubeProxy is its old name), cordoning.
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
	"slices"

	"github.com/remediate-dev/remediate/internal/finding"
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
	// gone or ambiguous); return finding.Skip(...) to say so without failing.
	Plan(ctx context.Context, f finding.Finding) (Plan, error)
	// Execute performs the action, bounded by ctx's deadline.
	Execute(ctx context.Context, f finding.Finding) (Result, error)
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
	// NeedsAPI actions act through the Kubernetes API or on the cluster
	// view's data: the api-freshness guardrail blocks them while the view
	// is missing, not synced or disconnected (it blocks every Disruptive
	// action too). An action whose code reads node.Node's API adapters
	// declares it, or APIOptional (TestAPIReadersDeclare).
	NeedsAPI bool
	// APIOptional, when set, says why an action that reads the API
	// adapters still acts safely without a fresh view (it checks the
	// view's freshness itself and refuses what it cannot tell): the
	// freshness guardrail lets it pass.
	APIOptional string
	// NewParams returns a pointer to a fresh parameter struct with defaults.
	NewParams func() any
	// New builds the action from validated parameters and the node adapters.
	New func(params any, n *node.Node) (Action, error)

	// ActsOn are the kinds of target the action understands: a finding
	// about any other kind cannot feed it.
	ActsOn []finding.Kind
	// ActsOnDetectors are detector types the action accepts whatever
	// kinds they declare.
	ActsOnDetectors []string
	// ActsOnAny: the action acts on the node, whatever the finding is
	// about (CordonNode).
	ActsOnAny bool
	// ReplacedBy, when set, names the action that does this one's work
	// now: the type is an old name kept so policies that say it keep
	// working, and Deprecation is the note `policy check` and the load log
	// give.
	ReplacedBy, Deprecation string
}

// Declared reports whether the type says what it can act on; Define
// refuses (panics on) a type that does not.
func (t Type) Declared() bool {
	return t.ActsOnAny || len(t.ActsOn) > 0 || len(t.ActsOnDetectors) > 0
}

// CanActOn reports whether findings of detector type det, whose targets
// are of the given kinds, can feed this action. An undeclared action, or
// a detector that declares no kinds, is not judged (true).
func (t Type) CanActOn(det string, kinds []finding.Kind) bool {
	if !t.Declared() || t.ActsOnAny || slices.Contains(t.ActsOnDetectors, det) {
		return true
	}
	if len(kinds) == 0 {
		return true
	}
	for _, k := range kinds {
		if slices.Contains(t.ActsOn, k) {
			return true
		}
	}
	return false
}

// Option adds a declaration to a Define.
type Option = func(*Type)

// Disruptive marks the action as needing a cluster-wide budget slot.
func Disruptive() Option { return func(t *Type) { t.Disruptive = true } }

// NeedsAPI declares that the action acts through the Kubernetes API or on
// the cluster view's data: the api-freshness guardrail blocks it while the
// view cannot be trusted.
func NeedsAPI() Option { return func(t *Type) { t.NeedsAPI = true } }

// APIOptional declares that the action reads the API adapters only when
// their view is fresh, checking that itself, and acts (or refuses) safely
// without them; why says how. The freshness guardrail lets it pass.
func APIOptional(why string) Option { return func(t *Type) { t.APIOptional = why } }

// ActsOn declares the kinds of target the action can act on.
func ActsOn(kinds ...finding.Kind) Option {
	return func(t *Type) { t.ActsOn = append(t.ActsOn, kinds...) }
}

// ActsOnDetectors declares detector types the action accepts by name.
func ActsOnDetectors(types ...string) Option {
	return func(t *Type) { t.ActsOnDetectors = append(t.ActsOnDetectors, types...) }
}

// DeprecatedFor marks the type as an old name whose work the action
// replacedBy does now; note tells the user what to write instead.
func DeprecatedFor(replacedBy, note string) Option {
	return func(t *Type) { t.ReplacedBy, t.Deprecation = replacedBy, note }
}

// ActsOnAnyFinding declares that the action acts on the node whatever the
// finding is about.
func ActsOnAnyFinding() Option { return func(t *Type) { t.ActsOnAny = true } }

var registered = registry.NewTypes("action", "action", func(t Type) string { return t.Name },
	func(t Type) bool {
		return t.Name != "" && t.NewParams != nil && t.New != nil && t.Declared() && !(t.NeedsAPI && t.APIOptional != "")
	})

// Define registers an action type: the one-line registration. The
// factory's parameter type P is the policy's parameter block for this
// type; defaults come from (*P).SetDefaults, if P has one. It panics on a
// duplicate name (a programming error, found at init).
func Define[P any](name, doc string, factory func(*P, *node.Node) (Action, error), opts ...Option) {
	t := Type{Name: name, Doc: doc}
	t.NewParams, t.New = registry.Typed(name, factory)
	registered.Add(t, opts...)
}

// Lookup returns the registered type with that name.
func Lookup(name string) (Type, bool) { return registered.Get(name) }

// Types returns all registered types sorted by name.
func Types() []Type { return registered.All() }

// refOf returns the typed reference of type T that the finding's subject
// carries (finding.Subject.Refs, set by its detector): the facts an action
// acts on. Actions never decode them from the evidence, which is for
// people.
func refOf[T finding.Ref](f finding.Finding, what string) (T, error) {
	r, ok := finding.RefOf[T](f.Subject)
	if !ok {
		return r, fmt.Errorf("carries no %s reference (Subject.Refs, set by its detector)", what)
	}
	return r, nil
}
