package main

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/remediate-dev/remediate/internal/iptables"
	"github.com/remediate-dev/remediate/internal/netnstest"
)

const e2eIPTablesPolicy = `apiVersion: remediate.dev/v1alpha1
kind: RemediationPolicy
mode: %MODE%
detectorTimeout: 15s
rules:
- name: kill-hung-iptables-restore
  detector: {type: HungIPTablesRestore, minAge: 300ms}
  action: {type: KillProcess, gracePeriod: 2s, killWait: 2s}
  maxAttempts: 2
- name: xtables-lock-holder
  detector: {type: XtablesLockContention, maxWaiters: 1}
- name: iptables-rules
  detector: {type: IPTablesRules, families: [IPv4], proxyMode: iptables}
`

type e2eReport struct {
	Mode     string `json:"mode"`
	Findings []struct {
		Rule     string         `json:"rule"`
		Detector string         `json:"detector"`
		Target   string         `json:"target"`
		Message  string         `json:"message"`
		Evidence map[string]any `json:"evidence"`
	} `json:"findings"`
	Decisions []struct {
		Rule    string `json:"rule"`
		Action  string `json:"action"`
		Target  string `json:"target"`
		Outcome string `json:"outcome"`
		Reason  string `json:"reason"`
	} `json:"decisions"`
}

// TestOnceEndToEndIPTablesAndXtablesLock runs the binary (this test binary
// as main) with `--once -o json --proc-root /proc --xtables-lock FILE`
// inside a test namespace holding broken kube rules in both backends, with
// a real iptables-legacy-restore blocked on a private xtables lock held by
// flock: audit reports every finding and "dry-run" for the kill and leaves
// the restore alive; enforce kills it.
func TestOnceEndToEndIPTablesAndXtablesLock(t *testing.T) {
	ns := netnstest.New(t)
	netnstest.NeedCommands(t, "flock", "iptables-legacy-restore", "iptables-nft-restore", "iptables-legacy-save", "iptables-nft-save")
	dir := t.TempDir()
	lock := filepath.Join(dir, "xtables.lock")
	t.Setenv("XTABLES_LOCKFILE", lock)

	// Rules: kube-proxy's captured nat table without the PREROUTING jump in
	// legacy, and stale KUBE-* rules in nft.
	b, err := os.ReadFile("../../detect/testdata/iptables-save-legacy.txt")
	if err != nil {
		t.Fatal(err)
	}
	rs, err := iptables.ParseString(string(b))
	if err != nil {
		t.Fatal(err)
	}
	rs.DeleteRules("filter", "KUBE-FORWARD", func(r iptables.Rule) bool { _, _, ok := r.Match("nfacct", "--nfacct-name"); return ok })
	rs.DeleteRules("nat", "PREROUTING", func(r iptables.Rule) bool { return r.Target == "KUBE-SERVICES" })
	netnstest.Run(t, ns, rs.String(), "iptables-legacy-restore", "-w", "5")
	netnstest.Run(t, ns, "*nat\n:PREROUTING ACCEPT [0:0]\n:OUTPUT ACCEPT [0:0]\n:KUBE-SERVICES - [0:0]\n:KUBE-MARK-MASQ - [0:0]\n-A PREROUTING -j KUBE-SERVICES\n-A OUTPUT -j KUBE-SERVICES\n-A KUBE-MARK-MASQ -j MARK --set-xmark 0x4000/0x4000\nCOMMIT\n", "iptables-nft-restore")

	// The lock held by flock + sleep, and a restore waiting on it.
	startGroup(t, exec.Command("flock", lock, "sleep", "300"))
	time.Sleep(300 * time.Millisecond)
	restore := netnstest.Cmd(ns, "*filter\n:INPUT ACCEPT [0:0]\nCOMMIT\n", "iptables-legacy-restore", "-w")
	startGroup(t, restore)
	restorePID := restore.Process.Pid
	time.Sleep(700 * time.Millisecond)

	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	once := func(mode string) (e2eReport, int) {
		t.Helper()
		pol := filepath.Join(dir, mode+".yaml")
		if err := os.WriteFile(pol, []byte(strings.Replace(e2eIPTablesPolicy, "%MODE%", mode, 1)), 0o644); err != nil {
			t.Fatal(err)
		}
		cmd := netnstest.Cmd(ns, "", self, "--once", "-o", "json", "--proc-root", "/proc", "--xtables-lock", lock,
			"--policy", pol, "--state-dir", filepath.Join(dir, "state-"+mode), "--node-name", "node1")
		cmd.Env = append(os.Environ(), "REMEDIATE_TEST_AS_MAIN=1")
		out, err := cmd.Output()
		code := 0
		if ee, ok := err.(*exec.ExitError); ok {
			code = ee.ExitCode()
			t.Logf("stderr: %s", ee.Stderr)
		} else if err != nil {
			t.Fatal(err)
		}
		var rep e2eReport
		if err := json.Unmarshal(out, &rep); err != nil {
			t.Fatalf("%s output is not JSON: %v\n%s", mode, err, out)
		}
		t.Logf("%s (exit %d):\n%s", mode, code, out)
		return rep, code
	}

	rep, code := once("audit")
	if code != 2 {
		t.Errorf("audit exit %d, want 2 (findings)", code)
	}
	want := map[string]bool{
		"iptables/IPv4/legacy/nat/PREROUTING/KUBE-SERVICES": false,
		"iptables/IPv4/backend-mix":                         false,
	}
	var hungTarget string
	holders := 0
	for _, f := range rep.Findings {
		if _, ok := want[f.Target]; ok {
			want[f.Target] = true
		}
		switch f.Detector {
		case "HungIPTablesRestore":
			if int(f.Evidence["pid"].(float64)) == restorePID && f.Evidence["waitsOnXtablesLock"] == true {
				hungTarget = f.Target
			}
		case "XtablesLockContention":
			holders++
		}
	}
	for tgt, seen := range want {
		if !seen {
			t.Errorf("no finding %s", tgt)
		}
	}
	if hungTarget == "" || holders != 2 {
		t.Fatalf("hung restore target %q, %d lock holder findings", hungTarget, holders)
	}
	dryRun := false
	for _, d := range rep.Decisions {
		if d.Target == hungTarget && d.Action == "KillProcess" && d.Outcome == "dry-run" {
			dryRun = true
		}
	}
	if !dryRun {
		t.Errorf("audit: no dry-run decision for %s: %+v", hungTarget, rep.Decisions)
	}
	if err := syscall.Kill(restorePID, 0); err != nil {
		t.Fatalf("audit mode: restore gone: %v", err)
	}

	rep, _ = once("enforce")
	executed := false
	for _, d := range rep.Decisions {
		if d.Target == hungTarget && d.Outcome == "executed" {
			executed = true
		}
	}
	if !executed {
		t.Errorf("enforce: the kill was not executed: %+v", rep.Decisions)
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		b, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(restorePID), "cmdline"))
		if err != nil || !strings.HasPrefix(string(b), "iptables-legacy-restore") {
			break // gone (or reaped and reused)
		}
		if time.Now().After(deadline) {
			t.Fatal("enforce mode: restore still running")
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// startGroup starts cmd in its own process group and kills the group (by
// the PID the test started) when the test ends.
func startGroup(t *testing.T, cmd *exec.Cmd) {
	t.Helper()
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatalf("start %v: %v", cmd.Args, err)
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	t.Cleanup(func() {
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		<-done
	})
}
