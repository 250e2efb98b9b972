package nftables

import (
	"errors"
	"os"
	"reflect"
	"strings"
	"testing"
)

// fixture is `nft -j list ruleset` from the real kube-proxy v1.34.4 in
// nftables mode (TestCaptureKubeProxyFixtures): Services nft-capture/web
// (two endpoints, TCP and UDP ports), nft-capture/empty (no endpoints),
// nft-capture/np (NodePort, one endpoint) and default/kubernetes.
const fixture = "testdata/kube-proxy-v1.34.4-ruleset.json"

func loadFixture(t testing.TB) *Ruleset {
	t.Helper()
	b, err := os.ReadFile(fixture)
	if err != nil {
		t.Fatal(err)
	}
	rs, err := ParseBytes(b)
	if err != nil {
		t.Fatalf("parse %s: %v", fixture, err)
	}
	return rs
}

func TestParseRealKubeProxyRuleset(t *testing.T) {
	rs := loadFixture(t)
	if rs.NFTVersion != "1.0.6" {
		t.Errorf("nft version %q", rs.NFTVersion)
	}
	if len(rs.Tables) != 2 {
		t.Fatalf("%d tables, want ip and ip6 kube-proxy", len(rs.Tables))
	}
	for _, f := range []Family{FamilyIP, FamilyIP6} {
		tb := rs.Table(f, "kube-proxy")
		if tb == nil {
			t.Fatalf("no table %s kube-proxy", f)
		}
		want := map[string]Hook{
			"filter-prerouting-pre-dnat": {Type: "filter", Hook: "prerouting", Priority: -110, Policy: "accept"},
			"filter-output-pre-dnat":     {Type: "filter", Hook: "output", Priority: -110, Policy: "accept"},
			"filter-input":               {Type: "filter", Hook: "input", Priority: 0, Policy: "accept"},
			"filter-forward":             {Type: "filter", Hook: "forward", Priority: 0, Policy: "accept"},
			"filter-output":              {Type: "filter", Hook: "output", Priority: 0, Policy: "accept"},
			"nat-prerouting":             {Type: "nat", Hook: "prerouting", Priority: -100, Policy: "accept"},
			"nat-output":                 {Type: "nat", Hook: "output", Priority: -100, Policy: "accept"},
			"nat-postrouting":            {Type: "nat", Hook: "postrouting", Priority: 100, Policy: "accept"},
		}
		got := map[string]Hook{}
		for _, c := range tb.Chains {
			if c.Hook != nil {
				got[c.Name] = *c.Hook
			}
		}
		if !reflect.DeepEqual(got, want) {
			t.Errorf("%s base chains:\n got %+v\nwant %+v", f, got, want)
		}
		for _, c := range []string{"nat-prerouting", "nat-output"} {
			if !tb.Chain(c).JumpsTo("services") {
				t.Errorf("%s %s does not jump to services", f, c)
			}
		}
		if tb.Chain("nat-postrouting").JumpsTo("services") {
			t.Errorf("%s nat-postrouting jumps to services", f)
		}
	}
	tb := rs.Table(FamilyIP, "kube-proxy")
	svcIPs := tb.Set("service-ips")
	if !svcIPs.IsMap || svcIPs.ValueType != "verdict" || !reflect.DeepEqual(svcIPs.KeyType, []string{"ipv4_addr", "inet_proto", "inet_service"}) {
		t.Errorf("service-ips %+v", svcIPs)
	}
	if len(svcIPs.Elements) != 4 {
		t.Errorf("service-ips has %d elements, want 4", len(svcIPs.Elements))
	}
	ne := tb.Set("no-endpoint-services").Elements
	if len(ne) != 1 || ne[0].Comment != "nft-capture/empty:http" || ne[0].Verdict == nil || *ne[0].Verdict != (Verdict{Kind: Goto, Target: "reject-chain"}) {
		t.Errorf("no-endpoint-services %+v", ne)
	}
	services := tb.Chain("services")
	if len(services.Rules) != 2 || services.Rules[0].VMap == nil || services.Rules[0].VMap.Map != "service-ips" ||
		services.Rules[0].VMap.Key != "ip daddr . meta l4proto . th dport" {
		t.Errorf("services chain %+v", services.Rules[0])
	}
	if got := services.Rules[0].Text; got != "ip daddr . meta l4proto . th dport vmap @service-ips" {
		t.Errorf("rule text %q", got)
	}
	reject := tb.Chain("reject-chain").Rules[0]
	if !reject.UnconditionalRefusal() || reject.Verdict.Kind != Reject {
		t.Errorf("reject-chain rule %+v", reject)
	}
	// cluster-ips-check drops only unallocated ClusterIPs: conditional.
	for _, r := range tb.Chain("cluster-ips-check").Rules {
		if r.UnconditionalRefusal() {
			t.Errorf("cluster-ips-check rule %q taken as unconditional", r.Text)
		}
	}
	ep := tb.Chain("endpoint-666WUJ4G-nft-capture/web/tcp/http__10.244.0.5/8080")
	if n := ep.Rules[1].NAT; n == nil || *n != (NAT{Kind: "dnat", Addr: "10.244.0.5", Port: "8080"}) {
		t.Errorf("endpoint dnat %+v", ep.Rules[1].NAT)
	}
	if got := ep.Rules[1].Text; got != "meta l4proto tcp dnat to 10.244.0.5:8080" {
		t.Errorf("dnat rule text %q", got)
	}
	svc := tb.Chain("service-L5PNJ65X-nft-capture/web/tcp/http").Rules[0]
	if svc.VMap == nil || svc.VMap.Key != "numgen random mod 2" || len(svc.VMap.Elements) != 2 ||
		!reflect.DeepEqual(svc.Targets(), []string{"endpoint-666WUJ4G-nft-capture/web/tcp/http__10.244.0.5/8080", "endpoint-J7EXKJKS-nft-capture/web/tcp/http__10.244.0.6/8080"}) {
		t.Errorf("service chain rule %+v", svc)
	}
}

func TestParseKubeProxyView(t *testing.T) {
	rs := loadFixture(t)
	k, err := ParseKubeProxy(rs.Table(FamilyIP, KubeProxyTableName))
	if err != nil {
		t.Fatal(err)
	}
	if len(k.Missing) != 0 {
		t.Errorf("missing %v", k.Missing)
	}
	var got []string
	for _, p := range k.Programmed() {
		s := p.IP + " " + p.Protocol + " " + p.Port + " " + p.Service.String() + " ->"
		for _, b := range p.Backends {
			s += " " + b.Addr + ":" + b.Port
		}
		if len(p.Unresolved) > 0 {
			s += " unresolved " + strings.Join(p.Unresolved, ",")
		}
		got = append(got, s)
	}
	// Sorted as strings: 10.96.0.1 < 10.96.172.238 < 10.96.241.69.
	want := []string{
		"10.96.0.1 tcp 443 default/kubernetes:https/tcp -> 10.200.0.1:6443",
		"10.96.172.238 tcp 80 nft-capture/web:http/tcp -> 10.244.0.5:8080 10.244.0.6:8080",
		"10.96.172.238 udp 53 nft-capture/web:dns/udp -> 10.244.0.5:53 10.244.0.6:53",
		"10.96.241.69 tcp 80 nft-capture/np:http/tcp -> 10.244.0.7:8080",
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("programmed:\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	if len(k.NodePorts) != 1 || k.NodePorts[0].Protocol != "tcp" || k.NodePorts[0].Verdict.Target != "external-33VT3ZSF-nft-capture/np/tcp/http" {
		t.Errorf("node ports %+v", k.NodePorts)
	}
	if b, u := k.Resolve(k.NodePorts[0].Verdict.Target); len(u) != 0 || len(b) != 1 || b[0].Addr != "10.244.0.7" {
		t.Errorf("NodePort resolves to %+v unresolved %v", b, u)
	}
	if len(k.NoEndpointServices) != 1 || k.NoEndpointServices[0] != (ServiceEntry{IP: "10.96.219.213", Protocol: "tcp", Port: "80",
		Verdict: Verdict{Kind: Goto, Target: "reject-chain"}, Comment: "nft-capture/empty:http"}) {
		t.Errorf("no-endpoint services %+v", k.NoEndpointServices)
	}
	if !reflect.DeepEqual(k.ClusterIPs, []string{"10.96.0.1", "10.96.172.238", "10.96.219.213", "10.96.241.69"}) {
		t.Errorf("cluster IPs %v", k.ClusterIPs)
	}
	if !reflect.DeepEqual(k.NodePortIPs, []string{"10.200.0.1"}) {
		t.Errorf("nodeport IPs %v", k.NodePortIPs)
	}
	ep := k.Endpoints["endpoint-BIG4SSYE-nft-capture/web/udp/dns__10.244.0.5/53"]
	if ep == nil || ep.Name.Endpoint != "10.244.0.5/53" || ep.Name.Service != (ServicePortName{"nft-capture", "web", "udp", "dns"}) {
		t.Errorf("endpoint chain %+v", ep)
	}
	// The empty IPv6 table parses with nothing programmed.
	k6, err := ParseKubeProxy(rs.Table(FamilyIP6, KubeProxyTableName))
	if err != nil || len(k6.Programmed()) != 0 || len(k6.Missing) != 0 {
		t.Errorf("ip6: %+v %v", k6, err)
	}
	// A damaged table: an endpoint chain gone.
	delete(k.Endpoints, "endpoint-J7EXKJKS-nft-capture/web/tcp/http__10.244.0.6/8080")
	b, u := k.Resolve("service-L5PNJ65X-nft-capture/web/tcp/http")
	if len(b) != 1 || !reflect.DeepEqual(u, []string{"endpoint-J7EXKJKS-nft-capture/web/tcp/http__10.244.0.6/8080"}) {
		t.Errorf("damaged: backends %+v unresolved %v", b, u)
	}
	if _, err := ParseKubeProxy(nil); err == nil {
		t.Error("nil table parsed")
	}
}

func TestParseChainName(t *testing.T) {
	// kube-proxy truncates the name after its prefix to 240 bytes, the
	// last three being "...".
	n63, s63, p63 := strings.Repeat("n", 63), strings.Repeat("s", 63), strings.Repeat("p", 63)
	base := "ABCDEFGH-" + n63 + "/" + s63 + "/tcp/" + p63 + "__fd00.1111.2222.3333.4444.5555.6666.7777/65535"
	long := "endpoint-" + base[:237] + "..."
	longEP := base[:237][len("ABCDEFGH-"+n63+"/"+s63+"/tcp/"+p63+"__"):]
	for _, c := range []struct {
		in   string
		want ChainName
		ok   bool
	}{
		{"service-L5PNJ65X-ns/web/tcp/http", ChainName{Kind: ServiceChainKind, Hash: "L5PNJ65X", Service: ServicePortName{"ns", "web", "tcp", "http"}}, true},
		{"external-33VT3ZSF-ns/np/tcp/", ChainName{Kind: ExternalChainKind, Hash: "33VT3ZSF", Service: ServicePortName{"ns", "np", "tcp", ""}}, true},
		{"local-33VT3ZSF-ns/np/sctp/x", ChainName{Kind: LocalChainKind, Hash: "33VT3ZSF", Service: ServicePortName{"ns", "np", "sctp", "x"}}, true},
		{"endpoint-I23LSJSE-default/kubernetes/tcp/https__10.200.0.1/6443", ChainName{Kind: EndpointChainKind, Hash: "I23LSJSE",
			Service: ServicePortName{"default", "kubernetes", "tcp", "https"}, Endpoint: "10.200.0.1/6443"}, true},
		{"endpoint-I23LSJSE-ns/s/tcp/p__fd00.1..5/80", ChainName{Kind: EndpointChainKind, Hash: "I23LSJSE",
			Service: ServicePortName{"ns", "s", "tcp", "p"}, Endpoint: "fd00.1..5/80"}, true},
		{long, ChainName{Kind: EndpointChainKind, Hash: "ABCDEFGH", Truncated: true,
			Service: ServicePortName{n63, s63, "tcp", p63}, Endpoint: longEP}, true},
		{"service-endpoints-check", ChainName{}, false},
		{"services", ChainName{}, false},
		{"service-L5PNJ65X-ns/web/tcp", ChainName{}, false},
		{"endpoint-I23LSJSE-ns/s/tcp/p", ChainName{}, false},
		{"service-l5pnj65x-ns/web/tcp/http", ChainName{}, false},
		{"firewall-L5PNJ65X-ns/web/tcp/http", ChainName{Kind: FirewallChainKind, Hash: "L5PNJ65X", Service: ServicePortName{"ns", "web", "tcp", "http"}}, true},
	} {
		got, ok := ParseChainName(c.in)
		if ok != c.ok || got != c.want {
			t.Errorf("ParseChainName(%q) = %+v, %v; want %+v, %v", c.in, got, ok, c.want, c.ok)
		}
	}
}

func TestParseShadowingTable(t *testing.T) {
	rs, err := ParseString(`{"nftables": [{"metainfo": {"version": "1.0.6"}},
	{"table": {"family": "inet", "name": "fw", "handle": 7}},
	{"chain": {"family": "inet", "table": "fw", "name": "input", "handle": 1, "type": "filter", "hook": "input", "prio": -200, "policy": "drop"}},
	{"chain": {"family": "inet", "table": "fw", "name": "pre", "handle": 2, "type": "filter", "hook": "prerouting", "prio": -300}},
	{"rule": {"family": "inet", "table": "fw", "chain": "input", "handle": 2, "expr": [{"counter": {"packets": 0, "bytes": 0}}, {"drop": null}]}},
	{"rule": {"family": "inet", "table": "fw", "chain": "pre", "handle": 3, "expr": [{"limit": {"rate": 10, "per": "second"}}, {"drop": null}]}},
	{"rule": {"family": "inet", "table": "fw", "chain": "pre", "handle": 4, "expr": [{"xt": {"type": "match", "name": "conntrack"}}, {"reject": null}]}},
	{"flowtable": {"family": "inet", "table": "fw", "name": "ft"}}
	]}`)
	if err != nil {
		t.Fatal(err)
	}
	if rs.Skipped != 1 {
		t.Errorf("skipped %d, want 1 (the flowtable)", rs.Skipped)
	}
	bc := rs.BaseChains()
	if len(bc) != 2 || bc[0].Hook.Policy != "drop" || bc[1].Hook.Policy != "accept" || bc[0].ID() != "inet fw input" {
		t.Fatalf("base chains %+v", bc)
	}
	if r := bc[0].Rules[0]; !r.UnconditionalRefusal() || r.Text != "counter drop" {
		t.Errorf("counter drop: %+v", r)
	}
	for _, r := range bc[1].Rules {
		if r.UnconditionalRefusal() {
			t.Errorf("rule %q taken as unconditional", r.Text)
		}
	}
}

func TestParseErrors(t *testing.T) {
	for _, in := range []string{
		``,
		`[]`,
		`{}`,
		`{"nftables": {}}`,
		`{"nftables": [}`,
		`{"nftables": [{"table": {"family": "ip"}}]}`,
		`{"nftables": [{"chain": {"family": "ip", "table": "t", "name": "c"}}]}`,
		`{"nftables": [{"table": {"family": "ip", "name": "t"}}, {"rule": {"family": "ip", "table": "t", "chain": "c", "expr": []}}]}`,
		`{"nftables": [{"table": {"family": "ip", "name": "t"}}, {"table": {"family": "ip", "name": "t"}}]}`,
		`{"nftables": [{"table": {"family": "ip", "name": "t"}, "chain": {}}]}`,
		`{"nftables": []} {"nftables": []}`,
		`{"nftables": [{"table": {"family": "ip", "name": "t", "handle": -1}}]}`,
	} {
		if _, err := ParseString(in); err == nil {
			t.Errorf("ParseString(%q): no error", in)
		}
	}
	// Unknown top-level keys and object kinds are skipped.
	rs, err := ParseString(`{"x": [1], "nftables": [{"counter": {"family": "ip", "table": "t", "name": "c"}}]}`)
	if err != nil || rs.Skipped != 1 {
		t.Errorf("skipping: %+v %v", rs, err)
	}
}

func TestLimitReader(t *testing.T) {
	doc := `{"nftables": [{"metainfo": {"version": "1.0.6"}}]}`
	if _, err := Parse(&limitReader{r: strings.NewReader(doc), left: int64(len(doc))}); err != nil {
		t.Errorf("at the limit: %v", err)
	}
	lr := &limitReader{r: strings.NewReader(doc + "\n"), left: int64(len(doc) - 5)}
	if _, err := Parse(lr); !errors.Is(err, ErrTooLarge) && !lr.over {
		t.Errorf("over the limit: %v (over %v)", err, lr.over)
	}
}

func TestRenderDepthBounded(t *testing.T) {
	deep := strings.Repeat(`{"&": [`, 200) + `1` + strings.Repeat(`, 2]}`, 200)
	rs, err := ParseString(`{"nftables": [{"table": {"family": "ip", "name": "t"}}, {"chain": {"family": "ip", "table": "t", "name": "c"}},
	{"rule": {"family": "ip", "table": "t", "chain": "c", "expr": [{"match": {"op": "==", "left": ` + deep + `, "right": 1}}]}}]}`)
	if err != nil {
		t.Fatal(err)
	}
	if txt := rs.Tables[0].Chains[0].Rules[0].Text; !strings.Contains(txt, "…") || len(txt) > 2000 {
		t.Errorf("deep expression rendered as %d bytes", len(txt))
	}
}

// FuzzParse: any input gives a ruleset or an error, never a panic or a
// hang, and a parsed ruleset's kube-proxy view can be built.
func FuzzParse(f *testing.F) {
	b, err := os.ReadFile(fixture)
	if err != nil {
		f.Fatal(err)
	}
	f.Add(string(b))
	f.Add(`{"nftables": [{"table": {"family": "ip", "name": "kube-proxy"}}, {"map": {"family": "ip", "table": "kube-proxy", "name": "service-ips", "type": ["ipv4_addr", "inet_proto", "inet_service"], "map": "verdict", "elem": [[{"elem": {"val": {"concat": ["10.96.0.1", "tcp", 443]}, "comment": "c"}}, {"goto": {"target": "service-AAAAAAAA-a/b/tcp/p"}}]]}}]}`)
	f.Add(`{"nftables": [{"table": {"family": "inet", "name": "fw"}}, {"chain": {"family": "inet", "table": "fw", "name": "in", "type": "filter", "hook": "input", "prio": -10, "policy": "drop"}}, {"rule": {"family": "inet", "table": "fw", "chain": "in", "expr": [{"counter": null}, {"drop": null}]}}]}`)
	f.Fuzz(func(t *testing.T, in string) {
		rs, err := ParseString(in)
		if err != nil {
			return
		}
		for _, tb := range rs.Tables {
			if tb.Family == FamilyIP || tb.Family == FamilyIP6 {
				k, err := ParseKubeProxy(tb)
				if err != nil {
					t.Fatalf("ParseKubeProxy of a parsed ip/ip6 table: %v", err)
				}
				_ = k.Programmed()
			}
			for _, c := range tb.Chains {
				for _, r := range c.Rules {
					_ = r.UnconditionalRefusal()
					_ = r.Targets()
				}
			}
		}
	})
}

// TestParseTruncatedAndCorrupted: every prefix of the real listing (in
// 97-byte steps) and the listing with single bytes overwritten is an error
// or a ruleset, never a panic; only the whole listing parses completely.
func TestParseTruncatedAndCorrupted(t *testing.T) {
	b, err := os.ReadFile(fixture)
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < len(b)-2; i += 97 {
		if _, err := ParseBytes(b[:i]); err == nil {
			t.Fatalf("prefix of %d bytes parsed", i)
		}
	}
	for i := 0; i < len(b); i += 211 {
		c := append([]byte(nil), b...)
		for _, x := range []byte{'{', '}', '[', ']', '"', '0', ':', ','} {
			c[i] = x
			if rs, err := ParseBytes(c); err == nil {
				for _, tb := range rs.Tables {
					if tb.Family == FamilyIP || tb.Family == FamilyIP6 {
						if k, err := ParseKubeProxy(tb); err == nil {
							_ = k.Programmed()
						}
					}
				}
			}
		}
	}
}
