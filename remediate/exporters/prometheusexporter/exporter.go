// Package prometheusexporter is remediate's one Prometheus exporter: every
// remediate_* family /metrics serves is defined and registered here, as
// node-problem-detector's pkg/exporters/prometheusexporter. The engine
// hands it each policy it puts in force and each cycle's report
// (remediate.Exporter); collectors read, at scrape time, what the
// detectors last observed through the Sources cmd/remediate wires (nothing
// is read from the kernel or kube-proxy at scrape time). docs/METRICS.md
// lists the families; the layering test keeps Prometheus registration out
// of every other package.
//
// Files: engine.go and engine_series.go the engine's families (findings,
// decisions, guardrails, cycles), kubeproxy.go kube-proxy's sync figures
// as last scraped, lockhold.go the xtables lock hold histogram, trends.go
// the trend gauges (rule counts, conntrack, IPVS), nodeinfo.go the node
// and fleet-pause series.
package prometheusexporter

import (
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/remediate-dev/remediate/internal/conntrack"
	"github.com/remediate-dev/remediate/internal/iptables"
	"github.com/remediate-dev/remediate/internal/ipvs"
	"github.com/remediate-dev/remediate/internal/kubeproxy"
	"github.com/remediate-dev/remediate/internal/lockwatch"
	"github.com/remediate-dev/remediate/policy"
	"github.com/remediate-dev/remediate/remediate"
)

// Sources are what the detectors last observed, read at scrape time
// (never the kernel or kube-proxy themselves). A nil source exports its
// families at 0 (not observed).
type Sources struct {
	// Node is this daemon's node (--node-name): remediate_node_info.
	Node string
	// FleetPaused is 1 while the fleet-wide pause holds every action.
	FleetPaused func() float64
	// KubeProxyScrape is the kube-proxy client's last scrape (nil: none).
	KubeProxyScrape func() *kubeproxy.Scrape
	// KubeProxySyncPeriod is the syncPeriod the thresholds use (0: unknown).
	KubeProxySyncPeriod func() time.Duration
	// LockWatcher is the running xtables lock watcher (nil: none).
	LockWatcher func() *lockwatch.Watcher
	// IPTablesSaves are the detectors' last *-save snapshots.
	IPTablesSaves func() []*iptables.Snapshot
	// IPTablesReads are the iptables reads' counts.
	IPTablesReads func() []iptables.Reads
	// Conntrack is the last conntrack usage read (ok false: none yet).
	Conntrack func() (conntrack.Usage, bool)
	// IPVS are the last IPVS listing's counts (ok false: none yet).
	IPVS func() (ipvs.Counts, bool)
}

// Exporter serves remediate's metrics and receives the engine's reports
// (it implements remediate.Exporter). Create it with New.
type Exporter struct {
	reg    *prometheus.Registry
	engine *engineMetrics
}

var _ remediate.Exporter = (*Exporter)(nil)

// New creates the exporter with a registry of its own holding every
// family: the Go runtime's and the process's, the engine's, and the
// collectors over src.
func New(src Sources) *Exporter {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	x := &Exporter{reg: reg, engine: newEngineMetrics(reg)}
	paused := src.FleetPaused
	if paused == nil {
		paused = func() float64 { return 0 }
	}
	reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "remediate_fleet_paused",
		Help: "1 while every daemon holds all actions (ConfigMap remediate-fleet, key pause)."}, paused))
	scrape := src.KubeProxyScrape
	if scrape == nil {
		scrape = func() *kubeproxy.Scrape { return nil }
	}
	period := src.KubeProxySyncPeriod
	if period == nil {
		period = func() time.Duration { return 0 }
	}
	lw := src.LockWatcher
	if lw == nil {
		lw = func() *lockwatch.Watcher { return nil }
	}
	reg.MustRegister(newKubeProxySyncCollector(scrape))
	reg.MustRegister(newKubeProxySyncDurationCollector(scrape, period))
	reg.MustRegister(newLockHoldCollector(lw))
	reg.MustRegister(newTrendCollector(trendSources{saves: src.IPTablesSaves, reads: src.IPTablesReads,
		conntrack: src.Conntrack, ipvs: src.IPVS, kubeProxy: src.KubeProxyScrape}))
	reg.MustRegister(newNodeInfo(src.Node))
	return x
}

// Handler serves /metrics.
func (x *Exporter) Handler() http.Handler {
	return promhttp.HandlerFor(x.reg, promhttp.HandlerOpts{})
}

// Gatherer is the registry, for tests and tools that read the metrics
// without HTTP.
func (x *Exporter) Gatherer() prometheus.Gatherer { return x.reg }

// ExportPolicy implements remediate.Exporter.
func (x *Exporter) ExportPolicy(p *policy.Policy, guardrails []string) {
	x.engine.exportPolicy(p, guardrails)
}

// ExportCycle implements remediate.Exporter.
func (x *Exporter) ExportCycle(c *remediate.CycleExport) { x.engine.exportCycle(c) }

// ExportReload implements remediate.Exporter.
func (x *Exporter) ExportReload(ok bool) {
	result := "invalid"
	if ok {
		result = "success"
	}
	x.engine.PolicyReloads.WithLabelValues(result).Inc()
}
