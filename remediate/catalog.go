package remediate

import (
	"fmt"
	"slices"
	"strings"

	"github.com/remediate-dev/remediate/detect"
	"github.com/remediate-dev/remediate/internal/finding"
	"github.com/remediate-dev/remediate/policy"
	"github.com/remediate-dev/remediate/remediate/action"
)

// Catalog is the policy.Catalog of the registered detector and action
// types.
type Catalog struct{}

var _ policy.Catalog = Catalog{}

// NewDetectorParams implements policy.Catalog.
func (Catalog) NewDetectorParams(typ string) (any, bool) {
	t, ok := detect.Lookup(typ)
	if !ok {
		return nil, false
	}
	return t.NewParams(), true
}

// NewActionParams implements policy.Catalog.
func (Catalog) NewActionParams(typ string) (any, bool) {
	t, ok := action.Lookup(typ)
	if !ok {
		return nil, false
	}
	return t.NewParams(), true
}

// DetectorTypes implements policy.Catalog.
func (Catalog) DetectorTypes() []string {
	var out []string
	for _, t := range detect.Types() {
		out = append(out, t.Name)
	}
	return out
}

// ActionTypes implements policy.Catalog.
func (Catalog) ActionTypes() []string {
	var out []string
	for _, t := range action.Types() {
		out = append(out, t.Name)
	}
	return out
}

var _ policy.Deprecator = Catalog{}

// DeprecatedAction implements policy.Deprecator: the note of an action
// type kept as an old name of another (action.DeprecatedFor).
func (Catalog) DeprecatedAction(typ string) string {
	if t, ok := action.Lookup(typ); ok && t.ReplacedBy != "" {
		return t.Deprecation
	}
	return ""
}

var _ policy.PairChecker = Catalog{}

// CheckPair implements policy.PairChecker: "" when findings of detector
// type det can feed action type act, else why not, naming the detectors
// that can.
func (Catalog) CheckPair(det, act string) string {
	dt, ok1 := detect.Lookup(det)
	at, ok2 := action.Lookup(act)
	if !ok1 || !ok2 || at.CanActOn(dt.Name, dt.Targets) {
		return ""
	}
	feeders := Feeders(at)
	can := "no registered detector can"
	if len(feeders) > 0 {
		can = "detectors that can: " + strings.Join(feeders, ", ")
	}
	return fmt.Sprintf("detector %s cannot feed action %s: it reports %s targets, the action acts on %s (%s)",
		det, act, KindList(dt.Targets), ActsOn(at), can)
}

// Feeders returns the detector types whose findings can feed action type
// at, sorted by name. Detectors that declare no target kinds are left out
// unless the action takes anything (they are not judged, not known to fit).
func Feeders(at action.Type) []string {
	var out []string
	for _, dt := range detect.Types() {
		known := len(dt.Targets) > 0 || !at.Declared() || at.ActsOnAny || slices.Contains(at.ActsOnDetectors, dt.Name)
		if known && at.CanActOn(dt.Name, dt.Targets) {
			out = append(out, dt.Name)
		}
	}
	return out
}

// ActsOn describes what an action type can act on, for messages and
// `remediate policy types`.
func ActsOn(at action.Type) string {
	switch {
	case !at.Declared():
		return "anything (undeclared)"
	case at.ActsOnAny:
		return "any finding"
	}
	parts := []string{}
	if len(at.ActsOn) > 0 {
		parts = append(parts, KindList(at.ActsOn))
	}
	if len(at.ActsOnDetectors) > 0 {
		parts = append(parts, "findings of "+strings.Join(at.ActsOnDetectors, ", "))
	}
	return strings.Join(parts, " or ")
}

// KindList names target kinds for messages ("undeclared" when empty).
func KindList(ks []finding.Kind) string {
	if len(ks) == 0 {
		return "undeclared"
	}
	s := make([]string, len(ks))
	for i, k := range ks {
		s[i] = string(k)
	}
	return strings.Join(s, ", ")
}
