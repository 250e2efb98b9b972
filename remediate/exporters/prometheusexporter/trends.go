package prometheusexporter

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/remediate-dev/remediate/internal/conntrack"
	"github.com/remediate-dev/remediate/internal/iptables"
	"github.com/remediate-dev/remediate/internal/ipvs"
	"github.com/remediate-dev/remediate/internal/kubeproxy"
)

// trendTables are the iptables tables exported as gauges (a fixed set:
// bounded cardinality whatever a rule set holds).
var trendTables = []string{"filter", "nat", "mangle", "raw"}

// trendSources are what the detectors last observed; each returns ok false
// before its first observation (the gauges then say 0).
type trendSources struct {
	saves     func() []*iptables.Snapshot
	reads     func() []iptables.Reads
	conntrack func() (conntrack.Usage, bool)
	ipvs      func() (ipvs.Counts, bool)
	kubeProxy func() *kubeproxy.Scrape
}

// trendCollector exports, from what the detectors last observed (nothing is
// read from the kernel or kube-proxy at scrape time), the gauges a fleet
// dashboard draws trends and runway from: iptables rule counts per family,
// backend and table, the last save's duration, kube-proxy's own rule
// counts, conntrack entries and nf_conntrack_max, IPVS virtual and real
// servers. Every series is exported from the first scrape (0: not observed
// yet, or the subsystem is absent), with a fixed label set.
type trendCollector struct {
	src                                   trendSources
	rules, save, reads, kpRules           *prometheus.Desc
	ctEntries, ctMax, ipvsVirtual, ipvsRS *prometheus.Desc
}

func newTrendCollector(src trendSources) *trendCollector {
	return &trendCollector{src: src,
		rules: prometheus.NewDesc("remediate_iptables_rules",
			"Rules in an iptables table per IP family and backend, from the detectors' last *-save (0: not saved yet).",
			[]string{"ip_family", "backend", "table"}, nil),
		save: prometheus.NewDesc("remediate_iptables_save_duration_seconds",
			"Duration of the detectors' last *-save per IP family and backend, or of the entry read and decode that replaced it (field guide 2: > 0.1 s a problem, > 0.5 s bad; 0: not saved yet).",
			[]string{"ip_family", "backend"}, nil),
		reads: prometheus.NewDesc("remediate_iptables_reads_total",
			"What the detectors' iptables reads cost, per IP family and backend: read=\"info\" the cheap change checks (legacy table sizes, the nf_tables generation), read=\"entries\" the legacy entry copies (the save's own costly read, skipped while the xtables lock file is untouched and the sizes unchanged, at most 1m), read=\"save\" the *-save commands run, read=\"decode\" the changed legacy IPv4 tables decoded from the entries read instead of saved, read=\"decode-fallback\" those not decodable, so saved.",
			[]string{"ip_family", "backend", "read"}, nil),
		kpRules: prometheus.NewDesc("remediate_kube_proxy_rules",
			"kube-proxy's own count of its iptables rules per IP family and table (sync_proxy_rules_iptables_total, last scrape; 0: not seen).",
			[]string{"ip_family", "table"}, nil),
		ctEntries: prometheus.NewDesc("remediate_conntrack_entries",
			"Conntrack entries in the node's network namespace at the detectors' last read (0: not read yet).", nil, nil),
		ctMax: prometheus.NewDesc("remediate_conntrack_max",
			"nf_conntrack_max at the detectors' last read (0: not read yet).", nil, nil),
		ipvsVirtual: prometheus.NewDesc("remediate_ipvs_virtual_servers",
			"IPVS virtual servers at the detectors' last listing (0: none, or not listed).", nil, nil),
		ipvsRS: prometheus.NewDesc("remediate_ipvs_real_servers",
			"IPVS real servers of the virtual servers the detectors last listed (0: none, or not listed).", nil, nil),
	}
}

// Describe implements prometheus.Collector.
func (c *trendCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.rules, c.save, c.reads, c.kpRules, c.ctEntries, c.ctMax, c.ipvsVirtual, c.ipvsRS} {
		ch <- d
	}
}

// Collect implements prometheus.Collector.
func (c *trendCollector) Collect(ch chan<- prometheus.Metric) {
	type fb struct {
		f iptables.Family
		b iptables.Backend
	}
	last := map[fb]*iptables.Snapshot{}
	if c.src.saves != nil {
		for _, s := range c.src.saves() {
			last[fb{s.Family, s.Backend}] = s
		}
	}
	for _, f := range []iptables.Family{iptables.IPv4, iptables.IPv6} {
		for _, b := range []iptables.Backend{iptables.Legacy, iptables.NFT} {
			s := last[fb{f, b}]
			for _, t := range trendTables {
				ch <- prometheus.MustNewConstMetric(c.rules, prometheus.GaugeValue, float64(s.RuleCount(t)), string(f), string(b), t)
			}
			d := 0.0
			if s != nil {
				d = s.Duration.Seconds()
			}
			ch <- prometheus.MustNewConstMetric(c.save, prometheus.GaugeValue, d, string(f), string(b))
		}
	}
	counts := map[fb]iptables.Reads{}
	if c.src.reads != nil {
		for _, r := range c.src.reads() {
			counts[fb{r.Family, r.Backend}] = r
		}
	}
	for _, f := range []iptables.Family{iptables.IPv4, iptables.IPv6} {
		for _, b := range []iptables.Backend{iptables.Legacy, iptables.NFT} {
			r := counts[fb{f, b}]
			for _, x := range []struct {
				read string
				n    uint64
			}{{"info", r.Info}, {"entries", r.Entries}, {"save", r.Saves}, {"decode", r.Decodes}, {"decode-fallback", r.DecodeFallbacks}} {
				ch <- prometheus.MustNewConstMetric(c.reads, prometheus.CounterValue, float64(x.n), string(f), string(b), x.read)
			}
		}
	}
	var sc *kubeproxy.Scrape
	if c.src.kubeProxy != nil {
		sc = c.src.kubeProxy()
	}
	for _, f := range []kubeproxy.Family{"IPv4", "IPv6"} {
		for _, t := range []string{"filter", "nat"} {
			v := 0.0
			if sc != nil && sc.Metrics != nil {
				if fm := sc.Metrics.Families[f]; fm != nil {
					v = fm.RulesTotal[t]
				}
			}
			ch <- prometheus.MustNewConstMetric(c.kpRules, prometheus.GaugeValue, v, string(f), t)
		}
	}
	var u conntrack.Usage
	if c.src.conntrack != nil {
		u, _ = c.src.conntrack()
	}
	ch <- prometheus.MustNewConstMetric(c.ctEntries, prometheus.GaugeValue, float64(u.Count))
	ch <- prometheus.MustNewConstMetric(c.ctMax, prometheus.GaugeValue, float64(u.Max))
	var n ipvs.Counts
	if c.src.ipvs != nil {
		n, _ = c.src.ipvs()
	}
	ch <- prometheus.MustNewConstMetric(c.ipvsVirtual, prometheus.GaugeValue, float64(n.Virtual))
	ch <- prometheus.MustNewConstMetric(c.ipvsRS, prometheus.GaugeValue, float64(n.Real))
}
