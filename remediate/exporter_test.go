package remediate

import (
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/remediate-dev/remediate/policy"
	"github.com/remediate-dev/remediate/remediate/guardrails"
)

// recorder is an Exporter that totals what the engine exported, as the
// /metrics counters do (remediate/exporters/prometheusexporter).
type recorder struct {
	guards      []string
	cycles      int
	last        *CycleExport
	clamped     int
	interrupted map[RuleAction]int
}

func (r *recorder) ExportPolicy(_ *policy.Policy, guards []string) { r.guards = guards }
func (r *recorder) ExportReload(bool)                              {}
func (r *recorder) ExportCycle(x *CycleExport) {
	r.cycles++
	r.last = x
	r.clamped += x.ClockClamped
	if r.interrupted == nil {
		r.interrupted = map[RuleAction]int{}
	}
	for _, ia := range x.Interrupted {
		r.interrupted[ia]++
	}
}

// exported is what the harness's engines exported so far.
func (h *harness) exported() *recorder { return h.opts.Exporters[0].(*recorder) }

// TestCycleExportCarriesTheCycle: what the engine used to count into
// Prometheus as it went, it now hands its exporters at the end of the
// cycle (the /metrics counters are built from it): an executed action and
// its duration, a guardrail block (the rule's rate limit), a failed
// detector, the rules that ran; and each policy put in force with the
// guardrails that can block.
func TestCycleExportCarriesTheCycle(t *testing.T) {
	h := newHarness(t)
	src := strings.Replace(enforceRule, "rateLimit: {max: 10, per: 1h}", "rateLimit: {max: 1, per: 1h}", 1) +
		"- name: broken\n  detector: {type: Fake, key: b}\n"
	e := h.engine(mustPolicy(t, src))
	rec := h.exported()
	if len(rec.guards) == 0 || !slices.Contains(rec.guards, guardrails.GuardRuleRate) || slices.Contains(rec.guards, guardrails.GuardDryRun) {
		t.Errorf("ExportPolicy guardrails %v: want the chain's, rule-rate in, dry-run out", rec.guards)
	}
	w.mu.Lock()
	w.fail["b"] = errors.New("boom")
	w.actHook["a"] = func() { h.clock.Step(3 * time.Second) }
	w.mu.Unlock()
	setPresent("a", "process/1", "process/2")
	rep := h.cycle(e)
	x := rec.last
	if rec.cycles != 1 || x.Report != rep || x.Policy != e.Policy() {
		t.Fatalf("%d cycles exported, report %p (want %p)", rec.cycles, x.Report, rep)
	}
	if !x.Ran["fix-it"] || x.Ran["broken"] {
		t.Errorf("Ran %v: want fix-it, not broken", x.Ran)
	}
	if want := []RuleDetector{{"broken", "Fake"}}; !slices.Equal(x.DetectorErrors, want) {
		t.Errorf("DetectorErrors %v, want %v", x.DetectorErrors, want)
	}
	if want := []GuardrailBlock{{guardrails.GuardRuleRate, "fix-it"}}; !slices.Equal(x.GuardrailBlocks, want) {
		t.Errorf("GuardrailBlocks %v, want %v (the second target, over the rule's rate)", x.GuardrailBlocks, want)
	}
	if want := []ActionDuration{{"FakeFix", 3 * time.Second}}; !slices.Equal(x.ActionDurations, want) {
		t.Errorf("ActionDurations %v, want %v", x.ActionDurations, want)
	}
	if x.Duration != 3*time.Second || !x.Finished.Equal(t0.Add(3*time.Second)) {
		t.Errorf("cycle took %s, finished %s: want 3s, %s", x.Duration, x.Finished, t0.Add(3*time.Second))
	}
}
