package main

import (
	"encoding/json"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/remediate-dev/remediate/internal/testing/setpriv"
)

const unprivilegedPolicy = `apiVersion: remediate.dev/v1alpha1
kind: RemediationPolicy
mode: enforce
rules:
- name: conntrack
  detector: {type: ConntrackExhaustion}
- name: iptables
  detector: {type: IPTablesRules, proxyMode: iptables}
- name: hung-restore
  detector: {type: HungIPTablesRestore}
- name: test-hung
  detector: {type: CLITestHung, findings: 0}
- name: leftovers
  detector: {type: KubeProxyModeLeftovers, proxyMode: iptables}
- name: leftovers-nft
  detector: {type: KubeProxyModeLeftovers, proxyMode: nftables}
`

// TestUnprivilegedDryRunOnReadOnlyStateDir runs the real binary as uid
// 65534 (no capabilities) with --once --dry-run on a state dir it cannot
// write: the checks needing CAP_NET_ADMIN or CAP_SYS_PTRACE are skipped
// with that reason (not findings about remediate), the report warns that
// limits are not shared, and nothing is written.
func TestUnprivilegedDryRunOnReadOnlyStateDir(t *testing.T) {
	// A directory uid 65534 can traverse, holding a copy of this test
	// binary (it acts as main, see TestMain) and the policy.
	dir, bin := setpriv.NobodyCopy(t, "remediate")
	pol := filepath.Join(dir, "policy.yaml")
	if err := os.WriteFile(pol, []byte(unprivilegedPolicy), 0o644); err != nil {
		t.Fatal(err)
	}
	state := filepath.Join(dir, "state") // root's, 0755: not writable by 65534
	if err := os.Mkdir(state, 0o755); err != nil {
		t.Fatal(err)
	}

	cmd := mainCmd(bin, "--once", "--sample", "0", "--dry-run", "-o", "json", "--policy", pol, "--state-dir", state, "--node-name", "n1")
	cmd.SysProcAttr = setpriv.NobodyAttr()
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	code := 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatal(err)
	}
	if code != exitOK {
		t.Fatalf("exit %d, want 0\n%s\n%s", code, out, stderr.String())
	}
	var rep struct {
		Findings []struct{ Detector, Message string }
		Skipped  []struct{ Rule, Reason string }
		Warnings []string
	}
	if err := json.Unmarshal(out, &rep); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	if len(rep.Findings) != 0 {
		t.Errorf("findings as an unprivileged user: %+v", rep.Findings)
	}
	want := map[string]string{
		"conntrack": "needs root / CAP_NET_ADMIN",
		"iptables":  "needs root / CAP_NET_ADMIN",
		// nft list table as uid 65534 was "Operation not permitted": a
		// failed rule and exit 1 instead of a skip.
		"leftovers":     "needs root / CAP_NET_ADMIN",
		"leftovers-nft": "needs root / CAP_NET_ADMIN",
	}
	for _, s := range rep.Skipped {
		if w, ok := want[s.Rule]; ok && strings.HasPrefix(s.Reason, w) {
			delete(want, s.Rule)
		}
	}
	if len(want) > 0 {
		t.Errorf("not skipped with the privilege named: %v\n%s", want, out)
	}
	if len(rep.Warnings) != 1 || !strings.Contains(rep.Warnings[0], "not writable") || !strings.Contains(rep.Warnings[0], "not shared") {
		t.Errorf("warnings: %q", rep.Warnings)
	}
	if strings.Count(stderr.String(), "missing privileges") != 1 {
		t.Errorf("the missing privileges are not said exactly once:\n%s", stderr.String())
	}
	if ents, _ := os.ReadDir(state); len(ents) != 0 {
		t.Errorf("the dry run wrote into the state dir: %v", ents)
	}

	// Without --dry-run the same state dir is an error at start.
	cmd = mainCmd(bin, "--once", "--sample", "0", "--policy", pol, "--state-dir", state, "--node-name", "n1")
	cmd.SysProcAttr = setpriv.NobodyAttr()
	msg, err := cmd.CombinedOutput()
	wantErr := "Error: --state-dir " + state + ": not writable: permission denied (remediate --once --dry-run can run without writing it)"
	if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != exitError || !strings.Contains(string(msg), wantErr) {
		t.Errorf("unwritable state dir without --dry-run: %v\n%s\nwant %q", err, msg, wantErr)
	}
}

func copyFile(t *testing.T, src, dst string, mode os.FileMode) {
	t.Helper()
	in, err := os.Open(src)
	if err != nil {
		t.Fatal(err)
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, mode)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.Copy(out, in); err != nil {
		t.Fatal(err)
	}
	if err := out.Close(); err != nil {
		t.Fatal(err)
	}
}
