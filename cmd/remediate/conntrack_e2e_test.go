package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/remediate-dev/remediate/internal/conntrack"
	"github.com/remediate-dev/remediate/internal/sysctl"
)

const conntrackPolicy = `apiVersion: remediate.dev/v1alpha1
kind: RemediationPolicy
mode: enforce
rules:
- name: conntrack-exhaustion
  detector: {type: ConntrackExhaustion}
  for: 2m
  action: {type: RaiseConntrackMax, factor: 2, ceiling: 1048576}
  cooldown: 30m
  rateLimit: {max: 2, per: 24h}
  maxAttempts: 2
  verifyAfter: 1m
`

// `remediate --once -o json` end to end with the real conntrack adapter:
// the count comes from the kernel over ctnetlink (read only), the tunables
// from a temporary --proc-root/--sys-root, and the state dir holds the
// value remediate set before "kube-proxy restarted": the drift is reported,
// dry-run says what it would restore, enforce restores it.
func TestOnceConntrackDriftEndToEnd(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: queries the kernel conntrack statistics over netlink")
	}
	if err := conntrack.Available("/proc"); err != nil {
		t.Skipf("needs nf_conntrack: %v", err)
	}
	dir := t.TempDir()
	procRoot, sysRoot, state := filepath.Join(dir, "proc"), filepath.Join(dir, "sys"), filepath.Join(dir, "state")
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(sysctl.WriteFixture(procRoot, conntrack.MaxKey, "131072"))
	must(os.WriteFile(filepath.Join(procRoot, "meminfo"), []byte("MemTotal:       16384000 kB\nMemFree:        8000000 kB\nMemAvailable:   9000000 kB\n"), 0o644))
	hp := filepath.Join(sysRoot, conntrack.HashSizePath)
	must(os.MkdirAll(filepath.Dir(hp), 0o755))
	must(os.WriteFile(hp, []byte("32768\n"), 0o644))
	must(os.MkdirAll(state, 0o755))
	must(os.WriteFile(filepath.Join(state, conntrack.RecordFile), []byte(`{"max":262144,"hashSize":65536,"setAt":"2026-11-20T10:00:00Z"}`), 0o644))
	pol := filepath.Join(dir, "policy.yaml")
	must(os.WriteFile(pol, []byte(conntrackPolicy), 0o644))

	args := []string{"--once", "--sample", "0", "-o", "json", "--policy", pol, "--state-dir", state, "--proc-root", procRoot, "--sys-root", sysRoot, "--node-name", "n1"}
	type report struct {
		Findings []struct {
			Rule, Target string
			Evidence     map[string]any
		}
		Decisions []struct{ Rule, Action, Target, Outcome, Reason string }
	}
	parse := func(out string) report {
		t.Helper()
		var r report
		if err := json.Unmarshal([]byte(out), &r); err != nil {
			t.Fatalf("%v\n%s", err, out)
		}
		return r
	}

	code, out, errOut := run(t, append(args, "--dry-run")...)
	r := parse(out)
	if code != exitFindings || len(r.Findings) != 1 || r.Findings[0].Target != "conntrack/max-drift" || r.Findings[0].Evidence["lastSetMax"] != 262144.0 {
		t.Fatalf("dry-run: exit %d\n%s\n%s", code, out, errOut)
	}
	if len(r.Decisions) != 1 || r.Decisions[0].Outcome != "dry-run" || !strings.Contains(r.Decisions[0].Reason, "would raise nf_conntrack_max from 131072 to 262144") || strings.Contains(r.Decisions[0].Reason, "would would") {
		t.Fatalf("dry-run decision: %s", out)
	}
	if v, _ := sysctl.ReadUintFile(filepath.Join(procRoot, "sys/net/netfilter/nf_conntrack_max")); v != 131072 {
		t.Fatalf("dry-run changed nf_conntrack_max to %d", v)
	}

	code, out, errOut = run(t, args...)
	r = parse(out)
	if code != exitFindings || len(r.Decisions) != 1 || r.Decisions[0].Outcome != "executed" {
		t.Fatalf("enforce: exit %d\n%s\n%s", code, out, errOut)
	}
	if v, _ := sysctl.ReadUintFile(filepath.Join(procRoot, "sys/net/netfilter/nf_conntrack_max")); v != 262144 {
		t.Fatalf("enforce: nf_conntrack_max = %d, want 262144 restored", v)
	}
	if v, _ := sysctl.ReadUintFile(hp); v != 65536 {
		t.Fatalf("enforce: hashsize = %d, want 65536", v)
	}
	// Healthy again: no finding.
	code, out, _ = run(t, append(args, "--dry-run")...)
	if r = parse(out); code != exitOK || len(r.Findings) != 0 {
		t.Fatalf("after restore: exit %d\n%s", code, out)
	}
}
