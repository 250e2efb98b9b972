//go:build linux

package nftables

import (
	"bytes"
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/remediate-dev/remediate/internal/netnstest"
)

// kubeProxyLikeTable returns an nft script shaped like kube-proxy's table
// with n service ports of two endpoints each.
func kubeProxyLikeTable(n int) string {
	var b strings.Builder
	b.WriteString("table ip kube-proxy {\n")
	b.WriteString("  chain services { }\n  chain mark-for-masquerade { meta mark set meta mark | 0x00004000; }\n")
	b.WriteString("  chain nat-prerouting { type nat hook prerouting priority dstnat; policy accept; jump services; }\n")
	b.WriteString("  chain nat-output { type nat hook output priority -100; policy accept; jump services; }\n")
	var elems []string
	for i := 0; i < n; i++ {
		svc := fmt.Sprintf("service-ABCDEF%02d-ns%d/web%d/tcp/http", i%100, i/1000, i)
		var eps []string
		for e := 0; e < 2; e++ {
			ip := fmt.Sprintf("10.%d.%d.%d", 100+e, (i/250)%250, i%250+1)
			ep := fmt.Sprintf("endpoint-ABCDEF%02d-ns%d/web%d/tcp/http__%s/8080", i%100, i/1000, i, ip)
			fmt.Fprintf(&b, "  chain %s { ip saddr %s jump mark-for-masquerade; meta l4proto tcp dnat to %s:8080; }\n", ep, ip, ip)
			eps = append(eps, fmt.Sprintf("%d : goto %s", e, ep))
		}
		fmt.Fprintf(&b, "  chain %s { numgen random mod 2 vmap { %s }; }\n", svc, strings.Join(eps, ", "))
		elems = append(elems, fmt.Sprintf("10.96.%d.%d . tcp . 80 : goto %s", i/250, i%250+1, svc))
	}
	fmt.Fprintf(&b, "  map service-ips { type ipv4_addr . inet_proto . inet_service : verdict; elements = { %s }; }\n", strings.Join(elems, ",\n"))
	b.WriteString("}\n")
	return b.String()
}

// BenchmarkRealListKubeProxy5k: the real `nft -j list ruleset` and parse of
// a kube-proxy-shaped table of 5,000 service ports with 2 endpoints each,
// in a test namespace. Reports bytes of JSON per service port.
func BenchmarkRealListKubeProxy5k(b *testing.B) {
	netnstest.NeedRoot(b, "loads a table into a network namespace")
	netnstest.NeedCommands(b, "ip", "nft")
	ns := netnstest.New(b)
	netnstest.Run(b, ns, kubeProxyLikeTable(5000), "nft", "-f", "-")
	r := New(Config{Prefix: netnstest.Prefix(ns), CacheTTL: -1})
	b.ResetTimer()
	var s *Snapshot
	for i := 0; i < b.N; i++ {
		var err error
		if s, err = r.ListRuleset(context.Background()); err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	k, err := ParseKubeProxy(s.Ruleset.Table(FamilyIP, KubeProxyTableName))
	if err != nil || len(k.Programmed()) != 5000 || len(k.Programmed()[0].Backends) != 2 {
		b.Fatalf("parsed %v", err)
	}
	b.ReportMetric(float64(s.Bytes)/5000, "bytes/svcport")
}

// BenchmarkParseKubeProxy5k: the parse alone (no nft run).
func BenchmarkParseKubeProxy5k(b *testing.B) {
	netnstest.NeedRoot(b, "needs nft to produce the JSON")
	netnstest.NeedCommands(b, "ip", "nft")
	ns := netnstest.New(b)
	netnstest.Run(b, ns, kubeProxyLikeTable(5000), "nft", "-f", "-")
	out := netnstest.Run(b, ns, "", "nft", "-j", "list", "ruleset")
	data := []byte(out)
	b.SetBytes(int64(len(data)))
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if _, err := Parse(bytes.NewReader(data)); err != nil {
			b.Fatal(err)
		}
	}
}
