package iptables

import (
	"fmt"
	"os"
	"reflect"
	"runtime"
	"strings"
	"testing"
)

func loadFixture(t testing.TB) (*Ruleset, string) {
	t.Helper()
	b, err := os.ReadFile("testdata/iptables-save-legacy.txt")
	if err != nil {
		t.Fatal(err)
	}
	rs, err := Parse(strings.NewReader(string(b)))
	if err != nil {
		t.Fatal(err)
	}
	return rs, string(b)
}

func TestParseCapturedKubeProxyRules(t *testing.T) {
	rs, _ := loadFixture(t)
	var names []string
	for _, tb := range rs.Tables {
		names = append(names, tb.Name)
	}
	if !reflect.DeepEqual(names, []string{"filter", "mangle", "nat"}) {
		t.Fatalf("tables = %v", names)
	}
	nat := rs.Table("nat")
	for _, c := range []string{"PREROUTING", "OUTPUT"} {
		if !nat.Chain(c).JumpsTo("KUBE-SERVICES") {
			t.Errorf("nat %s does not jump to KUBE-SERVICES", c)
		}
	}
	if nat.Chain("POSTROUTING").JumpsTo("KUBE-SERVICES") {
		t.Error("POSTROUTING jumps to KUBE-SERVICES")
	}
	if !nat.Chain("PREROUTING").Builtin() || nat.Chain("KUBE-SERVICES").Builtin() {
		t.Error("builtin detection wrong")
	}
	if got := len(nat.Chain("KUBE-SERVICES").Rules); got != 4 {
		t.Errorf("KUBE-SERVICES has %d rules, want 4", got)
	}
	fw := rs.Table("filter").Chain("KUBE-FIREWALL")
	if len(fw.Rules) != 1 || fw.Rules[0].Target != "DROP" {
		t.Fatalf("KUBE-FIREWALL = %+v", fw.Rules)
	}
	// "! -s 127.0.0.0/8 -d 127.0.0.0/8 -m conntrack ! --ctstate RELATED,ESTABLISHED,DNAT"
	if c := fw.Rules[0].Conditions(); len(c) != 10 || c[0] != "!" || c[1] != "-s" {
		t.Errorf("conditions = %q", c)
	}
	pr := nat.Chain("KUBE-POSTROUTING").Rules[0]
	if v, neg, ok := pr.Match("mark", "--mark"); !ok || !neg || v != "0x4000/0x4000" {
		t.Errorf("mark match = %q %v %v", v, neg, ok)
	}
	if _, _, ok := nat.Chain("KUBE-POSTROUTING").Rules[2].Match("mark", "--mark"); ok {
		t.Error("mark match found on a rule without one")
	}
	svc := nat.Chain("KUBE-SERVICES").Rules[0]
	if svc.Args[7] != "default/kubernetes:https cluster IP" {
		t.Errorf("quoted comment = %q", svc.Args[7])
	}
	if rs.RuleCount() != 41 {
		t.Errorf("RuleCount = %d", rs.RuleCount())
	}
	// Every rule of this capture is kube-proxy's: filter 11 jumps to KUBE-*
	// + 4 in KUBE-* chains; nat 3 jumps + 23 in KUBE-* chains.
	if got := rs.KubeRuleCount(); got != 41 {
		t.Errorf("KubeRuleCount = %d, want 41", got)
	}
}

func TestParseErrors(t *testing.T) {
	cases := map[string]string{
		"rule outside table":  "-A INPUT -j ACCEPT\n",
		"undeclared chain":    "*filter\n:INPUT ACCEPT [0:0]\n-A FOO -j ACCEPT\nCOMMIT\n",
		"no commit":           "*filter\n:INPUT ACCEPT [0:0]\n",
		"nested table":        "*filter\n*nat\nCOMMIT\n",
		"commit outside":      "COMMIT\n",
		"garbage":             "*filter\nhello\nCOMMIT\n",
		"unterminated quote":  "*filter\n:INPUT ACCEPT [0:0]\n-A INPUT -m comment --comment \"abc -j ACCEPT\nCOMMIT\n",
		"duplicate chain":     "*filter\n:INPUT ACCEPT [0:0]\n:INPUT ACCEPT [0:0]\nCOMMIT\n",
		"chain outside table": ":INPUT ACCEPT [0:0]\n",
		"insert not append":   "*filter\n:INPUT ACCEPT [0:0]\n-I INPUT -j ACCEPT\nCOMMIT\n",
		"table twice":         "*nat\nCOMMIT\n*nat\nCOMMIT\n",
	}
	for name, in := range cases {
		if _, err := Parse(strings.NewReader(in)); err == nil {
			t.Errorf("%s: no error", name)
		}
	}
}

func TestQuotedEscapesAndWarnings(t *testing.T) {
	in := "*filter\n:INPUT ACCEPT [0:0]\n-A INPUT -m comment --comment \"say \\\"hi\\\" -j DROP\" -j ACCEPT\nCOMMIT\n# Warning: iptables-legacy tables present, use iptables-legacy-save to see them\n"
	rs, err := Parse(strings.NewReader(in))
	if err != nil {
		t.Fatal(err)
	}
	r := rs.Table("filter").Chain("INPUT").Rules[0]
	if r.Target != "ACCEPT" || r.Args[3] != `say "hi" -j DROP` {
		t.Errorf("rule = %+v", r)
	}
	if len(r.Conditions()) != 0 {
		t.Errorf("comment counted as condition: %q", r.Conditions())
	}
	if len(rs.Warnings) != 1 || !strings.Contains(rs.Warnings[0], "legacy tables present") {
		t.Errorf("warnings = %q", rs.Warnings)
	}
}

func TestFormatRoundTrip(t *testing.T) {
	rs, _ := loadFixture(t)
	again, err := Parse(strings.NewReader(rs.String()))
	if err != nil {
		t.Fatal(err)
	}
	if !equalRulesets(rs, again) {
		t.Fatalf("round trip differs:\n%s", again.String())
	}
	if n := again.DeleteRules("nat", "PREROUTING", func(r Rule) bool { return r.Target == "KUBE-SERVICES" }); n != 1 {
		t.Fatalf("deleted %d", n)
	}
	if again.Table("nat").Chain("PREROUTING").JumpsTo("KUBE-SERVICES") {
		t.Fatal("jump still there")
	}
}

func TestParseVersion(t *testing.T) {
	cases := []struct {
		in      string
		v       string
		b       Backend
		wantErr bool
	}{
		{in: "iptables v1.8.9 (nf_tables)\n", v: "1.8.9", b: NFT},
		{in: "iptables v1.8.9 (legacy)\n", v: "1.8.9", b: Legacy},
		{in: "iptables v1.6.1\n", v: "1.6.1", b: Legacy},
		{in: "iptables v1.8.9 (weird)", wantErr: true},
		{in: "", wantErr: true},
	}
	for _, c := range cases {
		v, b, err := ParseVersion(c.in)
		if (err != nil) != c.wantErr || (!c.wantErr && (v != c.v || b != c.b)) {
			t.Errorf("%q: got %q %q %v", c.in, v, b, err)
		}
	}
}

// equalRulesets compares the parts that Format preserves (not line numbers,
// not the order of tables, which iptables-legacy-save prints in kernel
// registration order).
func equalRulesets(a, b *Ruleset) bool {
	if len(a.Tables) != len(b.Tables) || !reflect.DeepEqual(a.Warnings, b.Warnings) {
		return false
	}
	for _, ta := range a.Tables {
		tb := b.Table(ta.Name)
		if tb == nil || len(ta.Chains) != len(tb.Chains) {
			return false
		}
		for j, ca := range ta.Chains {
			cb := tb.Chains[j]
			if ca.Name != cb.Name || ca.Policy != cb.Policy || len(ca.Rules) != len(cb.Rules) {
				return false
			}
			for k, ra := range ca.Rules {
				rb := cb.Rules[k]
				if ra.Target != rb.Target || ra.Goto != rb.Goto || !reflect.DeepEqual(ra.Args, rb.Args) {
					return false
				}
			}
		}
	}
	return true
}

func FuzzParse(f *testing.F) {
	_, fixture := loadFixture(f)
	f.Add(fixture)
	f.Add("*filter\n:INPUT ACCEPT [0:0]\n-A INPUT -m comment --comment \"a \\\"b\\\"\" -g X\nCOMMIT\n# Warning: x\n")
	f.Fuzz(func(t *testing.T, in string) {
		rs, err := Parse(strings.NewReader(in))
		if err != nil {
			return
		}
		_ = rs.KubeRuleCount()
		out := rs.String()
		again, err := Parse(strings.NewReader(out))
		if err != nil {
			t.Fatalf("formatted output does not parse: %v\n%s", err, out)
		}
		if !equalRulesets(rs, again) {
			t.Fatalf("round trip differs:\nin:  %q\nout: %q", in, out)
		}
	})
}

// natTable builds a kube-proxy-shaped nat table with about n rules.
func natTable(n int) string {
	var b strings.Builder
	b.WriteString("# Generated by iptables-save v1.8.9\n*nat\n:PREROUTING ACCEPT [0:0]\n:INPUT ACCEPT [0:0]\n:OUTPUT ACCEPT [0:0]\n:POSTROUTING ACCEPT [0:0]\n:KUBE-SERVICES - [0:0]\n:KUBE-MARK-MASQ - [0:0]\n")
	svcs := n / 5 // per service: 1 KUBE-SERVICES rule + 1 SVC rule + 1 SEP chain with 2 rules + ~1
	for i := 0; i < svcs; i++ {
		fmt.Fprintf(&b, ":KUBE-SVC-%012d - [0:0]\n:KUBE-SEP-%012d - [0:0]\n", i, i)
	}
	b.WriteString("-A PREROUTING -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES\n")
	b.WriteString("-A OUTPUT -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES\n")
	b.WriteString("-A KUBE-MARK-MASQ -j MARK --set-xmark 0x4000/0x4000\n")
	for i := 0; i < svcs; i++ {
		ip := fmt.Sprintf("10.%d.%d.%d", 96+i/65536%100, i/256%256, i%256)
		fmt.Fprintf(&b, "-A KUBE-SERVICES -d %s/32 -p tcp -m comment --comment \"ns%d/svc%d:http cluster IP\" -m tcp --dport 80 -j KUBE-SVC-%012d\n", ip, i%50, i, i)
		fmt.Fprintf(&b, "-A KUBE-SVC-%012d ! -s 10.244.0.0/16 -d %s/32 -p tcp -m comment --comment \"ns%d/svc%d:http cluster IP\" -m tcp --dport 80 -j KUBE-MARK-MASQ\n", i, ip, i%50, i)
		fmt.Fprintf(&b, "-A KUBE-SVC-%012d -m comment --comment \"ns%d/svc%d:http -> 10.244.1.%d:8080\" -j KUBE-SEP-%012d\n", i, i%50, i, i%250, i)
		fmt.Fprintf(&b, "-A KUBE-SEP-%012d -s 10.244.1.%d/32 -m comment --comment \"ns%d/svc%d:http\" -j KUBE-MARK-MASQ\n", i, i%250, i%50, i)
		fmt.Fprintf(&b, "-A KUBE-SEP-%012d -p tcp -m comment --comment \"ns%d/svc%d:http\" -m tcp -j DNAT --to-destination 10.244.1.%d:8080\n", i, i%50, i, i%250)
	}
	b.WriteString("COMMIT\n")
	return b.String()
}

// BenchmarkParse100kNat parses a kube-proxy-shaped nat table of 100k rules.
// Compare with BenchmarkSaveLegacy100kNat (the iptables-legacy-save run of
// the same table in a namespace, root only).
func BenchmarkParse100kNat(b *testing.B) {
	text := natTable(100000)
	b.SetBytes(int64(len(text)))
	b.ReportAllocs()
	for b.Loop() {
		rs, err := ParseString(text)
		if err != nil {
			b.Fatal(err)
		}
		if rs.RuleCount() < 100000 {
			b.Fatalf("only %d rules", rs.RuleCount())
		}
	}
}

// BenchmarkParse20kNatRetained: the heap a kept 20k-rule save holds (the
// snapshot Save reuses while nothing changes), per rule.
func BenchmarkParse20kNatRetained(b *testing.B) {
	text := natTable(20000)
	var retained uint64
	for b.Loop() {
		runtime.GC()
		var m0, m1 runtime.MemStats
		runtime.ReadMemStats(&m0)
		rs, err := ParseString(string([]byte(text)))
		if err != nil {
			b.Fatal(err)
		}
		runtime.GC()
		runtime.ReadMemStats(&m1)
		runtime.KeepAlive(rs)
		retained = m1.HeapAlloc - m0.HeapAlloc
	}
	b.ReportMetric(float64(retained)/20000, "retained-B/rule")
}
