package iptables

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
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
	cached := New(Config{Prefix: netnstest.Prefix(ns), NetNS: netnsPath(ns), Timeout: 3 * time.Second})
	for _, b := range []Backend{Legacy, NFT} {
		if _, err := quick.Save(ctx, IPv4, b); err != nil {
			t.Errorf("%s save with the xtables lock held: %v", b, err)
		}
		// The change check (getsockopt, nfnetlink) neither.
		for range 2 {
			if _, err := cached.Save(ctx, IPv4, b); err != nil {
				t.Errorf("%s save with change check, the xtables lock held: %v", b, err)
			}
		}
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

func netnsPath(ns string) string { return "/var/run/netns/" + ns }

// TestRealSaveReusedUntilTheKernelChanges: in a namespace, a second Save of
// unchanged rules runs no command (Reused), also after traffic changed the
// counters; an endpoint replaced by another of the same length (same table
// size and entry count: only the entry bytes differ) is seen at the next
// Save, in both backends; a backend without tables is Empty without a run;
// ReuseFor bounds the reuse.
func TestRealSaveReusedUntilTheKernelChanges(t *testing.T) {
	ns := netnstest.New(t)
	netnstest.NeedCommands(t, "iptables-legacy-restore", "iptables-nft-restore", "iptables-legacy-save", "iptables-nft-save", "ip6tables-legacy-save")
	t.Setenv("XTABLES_LOCKFILE", t.TempDir()+"/xtables.lock")
	ctx := context.Background()
	now := time.Unix(1000, 0)
	r := New(Config{Prefix: netnstest.Prefix(ns), NetNS: netnsPath(ns), Timeout: 20 * time.Second, Now: func() time.Time { return now }})

	for _, b := range []Backend{Legacy, NFT} {
		s, err := r.Save(ctx, IPv4, b)
		if err != nil {
			t.Fatal(err)
		}
		if !s.Empty || s.Reused || len(s.Rules.Tables) != 0 {
			t.Errorf("%s in a fresh namespace: empty %v reused %v %d tables", b, s.Empty, s.Reused, len(s.Rules.Tables))
		}
	}
	if s, err := r.Save(ctx, IPv6, Legacy); err != nil || !s.Empty {
		t.Errorf("ip6 legacy in a fresh namespace: %+v %v", s, err)
	}

	table := func(ep string) string {
		return "*nat\n:PREROUTING ACCEPT [0:0]\n:OUTPUT ACCEPT [0:0]\n:KUBE-SERVICES - [0:0]\n:KUBE-SEP-AAAAAAAAAAAAAAAA - [0:0]\n" +
			"-A PREROUTING -j KUBE-SERVICES\n-A OUTPUT -j KUBE-SERVICES\n" +
			"-A KUBE-SERVICES -d 10.96.0.10/32 -p tcp -m comment --comment \"ns/svc:http cluster IP\" -m tcp --dport 80 -j KUBE-SEP-AAAAAAAAAAAAAAAA\n" +
			"-A KUBE-SEP-AAAAAAAAAAAAAAAA -p tcp -m comment --comment ns/svc:http -m tcp -j DNAT --to-destination " + ep + ":8080\nCOMMIT\n"
	}
	for _, b := range []Backend{Legacy, NFT} {
		restore := "iptables-" + string(b) + "-restore"
		netnstest.Run(t, ns, table("10.244.1.5"), restore)
		first, err := r.Save(ctx, IPv4, b)
		if err != nil {
			t.Fatal(err)
		}
		if first.Reused || first.Empty || first.Rules.Table("nat").Chain("KUBE-SEP-AAAAAAAAAAAAAAAA") == nil {
			t.Fatalf("%s first save: reused %v empty %v\n%s", b, first.Reused, first.Empty, first.Rules.String())
		}
		// Traffic through the rules changes their counters only.
		netnstest.Run(t, ns, "", "bash", "-c", "ip addr replace 10.96.0.10/32 dev lo; timeout 1 bash -c \"exec 3<>/dev/tcp/10.96.0.10/80\" 2>/dev/null; true")
		if c := netnstest.Run(t, ns, "", "iptables-"+string(b)+"-save", "-c", "-t", "nat"); !strings.Contains(c, "-A OUTPUT -j KUBE-SERVICES") || strings.Contains(c, "[0:0] -A OUTPUT -j KUBE-SERVICES") {
			t.Fatalf("%s: the traffic did not count:\n%s", b, c)
		}
		again, err := r.Save(ctx, IPv4, b)
		if err != nil {
			t.Fatal(err)
		}
		if !again.Reused || again.Rules != first.Rules {
			t.Errorf("%s: unchanged rules saved again (reused %v)", b, again.Reused)
		}
		// Same length, same size: only the DNAT destination differs.
		netnstest.Run(t, ns, table("10.244.1.7"), restore)
		changed, err := r.Save(ctx, IPv4, b)
		if err != nil {
			t.Fatal(err)
		}
		v, _, _ := changed.Rules.Table("nat").Chain("KUBE-SEP-AAAAAAAAAAAAAAAA").Rules[0].Match("DNAT", "--to-destination")
		if changed.Reused || !strings.Contains(changed.Rules.String(), "10.244.1.7:8080") {
			t.Errorf("%s: equal-size change not seen (reused %v, dnat %q)\n%s", b, changed.Reused, v, changed.Rules.String())
		}
		if s, _ := r.Save(ctx, IPv4, b); !s.Reused {
			t.Errorf("%s: not reused after the change was saved", b)
		}
		now = now.Add(6 * time.Minute)
		if s, _ := r.Save(ctx, IPv4, b); s.Reused {
			t.Errorf("%s: reused beyond ReuseFor", b)
		}
	}
}

// TestRealSaveEntriesReadOnLockActivity: with the lock file watched, a
// legacy backend's entries are read only when something opened the lock
// file, when the table's size, count or offsets changed, or EntriesMaxAge
// after the last read. An equal-size edit through iptables-legacy-restore
// (which opens the lock file, with or without -w) is seen at the next
// Save; one made by a writer that does not open this lock file is seen
// EntriesMaxAge later (the documented bound), one that changes the size
// at once; a replaced or missing lock file makes every Save read the
// entries.
func TestRealSaveEntriesReadOnLockActivity(t *testing.T) {
	ns := netnstest.New(t)
	netnstest.NeedCommands(t, "iptables-legacy-restore", "iptables-legacy-save")
	dir := t.TempDir()
	lock := filepath.Join(dir, "xtables.lock")
	if err := os.WriteFile(lock, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	t.Setenv("XTABLES_LOCKFILE", lock)
	ctx := context.Background()
	now := time.Unix(1000, 0)
	r := New(Config{Prefix: netnstest.Prefix(ns), NetNS: netnsPath(ns), Timeout: 20 * time.Second,
		LockFile: lock, EntriesMaxAge: time.Minute, Now: func() time.Time { return now }})
	table := func(ep string, extra string) string {
		return "*nat\n:PREROUTING ACCEPT [0:0]\n:OUTPUT ACCEPT [0:0]\n:KUBE-SERVICES - [0:0]\n:KUBE-SEP-AAAAAAAAAAAAAAAA - [0:0]\n" +
			"-A PREROUTING -j KUBE-SERVICES\n-A OUTPUT -j KUBE-SERVICES\n" + extra +
			"-A KUBE-SEP-AAAAAAAAAAAAAAAA -p tcp -m comment --comment ns/svc:http -m tcp -j DNAT --to-destination " + ep + ":8080\nCOMMIT\n"
	}
	reads := func() Reads {
		for _, x := range r.Reads() {
			if x.Family == IPv4 && x.Backend == Legacy {
				return x
			}
		}
		return Reads{}
	}
	save := func(step string, wantReused bool, wantEntries uint64, want string) {
		t.Helper()
		before := reads()
		s, err := r.Save(ctx, IPv4, Legacy)
		if err != nil {
			t.Fatalf("%s: %v", step, err)
		}
		after := reads()
		if s.Reused != wantReused || after.Entries-before.Entries != wantEntries || !strings.Contains(s.Rules.String(), want) {
			t.Errorf("%s: reused %v (want %v), entries read %d (want %d), %q in the rules: %v", step,
				s.Reused, wantReused, after.Entries-before.Entries, wantEntries, want, strings.Contains(s.Rules.String(), want))
		}
	}
	restore := func(text string, env ...string) {
		t.Helper()
		netnstest.Run(t, ns, text, append(append([]string{"env"}, env...), "iptables-legacy-restore")...)
	}

	restore(table("10.244.1.5", ""))
	save("first", false, 1, "10.244.1.5:8080")
	save("nothing touched", true, 0, "10.244.1.5:8080")
	save("nothing touched again", true, 0, "10.244.1.5:8080")

	// Same size (the DNAT destination only), through the lock file.
	restore(table("10.244.1.7", ""))
	save("equal-size edit through the lock", false, 1, "10.244.1.7:8080")
	save("after it", true, 0, "10.244.1.7:8080")

	// Same size, by a writer that does not open this lock file: not seen
	// until EntriesMaxAge has passed since the last entries read.
	restore(table("10.244.1.9", ""), "XTABLES_LOCKFILE="+filepath.Join(dir, "elsewhere.lock"))
	now = now.Add(30 * time.Second)
	save("equal-size edit bypassing the lock, within EntriesMaxAge", true, 0, "10.244.1.7:8080")
	now = now.Add(31 * time.Second)
	save("equal-size edit bypassing the lock, EntriesMaxAge later", false, 1, "10.244.1.9:8080")

	// A size change by the same writer is seen at once.
	restore(table("10.244.1.9", "-A KUBE-SERVICES -j RETURN\n"), "XTABLES_LOCKFILE="+filepath.Join(dir, "elsewhere.lock"))
	save("size change bypassing the lock", false, 1, "-A KUBE-SERVICES -j RETURN")
	save("after it", true, 0, "-A KUBE-SERVICES -j RETURN")

	// A reader of the lock file that is not a writer still counts (the
	// watch cannot tell): the entries are read, the save reused.
	f, err := os.Open(lock)
	if err != nil {
		t.Fatal(err)
	}
	f.Close()
	save("lock file opened and closed", true, 1, "-A KUBE-SERVICES -j RETURN")

	// The lock file replaced: the new one is watched, the entries read.
	if err := os.Remove(lock); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(lock, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	save("lock file replaced", true, 1, "-A KUBE-SERVICES -j RETURN")
	save("after it", true, 0, "-A KUBE-SERVICES -j RETURN")

	// No lock file: nothing can be said; the entries are read every time.
	if err := os.Remove(lock); err != nil {
		t.Fatal(err)
	}
	save("no lock file", true, 1, "-A KUBE-SERVICES -j RETURN")
	save("no lock file again", true, 1, "-A KUBE-SERVICES -j RETURN")
	// The four changes were decoded from the entries read: no save ran.
	if got := reads(); got.Decodes != 4 || got.Saves != 0 {
		t.Errorf("decodes %d, saves run %d, want 4 and 0 (%+v)", got.Decodes, got.Saves, got)
	}
}
