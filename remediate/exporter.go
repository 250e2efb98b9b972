package remediate

import (
	"time"

	"github.com/remediate-dev/remediate/policy"
	"github.com/remediate-dev/remediate/remediate/guardrails"
)

// Exporter receives what the engine puts in force and what each cycle saw
// and did, for a monitoring system: the engine hands every policy and every
// cycle's report to its exporters (Options.Exporters), as
// node-problem-detector hands its problems to its exporters.
// remediate/exporters/prometheusexporter is the one behind /metrics. The
// engine calls ExportPolicy and ExportCycle under its lock, one at a time;
// ExportReload may come at any time. An exporter only records: it must not
// block, nor read the node.
type Exporter interface {
	// ExportPolicy is called when a policy comes into force (New, every
	// reload), with the guardrails that can block its actions (the
	// chain's names, in order, dry-run excluded): the exporter exports
	// the series the policy can produce from the start.
	ExportPolicy(p *policy.Policy, guardrails []string)
	// ExportCycle is called at the end of every cycle.
	ExportCycle(c *CycleExport)
	// ExportReload is told how a policy reload ended: ok, the new policy
	// is in force; else it was rejected and the old one kept.
	ExportReload(ok bool)
}

// CycleExport is what a cycle hands its exporters: its report, and the
// figures and events of the cycle the report does not carry. It is built
// by the engine during the cycle; exporters only read it.
type CycleExport struct {
	// Report is the cycle's report.
	Report *Report
	// Policy is the policy the cycle ran.
	Policy *policy.Policy
	// Finished is when the cycle ended; Duration how long it took.
	Finished time.Time
	Duration time.Duration
	// Ran are the rules whose detector ran to the end this cycle (neither
	// skipped nor failed): only their findings were observed.
	Ran map[string]bool
	// DetectorErrors are the rules whose detector failed, hung or
	// panicked.
	DetectorErrors []RuleDetector
	// GuardrailBlocks are the actions a guardrail blocked (dry-run and
	// escalation are not blocks here).
	GuardrailBlocks []GuardrailBlock
	// ActionDurations are the executed actions and how long each ran.
	ActionDurations []ActionDuration
	// Interrupted are the actions found interrupted and settled.
	Interrupted []RuleAction
	// ClockClamped counts the state entries dated in the future clamped
	// to now.
	ClockClamped int
	// Escalated counts the escalated targets by rule, in the state the
	// cycle left.
	Escalated map[string]int
}

// RuleDetector names a rule and its detector type.
type RuleDetector struct{ Rule, Detector string }

// RuleAction names a rule and its action type.
type RuleAction struct{ Rule, Action string }

// GuardrailBlock is one action a guardrail blocked.
type GuardrailBlock struct{ Guardrail, Rule string }

// ActionDuration is how long one executed action ran.
type ActionDuration struct {
	Action   string
	Duration time.Duration
}

// exportPolicy hands p to the exporters with the guardrails that can block.
func (e *Engine) exportPolicy(p *policy.Policy) {
	if len(e.opts.Exporters) == 0 {
		return
	}
	guards := guardrails.BlockNames(e.opts.Cluster)
	for _, x := range e.opts.Exporters {
		x.ExportPolicy(p, guards)
	}
}

// exportCycle completes x from the cycle's results and state and hands it
// to the exporters.
func (e *Engine) exportCycle(x *CycleExport, results []detResult, st *State) {
	if len(e.opts.Exporters) == 0 {
		return
	}
	x.Finished = e.opts.Clock.Now()
	x.Duration = x.Finished.Sub(x.Report.Time)
	x.Ran = make(map[string]bool, len(e.rules))
	for i, rr := range e.rules {
		if results[i].skip == "" && results[i].err == nil {
			x.Ran[rr.rule.Name] = true
		}
	}
	x.Escalated = map[string]int{}
	for k, ts := range st.Targets {
		if ts.Phase == PhaseEscalated {
			x.Escalated[guardrails.RuleOfKey(k)]++
		}
	}
	for _, ex := range e.opts.Exporters {
		ex.ExportCycle(x)
	}
}

// PolicyReloaded tells the exporters how a policy reload ended (err nil:
// the policy given to SetPolicy is in force; else the old one is kept).
func (e *Engine) PolicyReloaded(err error) {
	for _, x := range e.opts.Exporters {
		x.ExportReload(err == nil)
	}
}
