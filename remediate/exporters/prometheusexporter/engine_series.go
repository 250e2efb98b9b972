package prometheusexporter

import (
	"github.com/remediate-dev/remediate/detect"
	"github.com/remediate-dev/remediate/internal/conntrack"
	"github.com/remediate-dev/remediate/internal/finding"
	"github.com/remediate-dev/remediate/policy"
	"github.com/remediate-dev/remediate/remediate"
	"time"
)

// allOutcomes are the decision outcomes, for metrics initialised at 0.
var allOutcomes = []remediate.Outcome{remediate.OutcomeExecuted, remediate.OutcomeDryRun,
	remediate.OutcomeBlocked, remediate.OutcomeFailed, remediate.OutcomeSkipped}

// severities are the finding severities, each a series of
// remediate_findings per rule.
var severities = []finding.Severity{finding.Info, finding.Warning, finding.Critical}

// exportPolicy exports every series the policy can produce, at 0, so a
// dashboard shows 0 rather than "no data" until the first event: findings
// per rule, detector and severity, decisions per rule, action and outcome,
// action durations, detector errors and skips, guardrail blocks per
// guardrail (guards, in the chain's order) and rule, escalated targets per
// rule.
func (m *engineMetrics) exportPolicy(p *policy.Policy, guards []string) {
	for i := range p.Rules {
		r := &p.Rules[i]
		m.DetectorErrors.WithLabelValues(r.Name, r.Detector.Type)
		if r.Action == nil {
			m.Decisions.WithLabelValues(r.Name, "", string(remediate.OutcomeSkipped))
			continue
		}
		for _, o := range allOutcomes {
			m.Decisions.WithLabelValues(r.Name, r.Action.Type, string(o))
		}
		m.ActionDuration.WithLabelValues(r.Action.Type)
		m.Interrupted.WithLabelValues(r.Name, r.Action.Type)
		for _, g := range guards {
			m.GuardrailBlocks.WithLabelValues(g, r.Name)
		}
	}
	m.PolicyReloads.WithLabelValues("success")
	m.PolicyReloads.WithLabelValues("invalid")
	m.zeroGauges(p, time.Time{}, nil)
	if !hasConntrackRule(p) {
		m.zeroConntrackGauges() // nothing will renew them
	}
}

// hasConntrackRule says whether p has a ConntrackExhaustion rule, the
// source of the conntrack breakdown gauges.
func hasConntrackRule(p *policy.Policy) bool {
	for i := range p.Rules {
		if p.Rules[i].Detector.Type == detect.ConntrackExhaustionName {
			return true
		}
	}
	return false
}

// exportCycle sets the metrics from a cycle: counters from its decisions
// and events, gauges from its report and the state it left.
func (m *engineMetrics) exportCycle(x *remediate.CycleExport) {
	rep := x.Report
	m.CycleDuration.Observe(x.Duration.Seconds())
	m.LastCycle.Set(float64(x.Finished.Unix()))
	for _, d := range rep.Decisions {
		m.Decisions.WithLabelValues(d.Rule, d.Action, string(d.Outcome)).Inc()
	}
	for _, de := range x.DetectorErrors {
		m.DetectorErrors.WithLabelValues(de.Rule, de.Detector).Inc()
	}
	for _, b := range x.GuardrailBlocks {
		m.GuardrailBlocks.WithLabelValues(b.Guardrail, b.Rule).Inc()
	}
	for _, ad := range x.ActionDurations {
		m.ActionDuration.WithLabelValues(ad.Action).Observe(ad.Duration.Seconds())
	}
	for _, ia := range x.Interrupted {
		m.Interrupted.WithLabelValues(ia.Rule, ia.Action).Inc()
	}
	if x.ClockClamped > 0 {
		m.ClockClamped.Add(float64(x.ClockClamped))
	}
	m.zeroGauges(x.Policy, x.Finished, x.Ran)
	m.observeFindings(x.Policy, rep.Findings, x.Ran)
	m.observeConntrack(x.Policy, rep.Findings, x.Ran, x.Finished)
	for _, s := range rep.Skipped {
		m.DetectorSkips.WithLabelValues(s.Rule, s.Detector).Set(1)
	}
	for rule, n := range x.Escalated {
		m.Escalated.WithLabelValues(rule).Add(float64(n))
	}
}

// zeroGauges resets the per-cycle gauges to the policy's series at 0
// (exportCycle then sets what the cycle saw), except that a rule's
// findings series keep the value of the last cycle that ran its detector:
// a cycle that skipped it or in which it failed observed nothing, and
// unknown is not absent (a 1→0→1 flap would restart every alert's `for`).
// The skip gauge and the error counter say why the value was not renewed;
// a value not renewed for KeepUnrenewedFor (now against the last cycle
// that ran the rule, ran this cycle's) goes to 0. The conntrack breakdown
// gauges, a fixed set, are not reset here (observeConntrack, which reads
// lastRan for the same bound).
func (m *engineMetrics) zeroGauges(p *policy.Policy, now time.Time, ran map[string]bool) {
	m.Findings.Reset()
	m.DetectorSkips.Reset()
	m.Escalated.Reset()
	keep := make(map[findingSeries]float64, 3*len(p.Rules))
	lastRan := make(map[string]time.Time, len(p.Rules))
	for i := range p.Rules {
		r := &p.Rules[i]
		last := m.lastRan[r.Name]
		if ran[r.Name] || last.IsZero() {
			// Ran now, or not yet timed (a new policy's rule): from now
			// (zero at a policy's export, which judges nothing).
			last = now
		}
		lastRan[r.Name] = last
		stale := !now.IsZero() && now.Sub(last) > KeepUnrenewedFor
		for _, s := range severities {
			k := findingSeries{r.Name, r.Detector.Type, string(s)}
			if !stale {
				keep[k] = m.lastFindings[k]
			}
			m.Findings.WithLabelValues(k.rule, k.detector, k.severity).Set(keep[k])
		}
		m.DetectorSkips.WithLabelValues(r.Name, r.Detector.Type)
		if r.Action != nil {
			m.Escalated.WithLabelValues(r.Name)
		}
	}
	// Rules no longer in the policy (or of another detector type) are
	// forgotten.
	m.lastFindings, m.lastRan = keep, lastRan
}

// observeFindings sets the findings gauges of the rules whose detector ran
// this cycle (ran) from the cycle's findings; the others keep their value.
// Findings of other series (remediate's own, under a rule's name) count
// for this cycle only.
func (m *engineMetrics) observeFindings(p *policy.Policy, findings []remediate.ReportFinding, ran map[string]bool) {
	for i := range p.Rules {
		r := &p.Rules[i]
		if !ran[r.Name] {
			continue
		}
		for _, s := range severities {
			k := findingSeries{r.Name, r.Detector.Type, string(s)}
			m.lastFindings[k] = 0
			m.Findings.WithLabelValues(k.rule, k.detector, k.severity).Set(0)
		}
	}
	for _, f := range findings {
		k := findingSeries{f.Rule, f.Detector, string(f.Severity)}
		m.Findings.WithLabelValues(k.rule, k.detector, k.severity).Inc()
		if _, policySeries := m.lastFindings[k]; policySeries {
			m.lastFindings[k]++
		}
	}
}

// zeroConntrackGauges sets every class and both shares to 0 (the fixed
// label set, exported from the start).
func (m *engineMetrics) zeroConntrackGauges() {
	for _, c := range conntrack.AllClasses() {
		m.ConntrackEntries.WithLabelValues(string(c)).Set(0)
	}
	m.ConntrackTopShare.WithLabelValues("destination").Set(0)
	m.ConntrackTopShare.WithLabelValues("source").Set(0)
}

// observeConntrack sets the conntrack gauges from the cycle's table
// finding's breakdown (the first one: every ConntrackExhaustion rule dumps
// the same table), or to 0 when a ConntrackExhaustion rule ran and found
// no breakdown. When none ran (skipped or failed) the gauges keep their
// value, as the findings do, and for as long: when no ConntrackExhaustion
// rule ran for KeepUnrenewedFor (lastRan, kept by zeroGauges, which runs
// first), they go to 0.
func (m *engineMetrics) observeConntrack(p *policy.Policy, findings []remediate.ReportFinding, ran map[string]bool, now time.Time) {
	observed, stale := false, true
	for i := range p.Rules {
		r := &p.Rules[i]
		if r.Detector.Type != detect.ConntrackExhaustionName {
			continue
		}
		observed = observed || ran[r.Name]
		if last, ok := m.lastRan[r.Name]; !ok || now.IsZero() || now.Sub(last) <= KeepUnrenewedFor {
			stale = false
		}
	}
	if !observed {
		if stale {
			m.zeroConntrackGauges()
		}
		return
	}
	m.zeroConntrackGauges()
	for _, f := range findings {
		if f.Detector != detect.ConntrackExhaustionName || f.Target != conntrack.TableTarget {
			continue
		}
		ref, ok := finding.RefOf[conntrack.TableRef](f.Subject)
		if !ok || ref.Composition == nil || ref.Composition.Total == 0 {
			continue
		}
		c := *ref.Composition
		for _, cc := range c.Classes {
			m.ConntrackEntries.WithLabelValues(string(cc.Class)).Set(float64(cc.Count))
		}
		if len(c.TopDestinations) > 0 {
			m.ConntrackTopShare.WithLabelValues("destination").Set(float64(c.TopDestinations[0].Count) / float64(c.Total))
		}
		if len(c.TopSources) > 0 {
			m.ConntrackTopShare.WithLabelValues("source").Set(float64(c.TopSources[0].Count) / float64(c.Total))
		}
		return
	}
}
