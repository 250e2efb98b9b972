package detect

import (
	"context"
	"reflect"
	"testing"
	"time"

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
