//go:build linux

package nftables

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	"github.com/remediate-dev/remediate/internal/netnstest"
)

// nsPath is the file of a namespace made by netnstest.New.
func nsPath(ns string) string { return "/var/run/netns/" + ns }

// normalised is the documented difference between the two readers: the
// netlink listing has no nft version (NFTVersion is "") and does not count
// objects it does not model (Skipped is 0); nft 1.0.6's JSON leaves out
// table and chain comments, which netlink has. Everything else must be
// equal.
func normalised(rs *Ruleset) *Ruleset {
	c := *rs
	c.NFTVersion, c.Skipped = "", 0
	c.Tables = nil
	for _, t := range rs.Tables {
		tc := *t
		tc.Comment = ""
		tc.Chains = nil
		for _, ch := range t.Chains {
			cc := *ch
			cc.Comment = ""
			tc.Chains = append(tc.Chains, &cc)
		}
		c.Tables = append(c.Tables, &tc)
	}
	return &c
}

// equivalent lists the namespace both ways and fails on any difference.
func equivalent(t *testing.T, ns string) *Ruleset {
	t.Helper()
	want, err := ParseString(netnstest.Run(t, ns, "", "nft", "-j", "list", "ruleset"))
	if err != nil {
		t.Fatal(err)
	}
	got, _, err := listNetlink(context.Background(), nsPath(ns), time.Now().Add(30*time.Second), 0, "", "")
	if err != nil {
		t.Fatal(err)
	}
	if d := cmp.Diff(normalised(want), normalised(got), cmpopts.IgnoreUnexported(Table{}, Set{})); d != "" {
		t.Errorf("netlink listing differs from nft -j (-nft +netlink):\n%s", d)
	}
	return got
}

// TestNetlinkEqualsJSONKubeProxy: kube-proxy v1.34.4's real table (the
// captured ruleset, both families) read over netlink is the Ruleset nft -j
// gives, and so is its ParseKubeProxy model.
func TestNetlinkEqualsJSONKubeProxy(t *testing.T) {
	netnstest.NeedRoot(t, "loads a table into a network namespace")
	netnstest.NeedCommands(t, "ip", "nft")
	ns := netnstest.New(t)
	text, err := os.ReadFile("testdata/kube-proxy-v1.34.4-ruleset.nft")
	if err != nil {
		t.Fatal(err)
	}
	netnstest.Run(t, ns, string(text), "nft", "-f", "-")
	got := equivalent(t, ns)
	for _, f := range []Family{FamilyIP, FamilyIP6} {
		k, err := ParseKubeProxy(got.Table(f, KubeProxyTableName))
		if err != nil {
			t.Fatal(err)
		}
		want, _ := ParseKubeProxy(loadFixture(t).Table(f, KubeProxyTableName))
		if d := cmp.Diff(want, k); d != "" {
			t.Errorf("%s: kube-proxy model differs from the captured JSON's:\n%s", f, d)
		}
	}
}
