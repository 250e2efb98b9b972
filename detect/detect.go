// Package detect holds the detectors: each turns observations of this node
// (procfs, conntrack, iptables rules, kube-proxy's metrics, the cluster view)
// into Findings. Detectors never change anything on the node.
//
// Each detector type registers itself by name (see Register) with a
// parameter struct carrying its thresholds; the policy names the type and
// sets the parameters, and the engine builds one Detector per rule with New.
// A Detector instance lives until the policy is reloaded, so it may keep
// state between cycles (rates, how long a lock has been held).
package detect

import (
	"context"
	"errors"
	"fmt"

	"github.com/remediate-dev/remediate/internal/node"
	"github.com/remediate-dev/remediate/internal/registry"
)

// Severity of a finding.
type Severity string

// Severities, in increasing order.
const (
	Info     Severity = "info"
	Warning  Severity = "warning"
	Critical Severity = "critical"
)

// Finding is one problem a detector sees now.
//
// Target is the stable identity of what the finding is about, unique within
// the detector and the same from one cycle to the next while it is the same
// thing: "process/1234@1763712000000" (PID and create time, so a reused PID
// is a new target), "conntrack/table", "ipvs/UDP/10.96.0.10:53",
// "kube-proxy/IPv4". The engine keys its per-target state machine on
// (rule, Target).
//
// Evidence carries what an operator needs to judge the finding and what the
// paired action needs to act (for example "pid" and "createTimeMs"). Values
// must be JSON-encodable.
type Finding struct {
	Detector string         `json:"detector"`
	Target   string         `json:"target"`
	Severity Severity       `json:"severity"`
	Message  string         `json:"message"`
	Evidence map[string]any `json:"evidence,omitempty"`
}

// Detector observes the node and reports what is wrong now. Detect must
// honour ctx (it has a deadline) and must not block on the kernel without
// one. An empty result means "healthy"; an error means "could not tell".
type Detector interface {
	Detect(ctx context.Context) ([]Finding, error)
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
}

var typeRegistry = registry.New[Type]("detector")

// Register adds a detector type. It panics on a duplicate or incomplete
// registration: that is a programming error, found at init.
func Register(t Type) {
	if t.Name == "" || t.NewParams == nil || t.New == nil {
		panic(fmt.Sprintf("detect: incomplete registration %+v", t))
	}
	typeRegistry.Add(t.Name, t)
}

// Lookup returns the registered type with that name.
func Lookup(name string) (Type, bool) { return typeRegistry.Get(name) }

// Types returns all registered types sorted by name.
func Types() []Type { return typeRegistry.All() }

// SkipError says a detector or action cannot run on this node and why (IPVS
// unavailable, no cluster access, kube-proxy in another mode). It is not a
// failure: reports list it as "skipped" with the reason.
type SkipError struct{ Reason string }

func (e *SkipError) Error() string { return "skipped: " + e.Reason }

// Skip returns a *SkipError with a formatted reason.
func Skip(format string, args ...any) error {
	return &SkipError{Reason: fmt.Sprintf(format, args...)}
}

// IsSkip reports whether err is (or wraps) a SkipError and returns its reason.
func IsSkip(err error) (string, bool) {
	var s *SkipError
	if errors.As(err, &s) {
		return s.Reason, true
	}
	return "", false
}
