package prometheusexporter

import (
	"github.com/prometheus/client_golang/prometheus"
	"time"
)

// engineMetrics are the engine's metrics: what each cycle's report and
// CycleExport say (engine_series.go sets them).
type engineMetrics struct {
	Findings        *prometheus.GaugeVec
	Decisions       *prometheus.CounterVec
	ActionDuration  *prometheus.HistogramVec
	CycleDuration   prometheus.Histogram
	DetectorErrors  *prometheus.CounterVec
	DetectorSkips   *prometheus.GaugeVec
	GuardrailBlocks *prometheus.CounterVec
	Escalated       *prometheus.GaugeVec
	LastCycle       prometheus.Gauge
	PolicyReloads   *prometheus.CounterVec
	// ConntrackEntries and ConntrackTopShare are the last cycle's
	// conntrack breakdown (engine_series.go).
	ConntrackEntries  *prometheus.GaugeVec
	ConntrackTopShare *prometheus.GaugeVec
	// Interrupted counts actions found interrupted (intent journaled, no
	// outcome: the daemon was killed mid-action) and settled
	// (remediate/settle.go).
	Interrupted *prometheus.CounterVec
	// ClockClamped counts state entries dated in the future (the clock
	// ran ahead, then back) clamped to now.
	ClockClamped prometheus.Counter

	// lastFindings is, per policy series of Findings, the value the last
	// cycle that ran the rule's detector set: a rule skipped or failed in
	// a cycle keeps it (engine_series.go, observeFindings).
	lastFindings map[findingSeries]float64
	// lastRan is, per rule, when a cycle last ran its detector to the
	// end: a value not renewed for KeepUnrenewedFor is let go.
	lastRan map[string]time.Time
}

// KeepUnrenewedFor bounds how long a rule's findings series keep the value
// of the last cycle that ran its detector while later cycles skip it or it
// fails: held for ever, a detector that stopped running (a binary gone, a
// permission lost) would keep its alert firing on a value nobody renews.
// Past this, the series go to 0 like a rule that found nothing, and
// remediate_detector_skipped (or remediate_detector_errors_total) says why.
// 10 minutes outlasts the alerts' `for` (5m) and a few transient skips.
const KeepUnrenewedFor = 10 * time.Minute

// findingSeries is one series of remediate_findings.
type findingSeries struct{ rule, detector, severity string }

// newEngineMetrics creates the engine's metrics and registers them on reg.
func newEngineMetrics(reg prometheus.Registerer) *engineMetrics {
	m := &engineMetrics{
		Findings: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "remediate_findings", Help: "Findings present in the last cycle, by rule, detector type and severity.",
		}, []string{"rule", "detector", "severity"}),
		Decisions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "remediate_decisions_total", Help: "Decisions taken, by rule, action and outcome.",
		}, []string{"rule", "action", "outcome"}),
		ActionDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "remediate_action_duration_seconds", Help: "Time taken by executed actions.",
			Buckets: prometheus.ExponentialBuckets(0.01, 2, 14),
		}, []string{"action"}),
		CycleDuration: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "remediate_cycle_duration_seconds", Help: "Time taken by a detection cycle, detectors through actions.",
			Buckets: prometheus.ExponentialBuckets(0.01, 2, 14),
		}),
		DetectorErrors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "remediate_detector_errors_total", Help: "Detector runs that failed, timed out or panicked, by rule.",
		}, []string{"rule", "detector"}),
		DetectorSkips: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "remediate_detector_skipped", Help: "1 when the rule's detector could not run here in the last cycle.",
		}, []string{"rule", "detector"}),
		GuardrailBlocks: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "remediate_guardrail_blocks_total", Help: "Actions blocked, by guardrail and rule.",
		}, []string{"guardrail", "rule"}),
		Escalated: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "remediate_escalated_targets", Help: "Targets escalated (no more actions until the finding clears), by rule.",
		}, []string{"rule"}),
		LastCycle: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "remediate_last_cycle_timestamp_seconds", Help: "Unix time the last cycle finished.",
		}),
		PolicyReloads: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "remediate_policy_reloads_total", Help: "Policy reload attempts by result (success, invalid).",
		}, []string{"result"}),
	}
	m.ConntrackEntries, m.ConntrackTopShare = newConntrackGauges()
	m.zeroConntrackGauges()
	m.Interrupted = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "remediate_actions_interrupted_total", Help: "Actions whose intent was journaled but that never recorded an outcome (the daemon was killed or crashed mid-action), settled as interrupted on the next cycle, by rule and action.",
	}, []string{"rule", "action"})
	m.ClockClamped = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "remediate_state_future_entries_clamped_total", Help: "Guardrail state entries dated in the future (the clock ran ahead) clamped to now.",
	})
	// Exported from the start: the invalid-policy alert uses increase().
	m.PolicyReloads.WithLabelValues("success")
	m.PolicyReloads.WithLabelValues("invalid")
	reg.MustRegister(m.Findings, m.Decisions, m.ActionDuration, m.CycleDuration, m.DetectorErrors,
		m.DetectorSkips, m.GuardrailBlocks, m.Escalated, m.LastCycle, m.PolicyReloads,
		m.ConntrackEntries, m.ConntrackTopShare, m.Interrupted, m.ClockClamped)
	return m
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
