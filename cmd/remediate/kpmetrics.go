package main

import (
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

// lastKubeProxyScrape is the current kube-proxy client's last scrape.
func (w *wiring) lastKubeProxyScrape() *kubeproxy.Scrape {
	if kp := w.kp.Load(); kp != nil {
		return kp.LastScrape()
	}
	return nil
}
