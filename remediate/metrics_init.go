package remediate

import (
	"github.com/remediate-dev/remediate/detect"
	"github.com/remediate-dev/remediate/policy"
	"github.com/remediate-dev/remediate/remediate/guardrails"
)

// allOutcomes are the decision outcomes, for metrics initialised at 0.
var allOutcomes = []Outcome{OutcomeExecuted, OutcomeDryRun, OutcomeBlocked, OutcomeFailed, OutcomeSkipped}

// initMetrics exports every series the policy can produce, at 0, so a
// dashboard shows 0 rather than "no data" until the first event: findings
// per rule, detector and severity, decisions per rule, action and outcome, action
// durations, detector errors and skips, guardrail blocks per guardrail and
// rule, escalated targets per rule.
func (e *Engine) initMetrics(p *policy.Policy) {
	m := e.opts.Metrics
	if m == nil {
		return
	}
	// The guardrails that can block, in the chain's order (dry-run is not
	// a block).
	cl := e.opts.Cluster
	cl.Extra = append(append([]guardrails.Guardrail(nil), cl.Extra...), e.opts.Guardrails...)
	var guards []string
	for _, g := range guardrails.Chain(guardrails.Node{}, cl, "") {
		if g.Name() != guardrails.GuardDryRun {
			guards = append(guards, g.Name())
		}
	}
	for i := range p.Rules {
		r := &p.Rules[i]
		m.DetectorErrors.WithLabelValues(r.Name, r.Detector.Type)
		if r.Action == nil {
			m.Decisions.WithLabelValues(r.Name, "", string(OutcomeSkipped))
			continue
		}
		for _, o := range allOutcomes {
			m.Decisions.WithLabelValues(r.Name, r.Action.Type, string(o))
		}
		m.ActionDuration.WithLabelValues(r.Action.Type)
		for _, g := range guards {
			m.GuardrailBlocks.WithLabelValues(g, r.Name)
		}
	}
	m.PolicyReloads.WithLabelValues("success")
	m.PolicyReloads.WithLabelValues("invalid")
	zeroGauges(m, p)
}

// zeroGauges resets the per-cycle gauges to the policy's series at 0
// (observe then sets what the cycle saw).
func zeroGauges(m *Metrics, p *policy.Policy) {
	m.Findings.Reset()
	m.DetectorSkips.Reset()
	m.Escalated.Reset()
	for i := range p.Rules {
		r := &p.Rules[i]
		for _, s := range []detect.Severity{detect.Info, detect.Warning, detect.Critical} {
			m.Findings.WithLabelValues(r.Name, r.Detector.Type, string(s))
		}
		m.DetectorSkips.WithLabelValues(r.Name, r.Detector.Type)
		if r.Action != nil {
			m.Escalated.WithLabelValues(r.Name)
		}
	}
}
