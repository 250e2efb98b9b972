package iptables

import (
	"fmt"
	"reflect"
	"strings"
	"testing"
)

// defectKeys renders defects as "table/chain/check" (jumps: "table/from/to").
func defectKeys(ds []Defect) []string {
	var out []string
	for _, d := range ds {
		k := d.Table + "/" + d.Chain + "/" + d.Check
		if d.Check == CheckJump {
			k = d.Table + "/" + d.Chain + "/" + d.To
		}
		out = append(out, k)
	}
	return out
}

// corrupt replaces one exact line of the capture (it must be there).
func corrupt(t *testing.T, text, old, new string) *Ruleset {
	t.Helper()
	if !strings.Contains(text, old+"\n") {
		t.Fatalf("capture has no line %q", old)
	}
	rs, err := ParseString(strings.Replace(text, old+"\n", new, 1))
	if err != nil {
		t.Fatal(err)
	}
	return rs
}

func TestKubeProxyDefectsCapture(t *testing.T) {
	rs, text := loadFixture(t)
	if ds := KubeProxyDefects(rs, DefectOptions{}); len(ds) != 0 {
		t.Fatalf("the captured healthy rules have defects: %+v", ds)
	}
	const (
		postrouting = `-A POSTROUTING -m comment --comment "kubernetes postrouting rules" -j KUBE-POSTROUTING`
		markMasq    = `-A KUBE-MARK-MASQ -j MARK --set-xmark 0x4000/0x4000`
		ret         = `-A KUBE-POSTROUTING -m mark ! --mark 0x4000/0x4000 -j RETURN`
		clear       = `-A KUBE-POSTROUTING -j MARK --set-xmark 0x4000/0x0`
		masq        = `-A KUBE-POSTROUTING -m comment --comment "kubernetes service traffic requiring SNAT" -j MASQUERADE --random-fully`
		svcRule     = `-A KUBE-SERVICES -d 10.96.91.18/32 -p tcp -m comment --comment "default/web:http cluster IP" -m tcp --dport 80 -j KUBE-SVC-CDGGSHYLG3RE2FKL`
		lbRule      = `-A KUBE-SVC-CDGGSHYLG3RE2FKL -m comment --comment "default/web:http -> 10.244.0.5:8080" -m statistic --mode random --probability 0.50000000000 -j KUBE-SEP-7U6MWNJWR3SADOJA`
		sepMasq     = `-A KUBE-SEP-7U6MWNJWR3SADOJA -s 10.244.0.5/32 -m comment --comment "default/web:http" -j KUBE-MARK-MASQ`
		fwd         = `-A KUBE-FORWARD -m comment --comment "kubernetes forwarding rules" -m mark --mark 0x4000/0x4000 -j ACCEPT`
		fwdInvalid  = `-A KUBE-FORWARD -m conntrack --ctstate INVALID -m nfacct --nfacct-name  ct_state_invalid_dropped_pkts -j DROP`
		firewall    = `-A KUBE-FIREWALL ! -s 127.0.0.0/8 -d 127.0.0.0/8 -m comment --comment "block incoming localnet connections" -m conntrack ! --ctstate RELATED,ESTABLISHED,DNAT -j DROP`
		fwdJump     = `-A FORWARD -m conntrack --ctstate NEW -m comment --comment "kubernetes service portals" -j KUBE-SERVICES`
		nodeports   = `-A KUBE-SERVICES -m comment --comment "kubernetes service nodeports; NOTE: this must be the last rule in this chain" -m addrtype --dst-type LOCAL -j KUBE-NODEPORTS`
	)
	cases := []struct {
		name, old, new string
		opts           DefectOptions
		want           []string
		missing        []string // of the first defect
		breaks         bool
	}{
		{name: "POSTROUTING jump deleted", old: postrouting, new: "",
			want: []string{"nat/POSTROUTING/KUBE-POSTROUTING"}, breaks: true},
		{name: "mark rule deleted", old: markMasq, new: "",
			want: []string{"nat/KUBE-MARK-MASQ/mark"}, breaks: true},
		{name: "mark rule turned into set-mark (clobbers other marks)", old: markMasq, new: "-A KUBE-MARK-MASQ -j MARK --set-xmark 0x4000/0xffffffff\n",
			want: []string{"nat/KUBE-MARK-MASQ/mark"}, breaks: true},
		{name: "mark rule with a different mark than POSTROUTING's", old: markMasq, new: "-A KUBE-MARK-MASQ -j MARK --set-xmark 0x8000/0x8000\n",
			want: []string{"nat/KUBE-MARK-MASQ/mark"}, breaks: true},
		{name: "RETURN lost its mark match", old: ret, new: "-A KUBE-POSTROUTING -j RETURN\n",
			want: []string{"nat/KUBE-POSTROUTING/return"}, missing: []string{"-m mark ! --mark 0x4000/0x4000"}, breaks: true},
		{name: "RETURN lost its negation", old: ret, new: "-A KUBE-POSTROUTING -m mark --mark 0x4000/0x4000 -j RETURN\n",
			want: []string{"nat/KUBE-POSTROUTING/return"}, breaks: true},
		{name: "RETURN deleted", old: ret, new: "",
			want: []string{"nat/KUBE-POSTROUTING/return"}},
		{name: "clear-mark deleted", old: clear, new: "",
			want: []string{"nat/KUBE-POSTROUTING/clear-mark"}},
		{name: "MASQUERADE deleted", old: masq, new: "",
			want: []string{"nat/KUBE-POSTROUTING/masquerade"}, breaks: true},
		{name: "MASQUERADE without --random-fully is canonical (no support)", old: masq, new: `-A KUBE-POSTROUTING -m comment --comment "kubernetes service traffic requiring SNAT" -j MASQUERADE` + "\n"},
		{name: "ClusterIP rule lost -d and --dport", old: svcRule, new: `-A KUBE-SERVICES -p tcp -m comment --comment "default/web:http cluster IP" -m tcp -j KUBE-SVC-CDGGSHYLG3RE2FKL` + "\n",
			want: []string{"nat/KUBE-SERVICES/lost-match"}, missing: []string{"-d", "--dport"}, breaks: true},
		{name: "load-balancing rule lost its statistic match", old: lbRule, new: `-A KUBE-SVC-CDGGSHYLG3RE2FKL -m comment --comment "default/web:http -> 10.244.0.5:8080" -j KUBE-SEP-7U6MWNJWR3SADOJA` + "\n",
			want: []string{"nat/KUBE-SVC-CDGGSHYLG3RE2FKL/shadowed"}, breaks: true},
		{name: "endpoint hairpin rule lost -s", old: sepMasq, new: `-A KUBE-SEP-7U6MWNJWR3SADOJA -m comment --comment "default/web:http" -j KUBE-MARK-MASQ` + "\n",
			want: []string{"nat/KUBE-SEP-7U6MWNJWR3SADOJA/lost-match"}, missing: []string{"-s"}},
		{name: "KUBE-FORWARD accept lost its mark match", old: fwd, new: `-A KUBE-FORWARD -m comment --comment "kubernetes forwarding rules" -j ACCEPT` + "\n",
			want: []string{"filter/KUBE-FORWARD/lost-match"}, missing: []string{"--mark or --ctstate RELATED,ESTABLISHED"}},
		{name: "KUBE-FORWARD accept with another mark", old: fwd, new: `-A KUBE-FORWARD -m comment --comment "kubernetes forwarding rules" -m mark --mark 0x8000/0x8000 -j ACCEPT` + "\n",
			want: []string{"filter/KUBE-FORWARD/lost-match"}, breaks: true},
		{name: "KUBE-FORWARD INVALID drop became bare", old: fwdInvalid, new: "-A KUBE-FORWARD -j DROP\n",
			want: []string{"filter/KUBE-FORWARD/lost-match"}, missing: []string{"--ctstate INVALID"}, breaks: true},
		{name: "KUBE-FIREWALL lost ! -s (drops loopback)", old: firewall, new: `-A KUBE-FIREWALL -d 127.0.0.0/8 -m comment --comment "block incoming localnet connections" -m conntrack ! --ctstate RELATED,ESTABLISHED,DNAT -j DROP` + "\n",
			want: []string{"filter/KUBE-FIREWALL/lost-match"}, missing: []string{"! -s 127.0.0.0/8"}, breaks: true},
		{name: "bare KUBE-FIREWALL DROP", old: firewall, new: "-A KUBE-FIREWALL -j DROP\n",
			want: []string{"filter/KUBE-FIREWALL/lost-match"}, missing: []string{"--mark or -d 127.0.0.0/8"}, breaks: true},
		{name: "bare KUBE-FIREWALL DROP left to the caller", old: firewall, new: "-A KUBE-FIREWALL -j DROP\n", opts: DefectOptions{SkipBareFirewallDrop: true}},
		{name: "filter FORWARD jump lost ctstate NEW", old: fwdJump, new: `-A FORWARD -m comment --comment "kubernetes service portals" -j KUBE-SERVICES` + "\n",
			want: []string{"filter/FORWARD/KUBE-SERVICES"}, missing: []string{"--ctstate NEW"}},
		{name: "nodeports tail rule lost its addrtype match", old: nodeports, new: `-A KUBE-SERVICES -m comment --comment "kubernetes service nodeports; NOTE: this must be the last rule in this chain" -j KUBE-NODEPORTS` + "\n",
			want: []string{"nat/KUBE-SERVICES/lost-match"}, missing: []string{"--dst-type LOCAL or -d"}, breaks: true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			rs := corrupt(t, text, c.old, c.new)
			got := KubeProxyDefects(rs, c.opts)
			if !reflect.DeepEqual(defectKeys(got), c.want) {
				t.Fatalf("defects = %v, want %v\n%+v", defectKeys(got), c.want, got)
			}
			if len(got) == 0 {
				return
			}
			d := got[0]
			if c.missing != nil && !reflect.DeepEqual(d.Missing, c.missing) {
				t.Errorf("missing = %q, want %q", d.Missing, c.missing)
			}
			if d.Breaks != c.breaks {
				t.Errorf("breaks = %v, want %v", d.Breaks, c.breaks)
			}
			if d.Want == "" || d.Problem == "" || d.Impact == "" {
				t.Errorf("defect without want/problem/impact: %+v", d)
			}
			if (d.Rule == "") != (c.new == "") || (d.Rule != "" && d.Line == 0) {
				t.Errorf("rule %q line %d for a replaced line %q", d.Rule, d.Line, c.new)
			}
		})
	}
}

func TestKubeProxyDefectsNotKubeProxy(t *testing.T) {
	for name, text := range map[string]string{
		"empty":                "",
		"no kube-proxy chains": "*nat\n:POSTROUTING ACCEPT [0:0]\n-A POSTROUTING -j MASQUERADE\nCOMMIT\n",
		"kubelet hint only":    "*mangle\n:KUBE-IPTABLES-HINT - [0:0]\nCOMMIT\n",
		"ipvs mode's chains":   "*nat\n:POSTROUTING ACCEPT [0:0]\n:KUBE-SERVICES - [0:0]\n:KUBE-POSTROUTING - [0:0]\n:KUBE-NODE-PORT - [0:0]\n-A KUBE-POSTROUTING -m set --match-set KUBE-LOOP-BACK dst,dst,src -j MASQUERADE\nCOMMIT\n",
		"kube-router's chains": "*filter\n:KUBE-ROUTER-INPUT - [0:0]\n-A KUBE-ROUTER-INPUT -j ACCEPT\nCOMMIT\n",
	} {
		rs, err := ParseString(text)
		if err != nil {
			t.Fatal(err)
		}
		if ds := KubeProxyDefects(rs, DefectOptions{}); len(ds) != 0 {
			t.Errorf("%s: %+v", name, ds)
		}
	}
}

func TestKubeProxyDefectsMissingChains(t *testing.T) {
	partial := "*nat\n:PREROUTING ACCEPT [0:0]\n:OUTPUT ACCEPT [0:0]\n:POSTROUTING ACCEPT [0:0]\n:KUBE-SERVICES - [0:0]\n-A PREROUTING -j KUBE-SERVICES\n-A OUTPUT -j KUBE-SERVICES\nCOMMIT\n"
	rs, err := ParseString(partial)
	if err != nil {
		t.Fatal(err)
	}
	// A partial KUBE-* set (leftovers, no Service chains): not judged.
	if ds := KubeProxyDefects(rs, DefectOptions{}); len(ds) != 0 {
		t.Fatalf("partial set: %+v", ds)
	}
	rs, err = ParseString(strings.Replace(partial, ":KUBE-SERVICES - [0:0]\n", ":KUBE-SERVICES - [0:0]\n:KUBE-SVC-X - [0:0]\n", 1))
	if err != nil {
		t.Fatal(err)
	}
	got := defectKeys(KubeProxyDefects(rs, DefectOptions{}))
	want := []string{"nat/KUBE-MARK-MASQ/mark", "nat/KUBE-POSTROUTING/masquerade"}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("defects = %v, want %v", got, want)
	}
}

// A configured masqueradeBit (here 15: 0x8000) is read from the rules, not
// assumed.
func TestKubeProxyDefectsOtherMark(t *testing.T) {
	_, text := loadFixture(t)
	text = strings.ReplaceAll(text, "0x4000", "0x8000")
	rs, err := ParseString(text)
	if err != nil {
		t.Fatal(err)
	}
	if ds := KubeProxyDefects(rs, DefectOptions{}); len(ds) != 0 {
		t.Fatalf("mark 0x8000 everywhere: %+v", ds)
	}
	rs = corrupt(t, text, "-A KUBE-POSTROUTING -m mark ! --mark 0x8000/0x8000 -j RETURN", "-A KUBE-POSTROUTING -j RETURN\n")
	ds := KubeProxyDefects(rs, DefectOptions{})
	if len(ds) != 1 || fmt.Sprint(ds[0].Missing) != "[-m mark ! --mark 0x8000/0x8000]" {
		t.Fatalf("defects = %+v", ds)
	}
}

func FuzzKubeProxyDefects(f *testing.F) {
	_, text := loadFixture(f)
	f.Add(text)
	f.Add("*nat\n:KUBE-POSTROUTING - [0:0]\n-A KUBE-POSTROUTING -j MARK --set-xmark 0xzz/\nCOMMIT\n")
	f.Fuzz(func(t *testing.T, s string) {
		rs, err := ParseString(s)
		if err != nil {
			return
		}
		for _, d := range KubeProxyDefects(rs, DefectOptions{}) {
			if d.Table == "" || d.Chain == "" || d.Check == "" || d.Problem == "" {
				t.Fatalf("incomplete defect %+v", d)
			}
		}
	})
}

// BenchmarkKubeProxyDefects10kServices: a kube-proxy-shaped rule set of
// 10,000 Services with 5 endpoints each (about 130k nat rules), all
// canonical: the cost the check adds to each IPTablesRules save.
func BenchmarkKubeProxyDefects10kServices(b *testing.B) {
	_, text := loadFixture(b)
	var nb strings.Builder
	nb.WriteString(text[:strings.Index(text, "*nat")])
	nb.WriteString("*nat\n:PREROUTING ACCEPT [0:0]\n:OUTPUT ACCEPT [0:0]\n:POSTROUTING ACCEPT [0:0]\n:KUBE-SERVICES - [0:0]\n:KUBE-MARK-MASQ - [0:0]\n:KUBE-POSTROUTING - [0:0]\n")
	var rules strings.Builder
	for s := 0; s < 10000; s++ {
		svc := fmt.Sprintf("KUBE-SVC-%012d", s)
		nb.WriteString(":" + svc + " - [0:0]\n")
		rules.WriteString(fmt.Sprintf("-A KUBE-SERVICES -d 10.96.%d.%d/32 -p tcp -m comment --comment \"ns/s%d:http cluster IP\" -m tcp --dport 80 -j %s\n", s/250, s%250, s, svc))
		for e := 0; e < 5; e++ {
			sep := fmt.Sprintf("KUBE-SEP-%06d%06d", s, e)
			nb.WriteString(":" + sep + " - [0:0]\n")
			if e < 4 {
				rules.WriteString(fmt.Sprintf("-A %s -m comment --comment \"ns/s%d:http -> 10.244.0.%d:8080\" -m statistic --mode random --probability 0.2 -j %s\n", svc, s, e, sep))
			} else {
				rules.WriteString(fmt.Sprintf("-A %s -m comment --comment \"ns/s%d:http -> 10.244.0.%d:8080\" -j %s\n", svc, s, e, sep))
			}
			rules.WriteString(fmt.Sprintf("-A %s -s 10.244.0.%d/32 -m comment --comment \"ns/s%d:http\" -j KUBE-MARK-MASQ\n", sep, e, s))
			rules.WriteString(fmt.Sprintf("-A %s -p tcp -m comment --comment \"ns/s%d:http\" -m tcp -j DNAT --to-destination 10.244.0.%d:8080\n", sep, s, e))
		}
	}
	nb.WriteString("-A PREROUTING -j KUBE-SERVICES\n-A OUTPUT -j KUBE-SERVICES\n-A POSTROUTING -j KUBE-POSTROUTING\n")
	nb.WriteString("-A KUBE-MARK-MASQ -j MARK --set-xmark 0x4000/0x4000\n-A KUBE-POSTROUTING -m mark ! --mark 0x4000/0x4000 -j RETURN\n-A KUBE-POSTROUTING -j MARK --set-xmark 0x4000/0x0\n-A KUBE-POSTROUTING -j MASQUERADE\n")
	nb.WriteString(rules.String())
	nb.WriteString("COMMIT\n")
	rs, err := ParseString(nb.String())
	if err != nil {
		b.Fatal(err)
	}
	b.ReportMetric(float64(rs.RuleCount()), "rules")
	b.ResetTimer()
	b.ReportAllocs()
	for i := 0; i < b.N; i++ {
		if ds := KubeProxyDefects(rs, DefectOptions{}); len(ds) != 0 {
			b.Fatalf("defects: %+v", ds[:1])
		}
	}
}
