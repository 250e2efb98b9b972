package detect

import (
	"context"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/remediate-dev/remediate/internal/finding"
	"github.com/remediate-dev/remediate/internal/iptables"
	"github.com/remediate-dev/remediate/internal/kubeproxy"
	"github.com/remediate-dev/remediate/internal/netnstest"
)

// TestRealKubeProxyModeLeftoversIPVSMode loads rules into a test
// namespace's real kernel (legacy and nft backends) and runs
// KubeProxyModeLeftovers with kube-proxy in IPVS mode against the real save
// commands: kube-proxy's IPVS-mode rules are not leftovers; iptables mode's
// no-endpoints REJECT hooked from OUTPUT (kubernetes/kubernetes#102314) is,
// critical; the real kube-proxy v1.34.4's iptables-mode rule set is, a
// warning (it holds no no-endpoints REJECT).
func TestRealKubeProxyModeLeftoversIPVSMode(t *testing.T) {
	ns := netnstest.New(t)
	netnstest.NeedCommands(t, "iptables-legacy-restore", "iptables-nft-restore", "iptables-legacy-save", "iptables-nft-save")
	t.Setenv("XTABLES_LOCKFILE", t.TempDir()+"/xtables.lock")
	n, _ := modeLeftoversNode(t, kubeproxy.ModeIPVS, "", true)
	n.IPTables = iptables.New(iptables.Config{Prefix: netnstest.Prefix(ns), Timeout: 20 * time.Second})
	d := newDetector(t, "KubeProxyModeLeftovers", n, nil)
	ctx := context.Background()
	check := func(step string, want ...string) []finding.Finding {
		t.Helper()
		fs, err := d.Detect(ctx)
		if _, skip := finding.IsSkip(err); err != nil && !(skip && len(want) == 0) {
			t.Fatalf("%s: %v", step, err)
		}
		got := targets(fs)
		if strings.Join(got, ",") != strings.Join(want, ",") {
			t.Fatalf("%s: targets %v, want %v\n%+v", step, got, want, fs)
		}
		for _, f := range fs {
			t.Logf("%s: %s %s: %s", step, f.Severity, f.Target, f.Message)
		}
		return fs
	}

	// IPVS mode's own rules in both backends: nothing. (Without its
	// ipsets, which a fresh namespace lacks: their rules are dropped.)
	ipvsMode := mutate(t, ipvsModeSave(), func(rs *iptables.Ruleset) {
		for _, tb := range rs.Tables {
			for _, c := range tb.Chains {
				rs.DeleteRules(tb.Name, c.Name, func(r iptables.Rule) bool {
					_, _, ok := r.Match("set", "--match-set")
					return ok
				})
			}
		}
	})
	netnstest.Run(t, ns, ipvsMode, "iptables-legacy-restore", "-w", "5")
	netnstest.Run(t, ns, ipvsMode, "iptables-nft-restore")
	check("IPVS mode's own rules")

	// iptables mode's REJECT beside them in the legacy backend, hooked.
	nat := ipvsMode[strings.Index(ipvsMode, "*nat"):]
	netnstest.Run(t, ns, iptablesModeRejects+nat, "iptables-legacy-restore", "-w", "5")
	fs := check("hooked REJECT", "iptables/IPv4/legacy/iptables-mode-leftovers")
	if fs[0].Severity != finding.Critical || len(fs[0].Evidence["hookedRejects"].([]string)) != 2 {
		t.Fatalf("finding %+v", fs[0])
	}

	// The real kube-proxy's iptables mode in the nft backend, the legacy
	// backend back to IPVS mode's rules.
	legacy, err := os.ReadFile("testdata/iptables-save-legacy.txt")
	if err != nil {
		t.Fatal(err)
	}
	iptMode := mutate(t, string(legacy), func(rs *iptables.Ruleset) {
		// nfacct needs an accounting object a fresh namespace lacks
		rs.DeleteRules("filter", "KUBE-FORWARD", func(r iptables.Rule) bool {
			_, _, ok := r.Match("nfacct", "--nfacct-name")
			return ok
		})
	})
	netnstest.Run(t, ns, ipvsMode, "iptables-legacy-restore", "-w", "5")
	netnstest.Run(t, ns, iptMode, "iptables-nft-restore")
	fs = check("iptables mode's rules in nft", "iptables/IPv4/nft/iptables-mode-leftovers")
	if fs[0].Severity != finding.Warning {
		t.Fatalf("finding %+v", fs[0])
	}
}
