// Package detect holds the detectors: each turns observations of this node
// (procfs, conntrack, iptables rules, kube-proxy's metrics, the cluster view)
// into Findings. Detectors never change anything on the node.
//
// Each detector type registers itself in one line with Define: its name,
// a one-line doc, a factory taking its parameter struct, and the kinds of
// target its findings are about:
//
//	func init() {
//		detect.Define("HungIPTablesRestore", "doc ...", newHungRestore, detect.Targets(finding.KindProcess))
//	}
//	func newHungRestore(p *HungIPTablesRestoreParams, n *node.Node) (detect.Detector, error)
//
// The parameter type is checked at compile time; its defaults come from
// the type itself (a SetDefaults method on the pointer, see
// registry.Defaulter), its validation from a Validate method
// (policy.Validator). The policy names the type and sets the parameters,
// and the engine builds one Detector per rule. A Detector instance lives
// until the policy is reloaded, so it may keep state between cycles
// (rates, how long a lock has been held).
package detect

import (
	"context"
	"time"

	"github.com/remediate-dev/remediate/internal/finding"
	"github.com/remediate-dev/remediate/internal/node"
	"github.com/remediate-dev/remediate/internal/registry"
)

// Detector observes the node and reports what is wrong now. Detect must
// honour ctx (it has a deadline) and must not block on the kernel without
// one. An empty result means "healthy"; an error means "could not tell".
type Detector interface {
	Detect(ctx context.Context) ([]finding.Finding, error)
}

// Type describes a registered detector type.
type Type struct {
	// Name is the type name used in the policy (e.g. "HungIPTablesRestore").
	Name string
	// Doc is a one-line description shown by `remediate policy types`.
	Doc string
	// NewParams returns a pointer to a fresh parameter struct with defaults.
	NewParams func() any
	// New builds a detector from validated parameters (the value NewParams
	// returned, filled from the policy) and the node's adapters.
	New func(params any, n *node.Node) (Detector, error)
	// Targets are the kinds of target this detector's findings are about.
	// Empty means undeclared: the policy loader then cannot check which
	// actions it can feed and lets any pairing through.
	Targets []finding.Kind
	// Windowed marks a detector that judges across samples (a rate, a
	// delta, a growth, a hold time): its first run has no verdict. The
	// one-shot run (remediate --once --sample) samples these twice.
	Windowed bool
}

// Option adds a declaration to a Define.
type Option = func(*Type)

// Targets declares the kinds of target the detector's findings are about.
func Targets(kinds ...finding.Kind) Option {
	return func(t *Type) { t.Targets = append(t.Targets, kinds...) }
}

// Windowed declares that the detector judges across samples (rates,
// histogram deltas, growth, hold times), so its first run cannot judge.
func Windowed() Option {
	return func(t *Type) { t.Windowed = true }
}

// SampleCounted is implemented by the parameters of a detector whose
// criterion counts samples (KubeProxyEndpointChangesPending's scrapes): a
// one-shot run that takes n samples caps the count to n, so the criterion
// can be met in one run. It reports whether it changed anything.
type SampleCounted interface {
	CapSamples(n int) bool
}

var registered = registry.NewTypes("detect", "detector", func(t Type) string { return t.Name },
	func(t Type) bool { return t.Name != "" && t.NewParams != nil && t.New != nil })

// Lookup returns the registered type with that name.
func Lookup(name string) (Type, bool) { return registered.Get(name) }

// Types returns all registered types sorted by name.
func Types() []Type { return registered.All() }

// Define registers a detector type: the one-line registration. The
// factory's parameter type P is the policy's parameter block for this
// type; defaults come from (*P).SetDefaults, if P has one. It panics on a
// duplicate name (a programming error, found at init).
func Define[P any](name, doc string, factory func(*P, *node.Node) (Detector, error), opts ...Option) {
	t := Type{Name: name, Doc: doc}
	t.NewParams, t.New = registry.Typed(name, factory)
	registered.Add(t, opts...)
}

// halfOfDeadline returns ctx bounded to half of the time left before its
// deadline (ctx itself when it has none): a detector's optional or
// fallible step (asking a possibly frozen kube-proxy, a conntrack
// breakdown) leaves the rest of the detector's time to what follows.
func halfOfDeadline(ctx context.Context) (context.Context, context.CancelFunc) {
	dl, ok := ctx.Deadline()
	if !ok {
		return context.WithCancel(ctx)
	}
	return context.WithTimeout(ctx, time.Until(dl)/2)
}
