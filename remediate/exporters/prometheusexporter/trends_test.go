package prometheusexporter

import (
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/remediate-dev/remediate/internal/conntrack"
	"github.com/remediate-dev/remediate/internal/iptables"
	"github.com/remediate-dev/remediate/internal/ipvs"
	"github.com/remediate-dev/remediate/internal/kubeproxy"
)

// Every trend series is exported from the start at 0 with a fixed label
// set (40 series whatever is observed), then the last observations.
func TestTrendCollector(t *testing.T) {
	var (
		saves []*iptables.Snapshot
		reads []iptables.Reads
		ct    conntrack.Usage
		ctOK  bool
		vs    ipvs.Counts
		vsOK  bool
		sc    *kubeproxy.Scrape
	)
	c := newTrendCollector(trendSources{
		saves:     func() []*iptables.Snapshot { return saves },
		reads:     func() []iptables.Reads { return reads },
		conntrack: func() (conntrack.Usage, bool) { return ct, ctOK },
		ipvs:      func() (ipvs.Counts, bool) { return vs, vsOK },
		kubeProxy: func() *kubeproxy.Scrape { return sc },
	})
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(c)
	start := gatherText(t, reg)
	if n := strings.Count(start, "\n"); n != 2*2*4+2*2*5+4+4+2+2 {
		t.Fatalf("%d series at start:\n%s", n, start)
	}
	for _, l := range []string{"remediate_conntrack_entries 0\n", `remediate_iptables_rules{backend="nft",ip_family="IPv6",table="raw"} 0` + "\n"} {
		if !strings.Contains(start, l) {
			t.Errorf("at start, /metrics lacks %q", l)
		}
	}

	rs, err := iptables.ParseString("*nat\n:PREROUTING ACCEPT [0:0]\n:KUBE-SERVICES - [0:0]\n-A PREROUTING -j KUBE-SERVICES\n-A KUBE-SERVICES -j RETURN\nCOMMIT\n*filter\n:INPUT ACCEPT [0:0]\n-A INPUT -j ACCEPT\nCOMMIT\n")
	if err != nil {
		t.Fatal(err)
	}
	saves = []*iptables.Snapshot{{Family: iptables.IPv4, Backend: iptables.Legacy, Rules: rs, Duration: 640 * time.Millisecond}}
	reads = []iptables.Reads{{Family: iptables.IPv4, Backend: iptables.Legacy, Info: 20, Entries: 2, Saves: 1, Decodes: 5, DecodeFallbacks: 1}}
	ct, ctOK = conntrack.Usage{Count: 900, Max: 1000}, true
	vs, vsOK = ipvs.Counts{Virtual: 3, Real: 7}, true
	nat := map[string]float64{"nat": 29, "filter": 4}
	sc = &kubeproxy.Scrape{Metrics: &kubeproxy.Metrics{Families: map[kubeproxy.Family]*kubeproxy.FamilyMetrics{"IPv4": {RulesTotal: nat}}}}
	for name, want := range map[string]string{
		"remediate_iptables_reads_total": `remediate_iptables_reads_total{backend="legacy",ip_family="IPv4",read="info"} 20
remediate_iptables_reads_total{backend="legacy",ip_family="IPv4",read="entries"} 2
remediate_iptables_reads_total{backend="legacy",ip_family="IPv4",read="save"} 1
remediate_iptables_reads_total{backend="legacy",ip_family="IPv4",read="decode"} 5
remediate_iptables_reads_total{backend="legacy",ip_family="IPv4",read="decode-fallback"} 1
remediate_iptables_reads_total{backend="nft",ip_family="IPv6",read="save"} 0`,
		"remediate_iptables_rules": `remediate_iptables_rules{backend="legacy",ip_family="IPv4",table="nat"} 2
remediate_iptables_rules{backend="legacy",ip_family="IPv4",table="filter"} 1
remediate_iptables_rules{backend="nft",ip_family="IPv4",table="nat"} 0`,
		"remediate_iptables_save_duration_seconds": `remediate_iptables_save_duration_seconds{backend="legacy",ip_family="IPv4"} 0.64
remediate_iptables_save_duration_seconds{backend="legacy",ip_family="IPv6"} 0`,
		"remediate_kube_proxy_rules":     `remediate_kube_proxy_rules{ip_family="IPv4",table="nat"} 29`,
		"remediate_conntrack_entries":    `remediate_conntrack_entries 900`,
		"remediate_conntrack_max":        `remediate_conntrack_max 1000`,
		"remediate_ipvs_virtual_servers": `remediate_ipvs_virtual_servers 3`,
		"remediate_ipvs_real_servers":    `remediate_ipvs_real_servers 7`,
	} {
		body := gatherText(t, reg)
		for _, line := range strings.Split(want, "\n") {
			if !strings.Contains(body, line+"\n") {
				t.Errorf("%s: /metrics lacks %q", name, line)
			}
		}
	}
	if n := strings.Count(gatherText(t, reg), "\n"); n != 48 {
		t.Errorf("%d series after observations, want the same 40", n)
	}
}
