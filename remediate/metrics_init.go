package remediate

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/remediate-dev/remediate/detect"
	"github.com/remediate-dev/remediate/internal/conntrack"
	"github.com/remediate-dev/remediate/internal/finding"
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
		m.Interrupted.WithLabelValues(r.Name, r.Action.Type)
		for _, g := range guards {
			m.GuardrailBlocks.WithLabelValues(g, r.Name)
		}
	}
	m.PolicyReloads.WithLabelValues("success")
	m.PolicyReloads.WithLabelValues("invalid")
	zeroGauges(m, p)
}

// severities are the finding severities, each a series of
// remediate_findings per rule.
var severities = []finding.Severity{finding.Info, finding.Warning, finding.Critical}

// zeroGauges resets the per-cycle gauges to the policy's series at 0
// (observe then sets what the cycle saw), except that a rule's findings
// series keep the value of the last cycle that ran its detector: a cycle
// that skipped it or in which it failed observed nothing, and unknown is
// not absent (a 1→0→1 flap would restart every alert's `for`). The skip
// gauge and the error counter say why the value was not renewed.
func zeroGauges(m *Metrics, p *policy.Policy) {
	m.Findings.Reset()
	m.DetectorSkips.Reset()
	m.Escalated.Reset()
	keep := make(map[findingSeries]float64, 3*len(p.Rules))
	for i := range p.Rules {
		r := &p.Rules[i]
		for _, s := range severities {
			k := findingSeries{r.Name, r.Detector.Type, string(s)}
			keep[k] = m.lastFindings[k]
			m.Findings.WithLabelValues(k.rule, k.detector, k.severity).Set(keep[k])
		}
		m.DetectorSkips.WithLabelValues(r.Name, r.Detector.Type)
		if r.Action != nil {
			m.Escalated.WithLabelValues(r.Name)
		}
	}
	// Rules no longer in the policy (or of another detector type) are
	// forgotten.
	m.lastFindings = keep
	zeroConntrackGauges(m)
}

// observeFindings sets the findings gauges of the rules whose detector ran
// this cycle (ran) from the cycle's findings; the others keep their value.
// Findings of other series (remediate's own, under a rule's name) count
// for this cycle only.
func observeFindings(m *Metrics, p *policy.Policy, findings []ReportFinding, ran map[string]bool) {
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

// newConntrackGauges creates the conntrack breakdown gauges. Their labels
// are fixed sets (conntrack.AllClasses; destination, source): bounded
// cardinality, never an address.
func newConntrackGauges() (entries, topShare *prometheus.GaugeVec) {
	entries = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "remediate_conntrack_entries_by_class",
		Help: "Conntrack entries by class (tcp/<state>, udp/stream, udp/unreplied, icmp, ...) from the last cycle's ConntrackExhaustion breakdown; computed only while the table is at or above the rule's utilizationThreshold, 0 otherwise.",
	}, []string{"class"})
	topShare = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "remediate_conntrack_top_share",
		Help: "Share of the conntrack table held by its heaviest original destination (protocol, address, port) or source address, from the same breakdown (the finding names them); 0 when not computed.",
	}, []string{"by"})
	return entries, topShare
}

// zeroConntrackGauges sets every class and both shares to 0.
func zeroConntrackGauges(m *Metrics) {
	if m.ConntrackEntries == nil {
		return
	}
	for _, c := range conntrack.AllClasses() {
		m.ConntrackEntries.WithLabelValues(string(c)).Set(0)
	}
	m.ConntrackTopShare.WithLabelValues("destination").Set(0)
	m.ConntrackTopShare.WithLabelValues("source").Set(0)
}

// observeConntrack sets the conntrack gauges from the cycle's table
// finding's breakdown (the first one: every ConntrackExhaustion rule dumps
// the same table).
func observeConntrack(m *Metrics, findings []ReportFinding) {
	if m.ConntrackEntries == nil {
		return
	}
	for _, f := range findings {
		if f.Detector != detect.ConntrackExhaustionName || f.Target != conntrack.TableTarget {
			continue
		}
		c, ok, err := conntrack.DecodeComposition(f.Evidence)
		if err != nil || !ok || c.Total == 0 {
			continue
		}
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
