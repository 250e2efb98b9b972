package prometheusexporter

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/remediate-dev/remediate/internal/kubeproxy"
)

// kubeProxySyncCollector exports kube-proxy's last successful sync time per
// IP family, as the daemon's detectors last read it from kube-proxy's
// metrics (no request is made at scrape time), so a fleet dashboard can draw
// the sync age of every node: remediate_kube_proxy_last_sync_timestamp_seconds.
// Both families are always exported; 0 means not seen (no scrape yet, or
// kube-proxy does not serve that family).
type kubeProxySyncCollector struct {
	last func() *kubeproxy.Scrape
	desc *prometheus.Desc
}

func newKubeProxySyncCollector(last func() *kubeproxy.Scrape) *kubeProxySyncCollector {
	return &kubeProxySyncCollector{last: last, desc: prometheus.NewDesc("remediate_kube_proxy_last_sync_timestamp_seconds",
		"kube-proxy's last successful rules sync (Unix seconds) per IP family, from its metrics as last read by the detectors; 0: not seen.",
		[]string{"ip_family"}, nil)}
}

// Describe implements prometheus.Collector.
func (c *kubeProxySyncCollector) Describe(ch chan<- *prometheus.Desc) { ch <- c.desc }

// Collect implements prometheus.Collector.
func (c *kubeProxySyncCollector) Collect(ch chan<- prometheus.Metric) {
	sc := c.last()
	for _, f := range []kubeproxy.Family{"IPv4", "IPv6"} {
		v := 0.0
		if sc != nil && sc.Metrics != nil {
			if fm := sc.Metrics.Families[f]; fm != nil && fm.LastSync != nil {
				v = *fm.LastSync
			}
		}
		ch <- prometheus.MustNewConstMetric(c.desc, prometheus.GaugeValue, v, string(f))
	}
}

// kubeProxySyncDurationCollector re-exports kube-proxy's sync duration
// histogram per IP family as the detectors last read it
// (remediate_kube_proxy_sync_duration_seconds, kube-proxy's own buckets),
// and the syncPeriod thresholds are relative to
// (remediate_kube_proxy_sync_period_seconds: kube-proxy's /configz, else
// the policy's). kubeadm binds kube-proxy's /metrics to 127.0.0.1, so
// Prometheus rarely scrapes it; through these the field guides'
// sync-duration alerts (deploy/alerts) work wherever remediate is
// scraped. Nothing is read at scrape time. Both families are always
// exported (an empty histogram: not seen); the period only when known.
type kubeProxySyncDurationCollector struct {
	last     func() *kubeproxy.Scrape
	period   func() time.Duration
	hist     *prometheus.Desc
	periodDs *prometheus.Desc
}

func newKubeProxySyncDurationCollector(last func() *kubeproxy.Scrape, period func() time.Duration) *kubeProxySyncDurationCollector {
	return &kubeProxySyncDurationCollector{last: last, period: period,
		hist: prometheus.NewDesc("remediate_kube_proxy_sync_duration_seconds",
			"kube-proxy's rules sync duration histogram (kubeproxy_sync_proxy_rules_duration_seconds) per IP family, as last read by the detectors; empty: not seen.",
			[]string{"ip_family"}, nil),
		periodDs: prometheus.NewDesc("remediate_kube_proxy_sync_period_seconds",
			"kube-proxy's syncPeriod the thresholds use (its /configz, else the policy's kubeProxy.syncPeriod).", nil, nil)}
}

// Describe implements prometheus.Collector.
func (c *kubeProxySyncDurationCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.hist
	ch <- c.periodDs
}

// Collect implements prometheus.Collector.
func (c *kubeProxySyncDurationCollector) Collect(ch chan<- prometheus.Metric) {
	sc := c.last()
	for _, f := range []kubeproxy.Family{"IPv4", "IPv6"} {
		var h kubeproxy.Histogram
		if sc != nil && sc.Metrics != nil {
			if fm := sc.Metrics.Families[f]; fm != nil && fm.SyncDuration != nil {
				h = *fm.SyncDuration
			} else if fm := sc.Metrics.Families[kubeproxy.Unlabelled]; fm != nil && fm.SyncDuration != nil && f == "IPv4" {
				// kube-proxy before 1.33: one unlabelled histogram for
				// whichever family synced; shown as IPv4.
				h = *fm.SyncDuration
			}
		}
		buckets := make(map[float64]uint64, len(h.Buckets))
		for _, b := range h.Buckets {
			buckets[b.UpperBound] = b.CumulativeCount
		}
		ch <- prometheus.MustNewConstHistogram(c.hist, h.Count, h.Sum, buckets, string(f))
	}
	if p := c.period(); p > 0 {
		ch <- prometheus.MustNewConstMetric(c.periodDs, prometheus.GaugeValue, p.Seconds())
	}
}
