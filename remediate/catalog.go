package remediate

import (
	"github.com/remediate-dev/remediate/detect"
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
