package detect

import (
	"context"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/remediate-dev/remediate/internal/finding"
	"github.com/remediate-dev/remediate/internal/iptables"
	"github.com/remediate-dev/remediate/internal/netnstest"
)

// TestRealIPTablesRulesBothBackends loads real rule sets into both backends
// of a test namespace and runs the detector against the real save commands.
func TestRealIPTablesRulesBothBackends(t *testing.T) {
	ns := netnstest.New(t)
	netnstest.NeedCommands(t, "iptables-legacy-restore", "iptables-nft-restore", "iptables-legacy-save", "iptables-nft-save")
	t.Setenv("XTABLES_LOCKFILE", t.TempDir()+"/xtables.lock")
	healthy := mutate(t, healthyRules(t), func(rs *iptables.Ruleset) {
		// The nfacct match needs an accounting object kube-proxy creates over
		// netlink; a fresh namespace has none.
		rs.DeleteRules("filter", "KUBE-FORWARD", func(r iptables.Rule) bool {
			_, _, ok := r.Match("nfacct", "--nfacct-name")
			return ok
		})
	})
	noPrerouting := mutate(t, healthy, func(rs *iptables.Ruleset) {
		rs.DeleteRules("nat", "PREROUTING", func(r iptables.Rule) bool { return r.Target == "KUBE-SERVICES" })
	})
	bareDrop := mutate(t, healthy, func(rs *iptables.Ruleset) {
		fw := rs.Table("filter").Chain("KUBE-FIREWALL")
		fw.Rules = []iptables.Rule{{Args: []string{"-j", "DROP"}, Target: "DROP"}}
	})
	nftKube := "*nat\n:PREROUTING ACCEPT [0:0]\n:OUTPUT ACCEPT [0:0]\n:KUBE-SERVICES - [0:0]\n:KUBE-MARK-MASQ - [0:0]\n-A PREROUTING -j KUBE-SERVICES\n-A OUTPUT -j KUBE-SERVICES\n-A KUBE-MARK-MASQ -j MARK --set-xmark 0x4000/0x4000\nCOMMIT\n"

	n, clk := newIssue3Node(nil)
	n.IPTables = iptables.New(iptables.Config{Prefix: netnstest.Prefix(ns), Timeout: 20 * time.Second})
	d := newIssue3Detector(t, "IPTablesRules", n, nil) // defaults: IPv4+IPv6, legacy+nft
	ctx := context.Background()
	check := func(step string, want ...string) {
		t.Helper()
		clk.Step(time.Minute) // past the saves' duty cycle
		got, err := d.Detect(ctx)
		if err != nil {
			t.Fatalf("%s: %v", step, err)
		}
		if !reflect.DeepEqual(findingTargets(got), want) {
			t.Fatalf("%s: targets = %v, want %v\n%+v", step, findingTargets(got), want, got)
		}
		for _, f := range got {
			t.Logf("%s: %s: %s", step, f.Target, f.Message)
		}
	}

	netnstest.Run(t, ns, healthy, "iptables-legacy-restore", "-w", "5")
	check("captured healthy kube-proxy rules")

	netnstest.Run(t, ns, noPrerouting, "iptables-legacy-restore", "-w", "5")
	check("PREROUTING jump removed", "iptables/IPv4/legacy/nat/PREROUTING/KUBE-SERVICES")

	netnstest.Run(t, ns, bareDrop, "iptables-legacy-restore", "-w", "5")
	check("bare DROP in KUBE-FIREWALL", "iptables/IPv4/legacy/filter/KUBE-FIREWALL/bare-drop")

	netnstest.Run(t, ns, healthy, "iptables-legacy-restore", "-w", "5")
	netnstest.Run(t, ns, nftKube, "iptables-nft-restore")
	check("kube rules in legacy and nft", "iptables/IPv4/backend-mix")

	// Only nft left (legacy flushed): healthy again.
	netnstest.Run(t, ns, "*nat\n:PREROUTING ACCEPT [0:0]\n:OUTPUT ACCEPT [0:0]\nCOMMIT\n*filter\n:INPUT ACCEPT [0:0]\nCOMMIT\n", "iptables-legacy-restore", "-w", "5")
	check("nft only")

	// IPv6 is saved with the ip6tables commands.
	netnstest.NeedCommands(t, "ip6tables-legacy-restore")
	netnstest.Run(t, ns, "*nat\n:PREROUTING ACCEPT [0:0]\n:OUTPUT ACCEPT [0:0]\n:KUBE-SERVICES - [0:0]\n-A PREROUTING -j KUBE-SERVICES\nCOMMIT\n", "ip6tables-legacy-restore", "-w", "5")
	check("IPv6 OUTPUT jump missing", "iptables/IPv6/legacy/nat/OUTPUT/KUBE-SERVICES")
}

// TestRealIPTablesRulesKubeProxyChains loads the captured kube-proxy rules,
// corrupted as the field guides describe, into each backend of a test
// namespace with the real iptables-legacy-restore and iptables-nft-restore,
// and finds each corruption through the real save commands: the kernel's
// round trip keeps the defect (or the test would prove nothing).
func TestRealIPTablesRulesKubeProxyChains(t *testing.T) {
	ns := netnstest.New(t)
	netnstest.NeedCommands(t, "iptables-legacy-restore", "iptables-nft-restore", "iptables-legacy-save", "iptables-nft-save",
		"ip6tables-nft-restore", "ip6tables-nft-save", "ip6tables-legacy-save")
	t.Setenv("XTABLES_LOCKFILE", t.TempDir()+"/xtables.lock")
	healthy := mutate(t, healthyRules(t), func(rs *iptables.Ruleset) {
		rs.DeleteRules("filter", "KUBE-FORWARD", func(r iptables.Rule) bool {
			_, _, ok := r.Match("nfacct", "--nfacct-name") // needs a netlink accounting object
			return ok
		})
	})
	replace := func(old, new string) string {
		t.Helper()
		if !strings.Contains(healthy, old+"\n") {
			t.Fatalf("no line %q", old)
		}
		return strings.Replace(healthy, old+"\n", new, 1)
	}
	empty := "*nat\n:PREROUTING ACCEPT [0:0]\nCOMMIT\n*filter\n:INPUT ACCEPT [0:0]\nCOMMIT\n*mangle\n:PREROUTING ACCEPT [0:0]\nCOMMIT\n"

	n, clk := newIssue3Node(nil)
	n.IPTables = iptables.New(iptables.Config{Prefix: netnstest.Prefix(ns), Timeout: 20 * time.Second})
	d := newIssue3Detector(t, "IPTablesRules", n, nil) // defaults: IPv4+IPv6, legacy+nft, iptables mode
	check := func(step string, want ...string) []finding.Finding {
		t.Helper()
		clk.Step(time.Minute) // past the saves' duty cycle
		got, err := d.Detect(context.Background())
		if err != nil {
			t.Fatalf("%s: %v", step, err)
		}
		if !reflect.DeepEqual(findingTargets(got), want) {
			t.Fatalf("%s: targets = %v, want %v\n%+v", step, findingTargets(got), want, got)
		}
		for _, f := range got {
			t.Logf("%s: %s: %s", step, f.Target, f.Message)
		}
		return got
	}
	load := func(be iptables.Backend, text string) {
		t.Helper()
		other := iptables.NFT
		if be == iptables.NFT {
			other = iptables.Legacy
		}
		netnstest.Run(t, ns, empty, "iptables-"+string(other)+"-restore")
		netnstest.Run(t, ns, text, "iptables-"+string(be)+"-restore")
	}

	for _, be := range []iptables.Backend{iptables.Legacy, iptables.NFT} {
		p := "iptables/IPv4/" + string(be) + "/"
		load(be, healthy)
		check(string(be) + ": captured healthy rules")

		load(be, replace(`-A POSTROUTING -m comment --comment "kubernetes postrouting rules" -j KUBE-POSTROUTING`, ""))
		check(string(be)+": POSTROUTING jump deleted", p+"nat/POSTROUTING/KUBE-POSTROUTING")

		load(be, replace(`-A KUBE-POSTROUTING -m mark ! --mark 0x4000/0x4000 -j RETURN`, "-A KUBE-POSTROUTING -j RETURN\n"))
		got := check(string(be)+": RETURN without its mark match", p+"nat/KUBE-POSTROUTING/return")
		if got[0].Severity != finding.Critical || got[0].Evidence["backend"] != string(be) {
			t.Errorf("%+v", got[0])
		}

		load(be, replace(`-A KUBE-POSTROUTING -m comment --comment "kubernetes service traffic requiring SNAT" -j MASQUERADE --random-fully`, ""))
		check(string(be)+": MASQUERADE deleted", p+"nat/KUBE-POSTROUTING/masquerade")

		load(be, replace(`-A KUBE-MARK-MASQ -j MARK --set-xmark 0x4000/0x4000`, "-A KUBE-MARK-MASQ -j MARK --set-mark 0x4000\n"))
		check(string(be)+": mark rule overwrites the mark", p+"nat/KUBE-MARK-MASQ/mark")

		load(be, replace(`-A KUBE-SERVICES -d 10.96.91.18/32 -p tcp -m comment --comment "default/web:http cluster IP" -m tcp --dport 80 -j KUBE-SVC-CDGGSHYLG3RE2FKL`,
			`-A KUBE-SERVICES -p tcp -m comment --comment "default/web:http cluster IP" -j KUBE-SVC-CDGGSHYLG3RE2FKL`+"\n"))
		check(string(be)+": ClusterIP rule without -d and --dport", p+"nat/KUBE-SERVICES/lost-match")

		load(be, replace(`-A KUBE-SVC-CDGGSHYLG3RE2FKL -m comment --comment "default/web:http -> 10.244.0.5:8080" -m statistic --mode random --probability 0.50000000000 -j KUBE-SEP-7U6MWNJWR3SADOJA`,
			`-A KUBE-SVC-CDGGSHYLG3RE2FKL -m comment --comment "default/web:http -> 10.244.0.5:8080" -j KUBE-SEP-7U6MWNJWR3SADOJA`+"\n"))
		check(string(be)+": load-balancing rule without its statistic match", p+"nat/KUBE-SVC-*/shadowed")
	}
	load(iptables.Legacy, empty)
	netnstest.Run(t, ns, empty, "iptables-nft-restore")

	// IPv6, nft: a small kube-proxy set whose RETURN lost its match.
	v6 := "*nat\n:PREROUTING ACCEPT [0:0]\n:OUTPUT ACCEPT [0:0]\n:POSTROUTING ACCEPT [0:0]\n:KUBE-SERVICES - [0:0]\n:KUBE-POSTROUTING - [0:0]\n:KUBE-MARK-MASQ - [0:0]\n:KUBE-SVC-A - [0:0]\n:KUBE-SEP-A - [0:0]\n" +
		"-A PREROUTING -j KUBE-SERVICES\n-A OUTPUT -j KUBE-SERVICES\n-A POSTROUTING -j KUBE-POSTROUTING\n" +
		"-A KUBE-MARK-MASQ -j MARK --or-mark 0x4000\n" +
		"-A KUBE-POSTROUTING -j RETURN\n-A KUBE-POSTROUTING -j MARK --xor-mark 0x4000\n-A KUBE-POSTROUTING -j MASQUERADE\n" +
		"-A KUBE-SERVICES -d fd00::1/128 -p tcp -m tcp --dport 443 -j KUBE-SVC-A\n-A KUBE-SVC-A -j KUBE-SEP-A\n" +
		"-A KUBE-SEP-A -s fd00:10::5/128 -j KUBE-MARK-MASQ\n-A KUBE-SEP-A -p tcp -m tcp -j DNAT --to-destination [fd00:10::5]:6443\nCOMMIT\n"
	netnstest.Run(t, ns, v6, "ip6tables-nft-restore")
	check("IPv6 nft: RETURN without its mark match", "iptables/IPv6/nft/nat/KUBE-POSTROUTING/return")
}
