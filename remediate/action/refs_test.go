package action

import (
	"github.com/remediate-dev/remediate/internal/conntrack"
	"github.com/remediate-dev/remediate/internal/finding"
	"github.com/remediate-dev/remediate/internal/ipvs"
)

// withRefs gives a test finding the typed references its detector sets
// beside the evidence (finding.Subject.Refs), decoded from the evidence the
// test wrote as that detector writes it. Evidence that does not decode
// gives no reference: the action then refuses the finding.
func withRefs(f finding.Finding) finding.Finding {
	ev := f.Evidence
	if r, err := ipvs.DecodeRealRef(ev); err == nil {
		f.Subject.Refs = append(f.Subject.Refs, r)
	} else if v, err := ipvs.DecodeVirtualRef(ev); err == nil {
		f.Subject.Refs = append(f.Subject.Refs, v)
	}
	if b, err := conntrack.DecodeBackendRef(ev); err == nil {
		f.Subject.Refs = append(f.Subject.Refs, b)
	}
	var t conntrack.TableRef
	hasTable := false
	if v, err := finding.EvidenceInt(ev, conntrack.EvidenceMax); err == nil && v >= 0 {
		t.Max, hasTable = uint64(v), true
	}
	if v, err := finding.EvidenceInt(ev, conntrack.EvidenceLastSetMax); err == nil && v > 0 {
		t.LastSetMax, hasTable = uint64(v), true
	}
	if c, ok, err := conntrack.DecodeComposition(ev); err == nil && ok {
		t.Composition, hasTable = &c, true
	}
	if hasTable {
		f.Subject.Refs = append(f.Subject.Refs, t)
	}
	return f
}
