package remediate

import (
	"github.com/remediate-dev/remediate/detect"
	"github.com/remediate-dev/remediate/internal/finding"
)

// OKCheck is a rule whose detector ran and found nothing, with the figure
// it judged (detect.Judged) when the detector says one.
type OKCheck struct {
	Rule     string `json:"rule"`
	Detector string `json:"detector"`
	// Judged is what was looked at, e.g. "conntrack 12% of max"; "no
	// finding" when the detector does not say.
	Judged string `json:"judged"`
}

// judgedFigure asks a detector that found nothing what it judged.
func judgedFigure(d detect.Detector, fs []finding.Finding, err error) string {
	if err != nil || len(fs) > 0 {
		return ""
	}
	if j, ok := d.(detect.Judged); ok {
		return j.Judged()
	}
	return ""
}

// okChecks lists the rules whose detector ran cleanly with no finding: with
// the findings (a detector that failed is a finding about remediate) and
// the skipped checks, every rule of the cycle appears exactly once.
func okChecks(rules []*ruleRuntime, results []detResult) []OKCheck {
	out := []OKCheck{}
	for i, rr := range rules {
		res := results[i]
		if res.skip != "" || res.err != nil || len(res.findings) > 0 {
			continue
		}
		j := res.judged
		if j == "" {
			j = "no finding"
		}
		out = append(out, OKCheck{Rule: rr.rule.Name, Detector: rr.rule.Detector.Type, Judged: j})
	}
	return out
}
