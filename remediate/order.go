package remediate

import (
	"fmt"
	"sort"

	"github.com/remediate-dev/remediate/internal/clip"
	"github.com/remediate-dev/remediate/internal/finding"
)

// maxTargetsPerDetector is how many findings of one rule a cycle keeps;
// the rest are summarised in one finding (a hostile or broken input must
// not become tens of thousands of targets, state entries and report lines).
const maxTargetsPerDetector = 100

// summaryTarget is the target of the finding that summarises the findings
// over maxTargetsPerDetector.
const summaryTarget = "findings/over-limit"

// orderTargets returns findings in the order they are acted on, so that
// when a rate limit or budget allows only some, the most urgent get it:
// severity (critical first), then the subject (a lock holder, then a lock
// waiter, then the rest), then age (oldest first), then target name for a
// stable order. The input is not modified.
func orderTargets(findings []finding.Finding) []finding.Finding {
	out := append([]finding.Finding(nil), findings...)
	sort.SliceStable(out, func(i, j int) bool {
		a, b := out[i], out[j]
		if sa, sb := severityRank(a.Severity), severityRank(b.Severity); sa != sb {
			return sa > sb
		}
		if ea, eb := lockRank(a), lockRank(b); ea != eb {
			return ea > eb
		}
		if aa, ab := age(a), age(b); aa != ab {
			return aa > ab
		}
		return a.Target < b.Target
	})
	return out
}

func severityRank(s finding.Severity) int {
	switch s {
	case finding.Critical:
		return 3
	case finding.Warning:
		return 2
	case finding.Info:
		return 1
	}
	return 0
}

func lockRank(f finding.Finding) int {
	p := f.Subject.Process
	switch {
	case p == nil:
	case p.HoldsXtablesLock:
		return 2
	case p.WaitsOnXtablesLock:
		return 1
	}
	return 0
}

// age is how long the finding's target has been in this state
// (finding.Subject.AgeSeconds: a holder's hold, a process's age); 0 if
// not known.
func age(f finding.Finding) float64 {
	if v := f.Subject.AgeSeconds; v == v {
		return v
	}
	return 0
}

// capTargets keeps the first maxTargetsPerDetector findings (in acting
// order) and replaces the rest by one summary finding.
func capTargets(detector string, ordered []finding.Finding) []finding.Finding {
	if len(ordered) <= maxTargetsPerDetector {
		return ordered
	}
	kept := append([]finding.Finding(nil), ordered[:maxTargetsPerDetector]...)
	rest := ordered[maxTargetsPerDetector:]
	counts := map[finding.Severity]int{}
	for _, f := range rest {
		counts[f.Severity]++
	}
	sev := finding.Info
	for _, s := range []finding.Severity{finding.Warning, finding.Critical} {
		if counts[s] > 0 {
			sev = s
		}
	}
	return append(kept, finding.Finding{
		Detector: detector,
		Target:   summaryTarget,
		Severity: sev,
		Message: fmt.Sprintf("%d more findings not listed (at most %d targets per detector and cycle): %d critical, %d warning, %d info",
			len(rest), maxTargetsPerDetector, counts[finding.Critical], counts[finding.Warning], counts[finding.Info]),
		Evidence: map[string]any{"omitted": len(rest), "limit": maxTargetsPerDetector, "firstOmittedTarget": rest[0].Target},
	})
}

// withKind fills in the kind of the finding's subject from its detector
// type's declaration (detect.Targets) when the detector left it empty and
// declared exactly one kind. The summary finding of capTargets is about no
// target and gets none.
func withKind(f finding.Finding, declared []finding.Kind) finding.Finding {
	if f.Subject.Kind == "" && len(declared) == 1 && f.Target != summaryTarget {
		f.Subject.Kind = declared[0]
	}
	return f
}

// boundFinding clips what a detector copied from outside (a command line, a
// response body) before it goes into the report, the state, the journal
// and the Node: the message and every evidence string to clip.Max bytes,
// evidence lists and maps to 64 elements. Numbers and booleans, which
// actions read, are kept as they are.
func boundFinding(f finding.Finding) finding.Finding {
	f.Target = clip.String(f.Target, 1024)
	f.Message = clip.String(f.Message, clip.Max)
	f.Evidence = clip.Values(f.Evidence, clip.Max)
	return f
}
