package prometheusexporter

import (
	"strings"
	"testing"
	"time"

	"github.com/remediate-dev/remediate/policy"
	"github.com/remediate-dev/remediate/remediate"
)

// TestCycleCounters: a CycleExport becomes the engine's families as the
// engine used to count them while it went: decisions from the report,
// detector errors, guardrail blocks, action durations, interrupted
// actions, clamped entries, escalated targets, the cycle's duration and
// end; reload results. Every policy series starts at 0 (ExportPolicy).
func TestCycleCounters(t *testing.T) {
	x := New(Sources{Node: "n1"})
	p := &policy.Policy{Rules: []policy.Rule{
		{Name: "fix-it", Detector: policy.Component{Type: "ExporterTest"}, Action: &policy.Component{Type: "FakeFix"}},
		{Name: "look", Detector: policy.Component{Type: "ExporterTest"}},
	}}
	x.ExportPolicy(p, []string{"cooldown", "rule-rate"})
	start := gatherText(t, x.Gatherer())
	for _, l := range []string{
		`remediate_decisions_total{action="FakeFix",outcome="blocked",rule="fix-it"} 0`,
		`remediate_decisions_total{action="",outcome="skipped",rule="look"} 0`,
		`remediate_guardrail_blocks_total{guardrail="rule-rate",rule="fix-it"} 0`,
		`remediate_escalated_targets{rule="fix-it"} 0`,
		`remediate_actions_interrupted_total{action="FakeFix",rule="fix-it"} 0`,
		`remediate_last_cycle_timestamp_seconds 0`,
	} {
		if !strings.Contains(start, l+"\n") {
			t.Errorf("before any cycle, /metrics lacks %s", l)
		}
	}
	end := time.Unix(1_764_115_200, 0)
	x.ExportCycle(&remediate.CycleExport{
		Report: &remediate.Report{Decisions: []remediate.Decision{
			{Rule: "fix-it", Action: "FakeFix", Outcome: remediate.OutcomeExecuted},
			{Rule: "fix-it", Action: "FakeFix", Outcome: remediate.OutcomeBlocked, Guardrail: "rule-rate"},
			{Rule: "fix-it", Action: "FakeFix", Outcome: remediate.OutcomeBlocked, Guardrail: "escalation"},
			{Rule: "look", Outcome: remediate.OutcomeSkipped},
		}},
		Policy: p, Finished: end, Duration: 1500 * time.Millisecond,
		Ran:             map[string]bool{"fix-it": true},
		DetectorErrors:  []remediate.RuleDetector{{Rule: "look", Detector: "ExporterTest"}},
		GuardrailBlocks: []remediate.GuardrailBlock{{Guardrail: "rule-rate", Rule: "fix-it"}},
		ActionDurations: []remediate.ActionDuration{{Action: "FakeFix", Duration: 3 * time.Second}},
		Interrupted:     []remediate.RuleAction{{Rule: "fix-it", Action: "FakeFix"}},
		ClockClamped:    2,
		Escalated:       map[string]int{"fix-it": 1},
	})
	x.ExportReload(false)
	got := gatherText(t, x.Gatherer())
	for _, l := range []string{
		`remediate_decisions_total{action="FakeFix",outcome="executed",rule="fix-it"} 1`,
		`remediate_decisions_total{action="FakeFix",outcome="blocked",rule="fix-it"} 2`,
		`remediate_decisions_total{action="",outcome="skipped",rule="look"} 1`,
		`remediate_detector_errors_total{detector="ExporterTest",rule="look"} 1`,
		`remediate_guardrail_blocks_total{guardrail="rule-rate",rule="fix-it"} 1`,
		`remediate_guardrail_blocks_total{guardrail="cooldown",rule="fix-it"} 0`,
		`remediate_actions_interrupted_total{action="FakeFix",rule="fix-it"} 1`,
		`remediate_state_future_entries_clamped_total 2`,
		`remediate_escalated_targets{rule="fix-it"} 1`,
		`remediate_last_cycle_timestamp_seconds 1.7641152e+09`,
		`remediate_policy_reloads_total{result="invalid"} 1`,
		`remediate_policy_reloads_total{result="success"} 0`,
	} {
		if !strings.Contains(got, l+"\n") {
			t.Errorf("after the cycle, /metrics lacks %s", l)
		}
	}
	if m, _ := sample(t, x.Gatherer(), "remediate_action_duration_seconds", map[string]string{"action": "FakeFix"}); m.GetHistogram().GetSampleCount() != 1 || m.GetHistogram().GetSampleSum() != 3 {
		t.Errorf("remediate_action_duration_seconds{action=FakeFix}: %v", m.GetHistogram())
	}
	if m, _ := sample(t, x.Gatherer(), "remediate_cycle_duration_seconds", nil); m.GetHistogram().GetSampleCount() != 1 || m.GetHistogram().GetSampleSum() != 1.5 {
		t.Errorf("remediate_cycle_duration_seconds: %v", m.GetHistogram())
	}
}
