package prometheusexporter

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/remediate-dev/remediate/internal/lockwatch"
)

// lockHoldCollector exports the lock watcher's hold-time histogram,
// remediate_xtables_lock_hold_seconds{program,kube_proxy}: every xtables
// lock hold the watcher measured, by the holder's program (a fixed set,
// else "other"; "unknown" when no holder was visible) and whether it was
// kube-proxy's. Every known program is exported from the first scrape.
type lockHoldCollector struct {
	w    func() *lockwatch.Watcher
	desc *prometheus.Desc
}

func newLockHoldCollector(w func() *lockwatch.Watcher) *lockHoldCollector {
	return &lockHoldCollector{w: w, desc: prometheus.NewDesc("remediate_xtables_lock_hold_seconds",
		"xtables lock holds as the lock watcher measured them (sub-second included), by holder program and whether it was kube-proxy's.",
		[]string{"program", "kube_proxy"}, nil)}
}

// Describe implements prometheus.Collector.
func (c *lockHoldCollector) Describe(ch chan<- *prometheus.Desc) { ch <- c.desc }

// Collect implements prometheus.Collector.
func (c *lockHoldCollector) Collect(ch chan<- prometheus.Metric) {
	var hist map[lockwatch.HistKey]lockwatch.Histogram
	if w := c.w(); w != nil {
		hist = w.Histogram()
	}
	for _, prog := range lockwatch.Labels() {
		for _, kp := range []bool{false, true} {
			h := hist[lockwatch.HistKey{Program: prog, KubeProxy: kp}]
			buckets := make(map[float64]uint64, len(lockwatch.Buckets))
			for i, ub := range lockwatch.Buckets {
				if h.Counts != nil {
					buckets[ub] = h.Counts[i]
				} else {
					buckets[ub] = 0
				}
			}
			kpl := "false"
			if kp {
				kpl = "true"
			}
			ch <- prometheus.MustNewConstHistogram(c.desc, h.Count, h.Sum, buckets, prog, kpl)
		}
	}
}
