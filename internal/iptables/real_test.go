package iptables

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/remediate-dev/remediate/internal/netnstest"
)

func TestRealSaveBothBackendsInNamespace(t *testing.T) {
	ns := netnstest.New(t)
	netnstest.NeedCommands(t, "iptables-legacy-restore", "iptables-nft-restore", "iptables-legacy-save", "iptables-nft-save")
	healthy := restorable(t)
	// A private lock file: legacy restore takes the lock, never the host's.
	lock := t.TempDir() + "/xtables.lock"
	t.Setenv("XTABLES_LOCKFILE", lock)
	netnstest.Run(t, ns, healthy.String(), "iptables-legacy-restore", "-w", "5")

	r := New(Config{Prefix: netnstest.Prefix(ns), Timeout: 20 * time.Second})
	ctx := context.Background()
	leg, err := r.Save(ctx, IPv4, Legacy)
	if err != nil {
		t.Fatal(err)
	}
	if !equalRulesets(healthy, leg.Rules) {
		t.Fatalf("legacy save differs from what was restored:\n%s", leg.Rules.String())
	}
	if leg.Duration <= 0 || leg.Bytes == 0 {
		t.Errorf("duration %v bytes %d", leg.Duration, leg.Bytes)
	}
	nft, err := r.Save(ctx, IPv4, NFT)
	if err != nil {
		t.Fatal(err)
	}
	if n := nft.Rules.KubeRuleCount(); n != 0 {
		t.Errorf("nft has %d kube rules in a fresh namespace", n)
	}
	netnstest.Run(t, ns, "*nat\n:PREROUTING ACCEPT [0:0]\n:KUBE-SERVICES - [0:0]\n-A PREROUTING -j KUBE-SERVICES\nCOMMIT\n", "iptables-nft-restore")
	nft, err = r.Save(ctx, IPv4, NFT)
	if err != nil {
		t.Fatal(err)
	}
	if !nft.Rules.Table("nat").Chain("PREROUTING").JumpsTo("KUBE-SERVICES") {
		t.Errorf("nft save: %s", nft.Rules.String())
	}
	// iptables-nft-save notices the legacy tables.
	t.Logf("nft warnings: %q", nft.Rules.Warnings)
	if _, err := os.Stat(lock); err != nil {
		t.Logf("lock file %s: %v", lock, err)
	}
	if _, err := r.Save(ctx, IPv6, Legacy); err != nil && !errors.Is(err, ErrUnavailable) {
		t.Errorf("ip6 legacy save: %v", err)
	}

	// Observation never takes the xtables lock: with the (private) lock
	// held, every save and the version probe still return at once.
	netnstest.NeedCommands(t, "flock")
	netnstest.StartGroup(t, exec.Command("flock", lock, "sleep", "60"))
	time.Sleep(300 * time.Millisecond)
	if out, err := exec.Command("flock", "-n", lock, "true").CombinedOutput(); err == nil {
		t.Fatalf("lock not held by the test's flock: %s", out)
	}
	quick := New(Config{Prefix: netnstest.Prefix(ns), Timeout: 3 * time.Second})
	for _, b := range []Backend{Legacy, NFT} {
		if _, err := quick.Save(ctx, IPv4, b); err != nil {
			t.Errorf("%s save with the xtables lock held: %v", b, err)
		}
	}
	if _, err := quick.DefaultBackend(ctx); err != nil {
		t.Errorf("iptables --version with the xtables lock held: %v", err)
	}
}

// restorable returns the captured kube-proxy rule set without its nfacct
// rule: the nfacct match needs the named accounting object, which kube-proxy
// creates over netlink and a fresh namespace does not have.
func restorable(t testing.TB) *Ruleset {
	rs, _ := loadFixture(t)
	if n := rs.DeleteRules("filter", "KUBE-FORWARD", func(r Rule) bool {
		_, _, ok := r.Match("nfacct", "--nfacct-name")
		return ok
	}); n != 1 {
		t.Fatalf("removed %d nfacct rules, want 1", n)
	}
	return rs
}

func TestRealSaveTimeoutAndMissingCommand(t *testing.T) {
	r := New(Config{Prefix: []string{"sh", "-c", "sleep 5", "--"}, Timeout: 200 * time.Millisecond})
	start := time.Now()
	_, err := r.Save(context.Background(), IPv4, Legacy)
	if err == nil || !strings.Contains(err.Error(), "timed out") {
		if _, lerr := os.Stat("/usr/sbin/iptables-legacy-save"); lerr == nil {
			t.Fatalf("want a timeout, got %v", err)
		}
	}
	if time.Since(start) > 3*time.Second {
		t.Errorf("save not bounded by its timeout: %v", time.Since(start))
	}
	r = New(Config{})
	t.Setenv("PATH", t.TempDir())
	if _, err := r.Save(context.Background(), IPv4, NFT); !errors.Is(err, ErrUnavailable) {
		t.Errorf("missing command: %v", err)
	}
}

func TestRealDefaultBackend(t *testing.T) {
	netnstest.NeedCommands(t, "iptables")
	b, err := New(Config{}).DefaultBackend(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if b != Legacy && b != NFT {
		t.Fatalf("backend = %q", b)
	}
	t.Logf("iptables on this machine uses %s", b)
}
