package remediate

import (
	"errors"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/remediate-dev/remediate/internal/finding"
)

const twoReportRules = `mode: audit
rules:
- name: watched
  detector: {type: Fake, key: a}
- name: other
  detector: {type: Fake, key: b}
`

// TestFindingsGaugeKeepsValueWhileSkippedOrFailed: a rule whose detector
// is skipped or fails in a cycle did not observe anything, so its findings
// gauge keeps the value of the last cycle it ran (unknown is not absent,
// as for the target states) and remediate_detector_skipped says why; a
// 1→0→1 flap would restart every alert's `for` (issue 29 bug). A rule
// that ran and found nothing goes to 0 at once.
func TestFindingsGaugeKeepsValueWhileSkippedOrFailed(t *testing.T) {
	h := newHarness(t)
	reg := prometheus.NewRegistry()
	h.opts.Metrics = NewMetrics(reg)
	e := h.engine(mustPolicy(t, twoReportRules))
	want := func(step, rule string, findings, skipped float64) {
		t.Helper()
		m := h.opts.Metrics
		if got := gaugeValue(t, m.Findings.WithLabelValues(rule, "Fake", string(finding.Critical))); got != findings {
			t.Errorf("%s: remediate_findings{rule=%q,severity=critical} = %v, want %v", step, rule, got, findings)
		}
		if got := gaugeValue(t, m.DetectorSkips.WithLabelValues(rule, "Fake")); got != skipped {
			t.Errorf("%s: remediate_detector_skipped{rule=%q} = %v, want %v", step, rule, got, skipped)
		}
	}
	setPresent("a", "process/1", "process/2")
	setPresent("b", "process/3")
	h.cycle(e)
	want("cycle 1 (both ran)", "watched", 2, 0)
	want("cycle 1 (both ran)", "other", 1, 0)

	w.mu.Lock()
	w.fail["a"] = finding.Skip("transient: source not readable this cycle")
	w.mu.Unlock()
	setPresent("b")
	rep := h.cycle(e)
	if len(rep.Skipped) != 1 || rep.Skipped[0].Rule != "watched" {
		t.Fatalf("cycle 2 skipped %+v, want watched", rep.Skipped)
	}
	want("cycle 2 (watched skipped)", "watched", 2, 1)
	want("cycle 2 (other ran, found nothing)", "other", 0, 0)

	w.mu.Lock()
	w.fail["a"] = errors.New("boom")
	w.mu.Unlock()
	h.cycle(e)
	want("cycle 3 (watched failed)", "watched", 2, 0)

	w.mu.Lock()
	delete(w.fail, "a")
	w.mu.Unlock()
	setPresent("a", "process/1")
	h.cycle(e)
	want("cycle 4 (watched ran again)", "watched", 1, 0)

	// The series set stays the policy's: no series for a skipped rule
	// goes missing, none appears for a rule no longer in the policy.
	if err := e.SetPolicy(mustPolicy(t, strings.Replace(twoReportRules, "name: other", "name: renamed", 1))); err != nil {
		t.Fatal(err)
	}
	want("after a reload", "watched", 1, 0)
	if n := seriesCount(t, reg, "remediate_findings"); n != 6 {
		t.Errorf("%d remediate_findings series after the reload, want 6 (2 rules × 3 severities)", n)
	}
	want("after a reload", "renamed", 0, 0)
}
