//go:build linux

package nftables

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	clocktesting "k8s.io/utils/clock/testing"

	"github.com/remediate-dev/remediate/internal/netnstest"
)

// TestRealAdapter runs the real nft in a test-made network namespace
// loaded with kube-proxy's real ruleset (the captured text form): the
// listing parses to the same kube-proxy view as the captured JSON, a
// missing table is ErrNoTable, output over the limit is ErrTooLarge, a hung
// nft is cut at the timeout, and answers are shared within the cache TTL.
func TestRealAdapter(t *testing.T) {
	netnstest.NeedRoot(t, "runs nft in a network namespace")
	netnstest.NeedCommands(t, "ip", "nft")
	ns := netnstest.New(t)
	text, err := os.ReadFile("testdata/kube-proxy-v1.34.4-ruleset.nft")
	if err != nil {
		t.Fatal(err)
	}
	netnstest.Run(t, ns, string(text), "nft", "-f", "-")
	ctx := context.Background()

	r := New(Config{Prefix: netnstest.Prefix(ns), CacheTTL: -1})
	s, err := r.ListRuleset(ctx)
	if err != nil {
		t.Fatal(err)
	}
	want := loadFixture(t)
	for _, f := range []Family{FamilyIP, FamilyIP6} {
		got, err := ParseKubeProxy(s.Ruleset.Table(f, KubeProxyTableName))
		if err != nil {
			t.Fatal(err)
		}
		exp, _ := ParseKubeProxy(want.Table(f, KubeProxyTableName))
		if !reflect.DeepEqual(got.Programmed(), exp.Programmed()) || !reflect.DeepEqual(got.NoEndpointServices, exp.NoEndpointServices) {
			t.Errorf("%s: real listing differs from the capture:\n%+v\n%+v", f, got.Programmed(), exp.Programmed())
		}
	}
	if s.Bytes == 0 || s.Duration <= 0 || s.Seq != 1 {
		t.Errorf("snapshot %+v", s)
	}

	ts, err := r.ListTable(ctx, FamilyIP, KubeProxyTableName)
	if err != nil || len(ts.Ruleset.Tables) != 1 {
		t.Fatalf("ListTable: %+v %v", ts, err)
	}
	if _, err := r.ListTable(ctx, FamilyInet, "nope"); !errors.Is(err, ErrNoTable) {
		t.Errorf("missing table: %v, want ErrNoTable", err)
	}

	small := New(Config{Prefix: netnstest.Prefix(ns), MaxBytes: 1000, CacheTTL: -1})
	if _, err := small.ListRuleset(ctx); !errors.Is(err, ErrTooLarge) {
		t.Errorf("over MaxBytes: %v, want ErrTooLarge", err)
	}

	// A hung nft (a script that sleeps) is cut at the timeout.
	dir := t.TempDir()
	hung := filepath.Join(dir, "nft")
	if err := os.WriteFile(hung, []byte("#!/bin/sh\nexec sleep 30\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	_, err = New(Config{Reader: ReaderNFT, Binary: hung, Timeout: 300 * time.Millisecond, CacheTTL: -1}).ListRuleset(ctx)
	if !errors.Is(err, ErrTimeout) || time.Since(start) > 5*time.Second {
		t.Errorf("hung nft: %v after %v", err, time.Since(start))
	}
	// Within a caller's deadline, the listing's own bound ends first (at
	// three quarters of what the deadline left), so the caller learns that
	// the listing is too long, not merely that its own time ran out.
	dctx, cancel := context.WithTimeout(ctx, time.Second)
	start = time.Now()
	_, err = New(Config{Reader: ReaderNFT, Binary: hung, Timeout: 20 * time.Second, CacheTTL: -1}).ListRuleset(dctx)
	if !errors.Is(err, ErrTimeout) || dctx.Err() != nil || time.Since(start) > 900*time.Millisecond {
		t.Errorf("hung nft within a 1 s deadline: %v after %v (caller's context: %v)", err, time.Since(start), dctx.Err())
	}
	cancel()
	// Garbage output is a parse error carrying the command.
	junk := filepath.Join(dir, "junk")
	if err := os.WriteFile(junk, []byte("#!/bin/sh\necho 'not json'\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	if _, err := New(Config{Reader: ReaderNFT, Binary: junk, CacheTTL: -1}).ListRuleset(ctx); err == nil || !strings.Contains(err.Error(), "nft -j list ruleset") {
		t.Errorf("junk output: %v", err)
	}
	// A failing nft carries its stderr.
	fail := filepath.Join(dir, "fail")
	if err := os.WriteFile(fail, []byte("#!/bin/sh\necho 'Error: Operation not permitted' >&2\nexit 1\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	if _, err := New(Config{Reader: ReaderNFT, Binary: fail, CacheTTL: -1}).ListRuleset(ctx); err == nil || !strings.Contains(err.Error(), "Operation not permitted") {
		t.Errorf("failing nft: %v", err)
	}
	// A runaway listing far over the limit stops at the limit, not at the
	// timeout.
	big := filepath.Join(dir, "big")
	if err := os.WriteFile(big, []byte("#!/bin/sh\nprintf '{\"nftables\": ['; exec cat /dev/zero\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	start = time.Now()
	if _, err := New(Config{Reader: ReaderNFT, Binary: big, MaxBytes: 1 << 20, Timeout: 20 * time.Second, CacheTTL: -1}).ListRuleset(ctx); !errors.Is(err, ErrTooLarge) || time.Since(start) > 5*time.Second {
		t.Errorf("runaway output: %v after %v", err, time.Since(start))
	}
	if _, err := New(Config{Reader: ReaderNFT, Binary: filepath.Join(dir, "absent")}).ListRuleset(ctx); !errors.Is(err, ErrUnavailable) {
		t.Errorf("absent nft: %v, want ErrUnavailable", err)
	}

	// Cache: one run within the TTL, a new one after it.
	clk := clocktesting.NewFakePassiveClock(time.Now())
	c := New(Config{Prefix: netnstest.Prefix(ns), CacheTTL: 2 * time.Second, Clock: clk, MaxDutyCycle: -1}) // a loaded machine's slow nft must not stretch the TTL
	a, _ := c.ListRuleset(ctx)
	b, _ := c.ListRuleset(ctx)
	clk.SetTime(clk.Now().Add(3 * time.Second))
	d, _ := c.ListRuleset(ctx)
	if a == nil || a != b || d == nil || d.Seq != 2 {
		t.Errorf("cache: %v %v %v", a, b, d)
	}

	// Duty cycle: a listing that took 300 ms is reused for at least
	// 300ms/0.1 = 3 s, past the 2 s cache TTL.
	slow := filepath.Join(dir, "slow")
	if err := os.WriteFile(slow, []byte("#!/bin/sh\nsleep 0.3\necho '{\"nftables\": []}'\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	sc := New(Config{Reader: ReaderNFT, Binary: slow, CacheTTL: 2 * time.Second, MaxDutyCycle: 0.1, Clock: clk, ReuseFor: -1})
	first, err := sc.ListRuleset(ctx)
	if err != nil {
		t.Fatal(err)
	}
	clk.SetTime(clk.Now().Add(2500 * time.Millisecond))
	if again, _ := sc.ListRuleset(ctx); again != first {
		t.Error("a slow listing was repeated within its duty cycle")
	}
	clk.SetTime(clk.Now().Add(20 * time.Second))
	if later, _ := sc.ListRuleset(ctx); later == first || later.Seq != 2 {
		t.Error("the listing was not repeated after its duty cycle")
	}
}
