//go:build linux

package nftables

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	clocktesting "k8s.io/utils/clock/testing"

	"github.com/remediate-dev/remediate/internal/netnstest"
)

// TestListingKeptWhileGenerationUnchanged runs the real nft in a
// test-made network namespace: a table listing (and a missing table's
// answer) is returned again without running nft while the namespace's
// nf_tables generation does not move, and nft runs again as soon as
// anything is committed (a rule added, a table created or deleted, an
// element added), or ReuseFor after the listing. The steady cycle of an
// iptables-mode node listed both of kube-proxy's (absent) nftables tables
// with two nft runs every cycle (~37 ms of CPU at 500 Services).
func TestListingKeptWhileGenerationUnchanged(t *testing.T) {
	netnstest.NeedRoot(t, "runs nft in a network namespace")
	netnstest.NeedCommands(t, "ip", "nft")
	ns := netnstest.New(t)
	nsFile := "/var/run/netns/" + ns
	// nft through a wrapper that counts its runs.
	dir := t.TempDir()
	count := filepath.Join(dir, "runs")
	wrapper := filepath.Join(dir, "nft")
	nft, _ := exec.LookPath("nft")
	if err := os.WriteFile(wrapper, []byte("#!/bin/sh\necho x >> "+count+"\nexec "+nft+" \"$@\"\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	runs := func() int {
		b, _ := os.ReadFile(count)
		return strings.Count(string(b), "x")
	}
	ctx := context.Background()
	clk := clocktesting.NewFakePassiveClock(time.Now())
	r := New(Config{Prefix: netnstest.Prefix(ns), NetNS: nsFile, Binary: wrapper, CacheTTL: -1, Clock: clk, Reader: ReaderNFT})

	// A missing table: one run, then kept.
	for i := 0; i < 3; i++ {
		if _, err := r.ListTable(ctx, FamilyIP, KubeProxyTableName); !errors.Is(err, ErrNoTable) {
			t.Fatalf("missing table: %v", err)
		}
	}
	if n := runs(); n != 1 {
		t.Fatalf("missing table listed 3 times: %d nft runs, want 1", n)
	}
	// Created: the generation moved, nft runs and sees it.
	netnstest.Run(t, ns, "", "nft", "add table ip kube-proxy; add chain ip kube-proxy services; add rule ip kube-proxy services counter")
	a, err := r.ListTable(ctx, FamilyIP, KubeProxyTableName)
	if err != nil || len(a.Ruleset.Tables) != 1 || len(a.Ruleset.Tables[0].Chains) != 1 || len(a.Ruleset.Tables[0].Chains[0].Rules) != 1 {
		t.Fatalf("created table: %+v %v", a, err)
	}
	b, err := r.ListTable(ctx, FamilyIP, KubeProxyTableName)
	if err != nil || b != a || runs() != 2 {
		t.Fatalf("unchanged table listed again: same snapshot %v, %d runs (want 2), %v", b == a, runs(), err)
	}
	// The ruleset is its own listing, kept the same way.
	rs1, err := r.ListRuleset(ctx)
	if err != nil {
		t.Fatal(err)
	}
	rs2, _ := r.ListRuleset(ctx)
	if rs2 != rs1 || runs() != 3 {
		t.Fatalf("unchanged ruleset listed again: %d runs, want 3", runs())
	}
	// A rule added: listed again, with the rule.
	netnstest.Run(t, ns, "", "nft", "add rule ip kube-proxy services drop")
	c, err := r.ListTable(ctx, FamilyIP, KubeProxyTableName)
	if err != nil || c == a || len(c.Ruleset.Tables[0].Chains[0].Rules) != 2 {
		t.Fatalf("after a rule was added: %+v %v", c, err)
	}
	rs3, _ := r.ListRuleset(ctx)
	if rs3 == rs1 || runs() != 5 {
		t.Fatalf("after a rule was added: ruleset reused %v, %d runs (want 5)", rs3 == rs1, runs())
	}
	// A set element added (a commit too).
	netnstest.Run(t, ns, "", "nft", "add set ip kube-proxy s { type ipv4_addr; }")
	_, _ = r.ListTable(ctx, FamilyIP, KubeProxyTableName)
	netnstest.Run(t, ns, "", "nft", "add element ip kube-proxy s { 10.0.0.1 }")
	e, err := r.ListTable(ctx, FamilyIP, KubeProxyTableName)
	if err != nil || len(e.Ruleset.Tables[0].Sets) != 1 || len(e.Ruleset.Tables[0].Sets[0].Elements) != 1 || runs() != 7 {
		t.Fatalf("after an element was added: %+v %v, %d runs (want 7)", e, err, runs())
	}
	// ReuseFor: listed again after it, changed or not.
	clk.SetTime(clk.Now().Add(DefaultReuseFor + time.Second))
	if _, err := r.ListTable(ctx, FamilyIP, KubeProxyTableName); err != nil || runs() != 8 {
		t.Fatalf("after ReuseFor: %v, %d runs (want 8)", err, runs())
	}
	// Deleted: missing again.
	netnstest.Run(t, ns, "", "nft", "delete table ip kube-proxy")
	if _, err := r.ListTable(ctx, FamilyIP, KubeProxyTableName); !errors.Is(err, ErrNoTable) || runs() != 9 {
		t.Fatalf("deleted table: %v, %d runs (want 9)", err, runs())
	}
	// Without NetNS behind a prefix the namespace is unknown: every
	// listing runs nft.
	u := New(Config{Prefix: netnstest.Prefix(ns), Binary: wrapper, CacheTTL: -1, Clock: clk})
	_, _ = u.ListTable(ctx, FamilyIP, KubeProxyTableName)
	_, _ = u.ListTable(ctx, FamilyIP, KubeProxyTableName)
	if runs() != 11 {
		t.Fatalf("no NetNS: %d runs, want 11", runs())
	}
}
