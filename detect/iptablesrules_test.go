package detect

import (
	"context"
	"errors"
	"fmt"
	"os"
	"reflect"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/remediate-dev/remediate/internal/finding"
	"github.com/remediate-dev/remediate/internal/iptables"
	"github.com/remediate-dev/remediate/internal/kubeproxy"
	"github.com/remediate-dev/remediate/internal/node"
	"github.com/remediate-dev/remediate/internal/procs"
	"github.com/remediate-dev/remediate/policy"
)

func healthyRules(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile("testdata/iptables-save-legacy.txt")
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func mutate(t *testing.T, text string, edit func(rs *iptables.Ruleset)) string {
	t.Helper()
	rs, err := iptables.ParseString(text)
	if err != nil {
		t.Fatal(err)
	}
	edit(rs)
	return rs.String()
}

const emptyNFT = "" // iptables-nft-save prints nothing on a node without nft tables

func findingTargets(fs []finding.Finding) []string {
	var out []string
	for _, f := range fs {
		out = append(out, f.Target)
	}
	sort.Strings(out)
	return out
}

func TestIPTablesRules(t *testing.T) {
	healthy := healthyRules(t)
	noPrerouting := mutate(t, healthy, func(rs *iptables.Ruleset) {
		rs.DeleteRules("nat", "PREROUTING", func(r iptables.Rule) bool { return r.Target == "KUBE-SERVICES" })
	})
	firewall := func(rule string) string {
		return strings.Replace(healthy, `-A KUBE-FIREWALL ! -s 127.0.0.0/8 -d 127.0.0.0/8 -m comment --comment "block incoming localnet connections" -m conntrack ! --ctstate RELATED,ESTABLISHED,DNAT -j DROP`, rule, 1)
	}
	nftKube := "*nat\n:PREROUTING ACCEPT [0:0]\n:OUTPUT ACCEPT [0:0]\n:KUBE-SERVICES - [0:0]\n-A PREROUTING -j KUBE-SERVICES\n-A OUTPUT -j KUBE-SERVICES\nCOMMIT\n"
	nftHintOnly := "*mangle\n:KUBE-IPTABLES-HINT - [0:0]\n:KUBE-KUBELET-CANARY - [0:0]\nCOMMIT\n"

	cases := []struct {
		name     string
		legacy   string
		nft      string
		set      func(p *IPTablesRulesParams)
		fake     func(f *iptables.Fake)
		want     []string
		wantErr  bool
		wantSkip bool
	}{
		{name: "captured healthy rules", legacy: healthy, nft: emptyNFT},
		{name: "kubelet hint chains in nft are not a mix", legacy: healthy, nft: nftHintOnly},
		{name: "missing PREROUTING jump", legacy: noPrerouting, nft: emptyNFT,
			want: []string{"iptables/IPv4/legacy/nat/PREROUTING/KUBE-SERVICES"}},
		{name: "missing both jumps in nft", legacy: "", nft: "*nat\n:PREROUTING ACCEPT [0:0]\n:OUTPUT ACCEPT [0:0]\n:KUBE-SERVICES - [0:0]\nCOMMIT\n",
			want: []string{"iptables/IPv4/nft/nat/OUTPUT/KUBE-SERVICES", "iptables/IPv4/nft/nat/PREROUTING/KUBE-SERVICES"}},
		{name: "nftables mode: the whole detector skips", legacy: noPrerouting, nft: emptyNFT,
			set: func(p *IPTablesRulesParams) { p.ProxyMode = "nftables" }, wantSkip: true},
		{name: "jump check off when mode unknown", legacy: noPrerouting, nft: emptyNFT,
			set: func(p *IPTablesRulesParams) { p.ProxyMode = "" }},
		{name: "ipvs mode uses the same jumps", legacy: noPrerouting, nft: emptyNFT,
			set:  func(p *IPTablesRulesParams) { p.ProxyMode = "ipvs" },
			want: []string{"iptables/IPv4/legacy/nat/PREROUTING/KUBE-SERVICES"}},
		{name: "bare DROP in KUBE-FIREWALL", legacy: firewall("-A KUBE-FIREWALL -j DROP"), nft: emptyNFT,
			want: []string{"iptables/IPv4/legacy/filter/KUBE-FIREWALL/bare-drop"}},
		{name: "comment-only DROP is bare", legacy: firewall(`-A KUBE-FIREWALL -m comment --comment "kubernetes firewall for dropping marked packets" -j DROP`), nft: emptyNFT,
			want: []string{"iptables/IPv4/legacy/filter/KUBE-FIREWALL/bare-drop"}},
		{name: "marked DROP is fine", legacy: firewall(`-A KUBE-FIREWALL -m comment --comment "kubernetes firewall for dropping marked packets" -m mark --mark 0x8000/0x8000 -j DROP`), nft: emptyNFT},
		{name: "legacy and nft mix", legacy: healthy, nft: nftKube,
			want: []string{"iptables/IPv4/backend-mix"}},
		{name: "mix check off", legacy: healthy, nft: nftKube, set: func(p *IPTablesRulesParams) { p.CheckBackendMix = false }},
		{name: "rule count over threshold", legacy: healthy, nft: emptyNFT, set: func(p *IPTablesRulesParams) { p.MaxKubeRules = 40 },
			want: []string{"iptables/IPv4/legacy/kube-rule-count"}},
		{name: "slow save", legacy: healthy, nft: emptyNFT,
			fake: func(f *iptables.Fake) { f.SetDuration(iptables.IPv4, iptables.Legacy, 3*time.Second) },
			want: []string{"iptables/IPv4/legacy/save-duration"}},
		{name: "save timed out", legacy: healthy, nft: emptyNFT,
			fake: func(f *iptables.Fake) {
				f.SetError(iptables.IPv4, iptables.Legacy, fmt.Errorf("iptables-legacy-save: timed out after 30s: %w", context.DeadlineExceeded))
			},
			want: []string{"iptables/IPv4/legacy/save-duration"}},
		{name: "save starved of CPU: the daemon's slowness, an error, not a finding", legacy: healthy, nft: emptyNFT,
			fake: func(f *iptables.Fake) {
				f.SetError(iptables.IPv4, iptables.Legacy, fmt.Errorf("iptables-legacy-save: not finished after 8s, only 40ms of it on a CPU: %w", iptables.ErrStarved))
			},
			wantErr: true},
		{name: "save failed", legacy: healthy, nft: emptyNFT,
			fake:    func(f *iptables.Fake) { f.SetError(iptables.IPv4, iptables.NFT, errors.New("exit status 1: boom")) },
			wantErr: true},
		{name: "unparsable output", legacy: "*nat\n-A X -j Y\n", nft: emptyNFT, wantErr: true},
		{name: "legacy not installed", legacy: "-", nft: emptyNFT},
		{name: "nothing installed", legacy: "-", nft: "-", wantSkip: true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			f := iptables.NewFake()
			if c.legacy != "-" {
				f.SetRules(iptables.IPv4, iptables.Legacy, c.legacy)
			}
			if c.nft != "-" {
				f.SetRules(iptables.IPv4, iptables.NFT, c.nft)
			}
			if c.fake != nil {
				c.fake(f)
			}
			n, _ := newIssue3Node(nil)
			n.IPTables = f
			d := newIssue3Detector(t, "IPTablesRules", n, func(p any) {
				pp := p.(*IPTablesRulesParams)
				pp.Families = []string{"IPv4"}
				if c.set != nil {
					c.set(pp)
				}
			})
			got, err := d.Detect(context.Background())
			_, skip := finding.IsSkip(err)
			if skip != c.wantSkip || (err != nil && !skip) != c.wantErr {
				t.Fatalf("err = %v, wantErr %v wantSkip %v", err, c.wantErr, c.wantSkip)
			}
			if !reflect.DeepEqual(findingTargets(got), c.want) {
				t.Fatalf("targets = %v, want %v\n%+v", findingTargets(got), c.want, got)
			}
			for _, g := range got {
				if g.Detector != "IPTablesRules" || g.Message == "" || g.Evidence["family"] != "IPv4" {
					t.Errorf("finding = %+v", g)
				}
			}
			// One save per backend per cycle (none when skipped).
			if skip && c.set != nil {
				if f.Calls(iptables.IPv4, iptables.Legacy)+f.Calls(iptables.IPv4, iptables.NFT) != 0 {
					t.Error("skipped detector ran a save")
				}
				return
			}
			if !skip && f.Calls(iptables.IPv4, iptables.Legacy) != 1 || f.Calls(iptables.IPv4, iptables.NFT) != 1 {
				t.Errorf("save calls legacy %d nft %d", f.Calls(iptables.IPv4, iptables.Legacy), f.Calls(iptables.IPv4, iptables.NFT))
			}
		})
	}
}

func TestIPTablesRulesEvidence(t *testing.T) {
	f := iptables.NewFake()
	healthy := healthyRules(t)
	f.SetRules(iptables.IPv4, iptables.Legacy, healthy)
	f.SetRules(iptables.IPv4, iptables.NFT, "*nat\n:KUBE-SERVICES - [0:0]\n:KUBE-X - [0:0]\n-A KUBE-SERVICES -j KUBE-X\nCOMMIT\n")
	f.SetRules(iptables.IPv6, iptables.Legacy, "")
	// The host uses nft (its /usr/sbin/iptables, read through the proc
	// root's PID 1), kube-proxy's container legacy: the nft set is stale.
	pf := procs.NewFake(999)
	pf.Add(fakeProc(50, 1, "kube-proxy", procT0.Add(-time.Hour), "S", "/usr/local/bin/kube-proxy"))
	n, _ := newIssue3Node(pf)
	n.ProcRoot = fakeProcRoot(t, map[int]map[string]string{
		1:  debianRoot("nft", "1.8.9"),
		50: debianRoot("legacy", "1.8.7"),
	})
	n.IPTables = f
	got, err := newIssue3Detector(t, "IPTablesRules", n, nil).Detect(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	// nat PREROUTING/OUTPUT missing in nft + the mix; ip6tables-nft-save unavailable.
	want := []string{"iptables/IPv4/backend-mix", "iptables/IPv4/nft/nat/OUTPUT/KUBE-SERVICES", "iptables/IPv4/nft/nat/PREROUTING/KUBE-SERVICES"}
	if !reflect.DeepEqual(findingTargets(got), want) {
		t.Fatalf("targets = %v", findingTargets(got))
	}
	for _, g := range got {
		if g.Target == "iptables/IPv4/backend-mix" {
			if g.Evidence["legacyKubeRules"] != 41 || g.Evidence["nftKubeRules"] != 1 || g.Evidence["nodeIptablesBackend"] != "nft" ||
				g.Evidence["kubeProxyIptablesBackend"] != "legacy" || g.Evidence["staleBackend"] != "nft" {
				t.Errorf("mix evidence = %v", g.Evidence)
			}
			if !strings.HasSuffix(g.Message, "kube-proxy's iptables writes legacy, so the nft set is the stale one") {
				t.Errorf("mix message = %q", g.Message)
			}
		}
		if u, _ := g.Evidence["unavailableBackends"].([]string); !reflect.DeepEqual(u, []string{"ip6tables-nft-save"}) {
			t.Errorf("unavailable = %v", g.Evidence["unavailableBackends"])
		}
	}
}

func TestIPTablesRulesParamsValidate(t *testing.T) {
	ty, _ := Lookup("IPTablesRules")
	p := ty.NewParams().(*IPTablesRulesParams)
	if errs := p.Validate(); len(errs) != 0 {
		t.Fatalf("defaults: %v", errs)
	}
	p.Families = []string{"IPv4", "ipv5"}
	p.Backends = nil
	p.ProxyMode = "userspace"
	p.MaxKubeRules = -1
	p.MaxSaveDuration = policy.D(-time.Second)
	p.SaveTimeout = policy.D(-2 * time.Second)
	var fields []string
	for _, e := range p.Validate() {
		fields = append(fields, e.Field)
	}
	want := []string{"families[1]", "backends", "proxyMode", "maxKubeRules", "maxSaveDuration", "saveTimeout"}
	if !reflect.DeepEqual(fields, want) {
		t.Errorf("fields = %v, want %v", fields, want)
	}
	p = ty.NewParams().(*IPTablesRulesParams)
	p.MaxSaveDuration = p.SaveTimeout
	if errs := p.Validate(); len(errs) != 1 || errs[0].Field != "maxSaveDuration" {
		t.Errorf("maxSaveDuration >= saveTimeout: %v", errs)
	}
	p = ty.NewParams().(*IPTablesRulesParams)
	p.MaxSaveDutyCycle = 1.5
	if errs := p.Validate(); len(errs) != 1 || errs[0].Field != "maxSaveDutyCycle" {
		t.Errorf("maxSaveDutyCycle 1.5: %v", errs)
	}
}

func TestIPTablesRulesSaveDutyCycle(t *testing.T) {
	f := iptables.NewFake()
	f.SetRules(iptables.IPv4, iptables.Legacy, healthyRules(t))
	f.SetRules(iptables.IPv4, iptables.NFT, "*nat\n:PREROUTING ACCEPT [0:0]\n:KUBE-SERVICES - [0:0]\nCOMMIT\n")
	f.SetDuration(iptables.IPv4, iptables.NFT, 3*time.Second) // slow: over maxSaveDuration
	n, clk := newIssue3Node(nil)
	n.IPTables = f
	d := newIssue3Detector(t, "IPTablesRules", n, func(p any) { p.(*IPTablesRulesParams).Families = []string{"IPv4"} })
	ctx := context.Background()
	calls := func() (int, int) {
		return f.Calls(iptables.IPv4, iptables.Legacy), f.Calls(iptables.IPv4, iptables.NFT)
	}
	got, err := d.Detect(ctx)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"iptables/IPv4/nft/nat/OUTPUT/KUBE-SERVICES", "iptables/IPv4/nft/nat/PREROUTING/KUBE-SERVICES", "iptables/IPv4/nft/save-duration"}
	if !reflect.DeepEqual(findingTargets(got), want) {
		t.Fatalf("targets = %v", findingTargets(got))
	}
	// 3s save at duty cycle 0.1: not again before 30s; the result is reused.
	clk.Step(20 * time.Second)
	got, _ = d.Detect(ctx)
	if l, n := calls(); l != 2 || n != 1 {
		t.Fatalf("after 20s: legacy %d nft %d saves, want 2 and 1", l, n)
	}
	if !reflect.DeepEqual(findingTargets(got), want) || got[0].Evidence["cached"] != true {
		t.Fatalf("cached findings = %+v", got)
	}
	clk.Step(11 * time.Second)
	got, _ = d.Detect(ctx)
	if l, n := calls(); l != 3 || n != 2 || got[0].Evidence["cached"] != false {
		t.Fatalf("after 31s: legacy %d nft %d, %+v", l, n, got)
	}
}

func TestIPTablesRulesProxyModeAuto(t *testing.T) {
	noPrerouting := mutate(t, healthyRules(t), func(rs *iptables.Ruleset) {
		rs.DeleteRules("nat", "PREROUTING", func(r iptables.Rule) bool { return r.Target == "KUBE-SERVICES" })
	})
	cases := []struct {
		name       string
		kp         func(n *node.Node)
		wantCheck  bool
		wantSource string
		wantSkip   string
	}{
		{name: "kube-proxy says iptables", kp: func(n *node.Node) {
			f := kubeproxy.NewFake(n.Clock, 30*time.Second)
			f.SetMode(kubeproxy.ModeIPTables, nil)
			n.KubeProxy = f
		}, wantCheck: true, wantSource: "from kube-proxy /proxyMode"},
		{name: "kube-proxy says nftables", kp: func(n *node.Node) {
			f := kubeproxy.NewFake(n.Clock, 30*time.Second)
			f.SetMode(kubeproxy.ModeNFTables, nil)
			n.KubeProxy = f
		}, wantSkip: "kube-proxy runs in nftables mode (from kube-proxy /proxyMode)"},
		{name: "kube-proxy unreachable: check anyway, say why", kp: func(n *node.Node) {
			f := kubeproxy.NewFake(n.Clock, 30*time.Second)
			f.SetMode("", errors.New("connection refused"))
			n.KubeProxy = f
		}, wantCheck: true, wantSource: "kube-proxy mode unknown: connection refused"},
		{name: "no kube-proxy adapter", kp: func(n *node.Node) {
			n.Unavailable = map[string]string{"kube-proxy": "no kube-proxy endpoints configured"}
		}, wantCheck: true, wantSource: "kube-proxy mode unknown: no kube-proxy endpoints configured"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			f := iptables.NewFake()
			f.SetRules(iptables.IPv4, iptables.Legacy, noPrerouting)
			n, _ := newIssue3Node(nil)
			n.IPTables = f
			c.kp(n)
			d := newIssue3Detector(t, "IPTablesRules", n, func(p any) {
				pp := p.(*IPTablesRulesParams)
				pp.Families, pp.Backends, pp.ProxyMode = []string{"IPv4"}, []string{"legacy"}, "auto"
			})
			got, err := d.Detect(context.Background())
			if c.wantSkip != "" {
				// nftables mode: the iptables rules are not kube-proxy's
				// dataplane; the whole detector skips, saying so.
				if r, ok := finding.IsSkip(err); !ok || !strings.HasPrefix(r, c.wantSkip) {
					t.Fatalf("err %v, want a skip starting %q", err, c.wantSkip)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if (len(got) == 1) != c.wantCheck {
				t.Fatalf("findings = %+v, want check %v", got, c.wantCheck)
			}
			if c.wantCheck && got[0].Evidence["proxyModeSource"] != c.wantSource {
				t.Errorf("source = %v, want %q", got[0].Evidence["proxyModeSource"], c.wantSource)
			}
		})
	}
}

// TestIPTablesRulesKubeProxyChains: the captured kube-proxy rules corrupted
// as the field guides describe (a component of another iptables version
// or backend restores them without their matches), in either backend.
func TestIPTablesRulesKubeProxyChains(t *testing.T) {
	healthy := healthyRules(t)
	edit := func(old, new string) string {
		t.Helper()
		if !strings.Contains(healthy, old+"\n") {
			t.Fatalf("capture has no line %q", old)
		}
		return strings.Replace(healthy, old+"\n", new, 1)
	}
	noPostrouting := edit(`-A POSTROUTING -m comment --comment "kubernetes postrouting rules" -j KUBE-POSTROUTING`, "")
	bareReturn := edit(`-A KUBE-POSTROUTING -m mark ! --mark 0x4000/0x4000 -j RETURN`, "-A KUBE-POSTROUTING -j RETURN\n")
	noMasq := edit(`-A KUBE-POSTROUTING -m comment --comment "kubernetes service traffic requiring SNAT" -j MASQUERADE --random-fully`, "")
	noMark := edit(`-A KUBE-MARK-MASQ -j MARK --set-xmark 0x4000/0x4000`, "")
	// Every endpoint's hairpin rule lost its -s: five chains, one finding.
	sepNoSource := mutate(t, healthy, func(rs *iptables.Ruleset) {
		for _, c := range rs.Table("nat").Chains {
			if !strings.HasPrefix(c.Name, "KUBE-SEP-") {
				continue
			}
			for i, r := range c.Rules {
				if r.Target == "KUBE-MARK-MASQ" {
					c.Rules[i].Args = r.Args[2:] // drop "-s IP"
				}
			}
		}
	})
	cases := []struct {
		name    string
		legacy  string
		nft     string
		mode    string
		want    []string
		sev     finding.Severity
		count   int
		missing []string
	}{
		{name: "healthy", legacy: healthy, nft: emptyNFT},
		{name: "POSTROUTING jump missing (nft)", legacy: "", nft: noPostrouting,
			want: []string{"iptables/IPv4/nft/nat/POSTROUTING/KUBE-POSTROUTING"}, sev: finding.Critical, count: 1},
		{name: "RETURN lost its mark match", legacy: bareReturn, nft: emptyNFT,
			want: []string{"iptables/IPv4/legacy/nat/KUBE-POSTROUTING/return"}, sev: finding.Critical, count: 1, missing: []string{"-m mark ! --mark 0x4000/0x4000"}},
		{name: "MASQUERADE missing", legacy: noMasq, nft: emptyNFT,
			want: []string{"iptables/IPv4/legacy/nat/KUBE-POSTROUTING/masquerade"}, sev: finding.Critical, count: 1},
		{name: "mark rule missing", legacy: noMark, nft: emptyNFT,
			want: []string{"iptables/IPv4/legacy/nat/KUBE-MARK-MASQ/mark"}, sev: finding.Critical, count: 1},
		{name: "hairpin rules lost -s: one finding for all endpoint chains", legacy: sepNoSource, nft: emptyNFT,
			want: []string{"iptables/IPv4/legacy/nat/KUBE-SEP-*/lost-match"}, sev: finding.Warning, count: 5, missing: []string{"-s"}},
		{name: "ipvs mode: not judged", legacy: noMasq, nft: emptyNFT, mode: "ipvs"},
		{name: "mode unknown: not judged", legacy: noMasq, nft: emptyNFT, mode: "-"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			f := iptables.NewFake()
			f.SetRules(iptables.IPv4, iptables.Legacy, c.legacy)
			f.SetRules(iptables.IPv4, iptables.NFT, c.nft)
			n, _ := newIssue3Node(nil)
			n.IPTables = f
			d := newIssue3Detector(t, "IPTablesRules", n, func(p any) {
				pp := p.(*IPTablesRulesParams)
				pp.Families = []string{"IPv4"}
				switch c.mode {
				case "-":
					pp.ProxyMode = ""
				case "":
				default:
					pp.ProxyMode = c.mode
				}
			})
			got, err := d.Detect(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(findingTargets(got), c.want) {
				t.Fatalf("targets = %v, want %v\n%+v", findingTargets(got), c.want, got)
			}
			if len(got) == 0 {
				return
			}
			g := got[0]
			if g.Severity != c.sev || g.Evidence["count"] != c.count || g.Evidence["family"] != "IPv4" || g.Evidence["impact"] == "" || g.Evidence["canonical"] == "" {
				t.Errorf("finding = %+v", g)
			}
			if c.missing != nil && !reflect.DeepEqual(g.Evidence["missingConditions"], c.missing) {
				t.Errorf("missing = %v, want %v", g.Evidence["missingConditions"], c.missing)
			}
			if rules, _ := g.Evidence["rules"].([]string); c.count > 1 && len(rules) != maxDefectExamples {
				t.Errorf("example rules = %v", rules)
			}
			t.Log(g.Message)
		})
	}
}

// TestIPTablesRulesDefectsFollowTheRuleset: kube-proxy's chain defects are
// computed once per rule set, and a new rule set (a changed save) is
// judged again in the next cycle of the same detector, both ways.
func TestIPTablesRulesDefectsFollowTheRuleset(t *testing.T) {
	healthy := healthyRules(t)
	masq := `-A KUBE-POSTROUTING -m comment --comment "kubernetes service traffic requiring SNAT" -j MASQUERADE --random-fully` + "\n"
	if !strings.Contains(healthy, masq) {
		t.Fatal("capture has no MASQUERADE rule")
	}
	noMasq := strings.Replace(healthy, masq, "", 1)
	f := iptables.NewFake()
	f.SetRules(iptables.IPv4, iptables.NFT, emptyNFT)
	n, clk := newIssue3Node(nil)
	n.IPTables = f
	d := newIssue3Detector(t, "IPTablesRules", n, func(p any) {
		p.(*IPTablesRulesParams).Families = []string{"IPv4"}
	})
	want := "iptables/IPv4/legacy/nat/KUBE-POSTROUTING/masquerade"
	for i, c := range []struct {
		rules string
		want  []string
	}{{healthy, nil}, {healthy, nil}, {noMasq, []string{want}}, {noMasq, []string{want}}, {healthy, nil}} {
		f.SetRules(iptables.IPv4, iptables.Legacy, c.rules)
		clk.Step(time.Minute) // past the save duty cycle
		got, err := d.Detect(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(findingTargets(got), c.want) {
			t.Fatalf("cycle %d: targets = %v, want %v", i+1, findingTargets(got), c.want)
		}
	}
}
