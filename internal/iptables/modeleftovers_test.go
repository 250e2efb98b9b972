package iptables

import (
	"os"
	"strings"
	"testing"
)

// ipvsModeSave sketches kube-proxy v1.34's own iptables rules in IPVS mode
// (the chains of pkg/proxy/ipvs/proxier.go iptablesChains and jumps) with
// the canaries and the kubelet's chains a node also has, legacy backend.
// Its KUBE-IPVS-FILTER REJECT is IPVS mode's own. The real one, without
// the kubelet's chains, is testdata/iptables-save-ipvs-mode.txt.
var ipvsModeSave = testdataString("testdata/ipvs-mode-sketch.txt")

// iptablesModeRejects is what iptables mode leaves in the filter table
// for a Service without endpoints (kubernetes/kubernetes#102314).
const iptablesModeRejects = `*filter
:INPUT ACCEPT [0:0]
:FORWARD ACCEPT [0:0]
:OUTPUT ACCEPT [0:0]
:KUBE-EXTERNAL-SERVICES - [0:0]
:KUBE-SERVICES - [0:0]
-A INPUT -m conntrack --ctstate NEW -m comment --comment "kubernetes externally-visible service portals" -j KUBE-EXTERNAL-SERVICES
-A FORWARD -m conntrack --ctstate NEW -m comment --comment "kubernetes service portals" -j KUBE-SERVICES
-A OUTPUT -m conntrack --ctstate NEW -m comment --comment "kubernetes service portals" -j KUBE-SERVICES
-A KUBE-SERVICES -d 10.96.77.77/32 -p tcp -m comment --comment "ipvs-e2e/web:http has no endpoints" -m tcp --dport 80 -j REJECT --reject-with icmp-port-unreachable
COMMIT
`

func parseSave(t testing.TB, s string) *Ruleset {
	t.Helper()
	rs, err := ParseString(s)
	if err != nil {
		t.Fatal(err)
	}
	return rs
}

func TestClassifyIPTablesModeLeftovers(t *testing.T) {
	// IPVS mode's own rules are never leftovers: those of the sketch
	// above and those the real kube-proxy v1.34.4 wrote in IPVS mode (in
	// the VM of TestVMKubeProxyIPVS, legacy backend).
	if l := ClassifyIPTablesModeLeftovers(parseSave(t, ipvsModeSave)); l != nil {
		t.Fatalf("IPVS mode's own chains taken for leftovers: %+v", l)
	}
	real, err := os.ReadFile("testdata/iptables-save-ipvs-mode.txt")
	if err != nil {
		t.Fatal(err)
	}
	if l := ClassifyIPTablesModeLeftovers(parseSave(t, string(real))); l != nil {
		t.Fatalf("the real kube-proxy's IPVS-mode chains taken for leftovers: %+v", l)
	}
	// The real kube-proxy v1.34.4's iptables mode: its KUBE-SVC/SEP and
	// KUBE-NODEPORTS chains; its kubelet/canary/masquerade chains are not
	// counted (IPVS mode has them too).
	legacy, err := os.ReadFile("testdata/iptables-save-legacy.txt")
	if err != nil {
		t.Fatal(err)
	}
	l := ClassifyIPTablesModeLeftovers(parseSave(t, string(legacy)))
	if l == nil || l.Rules == 0 || len(l.Rejects) != 0 || len(l.Hooked) != 0 {
		t.Fatalf("iptables mode's save: %+v", l)
	}
	var svc, sep bool
	for _, c := range l.Chains {
		svc = svc || strings.HasPrefix(c, "nat/KUBE-SVC-")
		sep = sep || strings.HasPrefix(c, "nat/KUBE-SEP-")
		if strings.HasSuffix(c, "/KUBE-MARK-MASQ") || strings.HasSuffix(c, "/KUBE-POSTROUTING") || strings.HasSuffix(c, "/KUBE-FIREWALL") ||
			strings.HasSuffix(c, "/KUBE-PROXY-CANARY") || strings.HasSuffix(c, "/KUBE-FORWARD") || c == "nat/KUBE-SERVICES" {
			t.Errorf("chain %s is IPVS mode's too", c)
		}
	}
	if !svc || !sep {
		t.Errorf("chains %v lack KUBE-SVC-/KUBE-SEP-", l.Chains)
	}
	// REJECT rules hooked from OUTPUT/FORWARD: the #102314 case.
	l = ClassifyIPTablesModeLeftovers(parseSave(t, iptablesModeRejects))
	if l == nil || len(l.Rejects) != 1 || !strings.Contains(l.Rejects[0], "-d 10.96.77.77/32 -p tcp --dport 80 -j REJECT") ||
		strings.Join(l.Hooked, ",") != "filter FORWARD -> KUBE-SERVICES,filter OUTPUT -> KUBE-SERVICES" {
		t.Fatalf("rejects: %+v", l)
	}
	// The same rules with the jumps gone: still leftovers, not hooked.
	unhooked := strings.NewReplacer(
		"-A FORWARD -m conntrack --ctstate NEW -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES\n", "",
		"-A OUTPUT -m conntrack --ctstate NEW -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES\n", "").Replace(iptablesModeRejects)
	l = ClassifyIPTablesModeLeftovers(parseSave(t, unhooked))
	if l == nil || len(l.Rejects) != 1 || len(l.Hooked) != 0 {
		t.Fatalf("unhooked rejects: %+v", l)
	}
	if ClassifyIPTablesModeLeftovers(nil) != nil {
		t.Fatal("nil ruleset")
	}
}

func TestIPTablesModeChain(t *testing.T) {
	for _, c := range []struct {
		table, chain string
		want         bool
	}{
		{"nat", "KUBE-SVC-ABC", true}, {"nat", "KUBE-SEP-ABC", true}, {"nat", "KUBE-EXT-ABC", true}, {"nat", "KUBE-FW-ABC", true},
		{"nat", "KUBE-SVL-ABC", true}, {"nat", "KUBE-XLB-ABC", true}, {"nat", "KUBE-NODEPORTS", true},
		{"filter", "KUBE-SERVICES", true}, {"filter", "KUBE-EXTERNAL-SERVICES", true}, {"filter", "KUBE-NODEPORTS", true},
		// IPVS mode's, the kubelet's, the canaries, unknown
		{"nat", "KUBE-SERVICES", false}, {"nat", "KUBE-NODE-PORT", false}, {"nat", "KUBE-LOAD-BALANCER", false},
		{"nat", "KUBE-MARK-MASQ", false}, {"nat", "KUBE-POSTROUTING", false}, {"filter", "KUBE-NODE-PORT", false},
		{"filter", "KUBE-FORWARD", false}, {"filter", "KUBE-PROXY-FIREWALL", false}, {"filter", "KUBE-SOURCE-RANGES-FIREWALL", false},
		{"filter", "KUBE-IPVS-FILTER", false}, {"filter", "KUBE-IPVS-OUT-FILTER", false}, {"filter", "KUBE-FIREWALL", false},
		{"filter", "KUBE-KUBELET-CANARY", false}, {"mangle", "KUBE-PROXY-CANARY", false}, {"nat", "KUBE-MARK-DROP", false},
		{"nat", "KUBE-SVC-", false}, {"raw", "KUBE-SVC-ABC", false}, {"filter", "KUBE-SOMETHING-NEW", false},
	} {
		if got := IsIPTablesModeChain(c.table, c.chain); got != c.want {
			t.Errorf("%s/%s: %v, want %v", c.table, c.chain, got, c.want)
		}
	}
}

func FuzzClassifyIPTablesModeLeftovers(f *testing.F) {
	// Small seeds only: the fuzzing engine crawls (a few execs a second)
	// from seeds the size of a whole save; the unit tests run those.
	f.Add("*nat\n:PREROUTING ACCEPT [0:0]\n:KUBE-SERVICES - [0:0]\n:KUBE-SVC-X - [0:0]\n-A PREROUTING -j KUBE-SERVICES\n-A KUBE-SERVICES -d 10.96.0.1/32 -p tcp --dport 443 -j KUBE-SVC-X\nCOMMIT\n")
	f.Add("*filter\n:OUTPUT ACCEPT [0:0]\n:KUBE-SERVICES - [0:0]\n-A OUTPUT -j KUBE-SERVICES\n-A KUBE-SERVICES -d 10.0.0.1/32 -j DROP\nCOMMIT\n")
	f.Fuzz(func(t *testing.T, s string) {
		rs, err := ParseString(s)
		if err != nil {
			return
		}
		l := ClassifyIPTablesModeLeftovers(rs)
		if l == nil {
			return
		}
		if l.Rules <= 0 || len(l.Rejects) > l.Rules || (len(l.Hooked) > 0 && len(l.Rejects) == 0) {
			t.Fatalf("inconsistent %+v", l)
		}
		for _, c := range l.Chains {
			table, chain, _ := strings.Cut(c, "/")
			if !IsIPTablesModeChain(table, chain) {
				t.Fatalf("chain %s is not iptables mode's", c)
			}
		}
	})
}
