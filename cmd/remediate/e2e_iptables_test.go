package main

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

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
		Severity string         `json:"severity"`
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
	OK []struct {
		Rule   string `json:"rule"`
		Judged string `json:"judged"`
	} `json:"ok"`
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

	// The rest runs in a PID namespace of its own, as a DaemonSet with
	// hostPID sees the node: remediate (--proc-root /proc of that
	// namespace) sees and can signal only the processes started there, never
	// another test's or another user's iptables-restore on this machine.
	// When the script ends, the namespace's init exits and the kernel kills
	// what is left in it (flock, sleep, the restore).
	for _, mode := range []string{"audit", "enforce"} {
		if err := os.WriteFile(filepath.Join(dir, mode+".yaml"), []byte(strings.Replace(e2eIPTablesPolicy, "%MODE%", mode, 1)), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(dir, "restore.rules"), []byte("*filter\n:INPUT ACCEPT [0:0]\nCOMMIT\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	script := `set -u
flock "$LOCK" sleep 300 &
# Wait until flock holds the lock (a non-blocking probe fails).
n=0; while flock -n "$LOCK" true; do n=$((n+1)); [ $n -gt 200 ] && exit 90; sleep 0.05; done
ip netns exec "$NS" iptables-legacy-restore -w < "$DIR/restore.rules" &
R=$!
echo $R > "$DIR/restore.pid"
sleep 1
gone() { s=$(cut -d' ' -f3 /proc/$R/stat 2>/dev/null); [ -z "$s" ] || [ "$s" = Z ]; }
once() {
  ip netns exec "$NS" "$BIN" --once -o json --proc-root /proc --xtables-lock "$LOCK" \
    --policy "$DIR/$1.yaml" --state-dir "$DIR/state-$1" --node-name node1 > "$DIR/$1.json" 2> "$DIR/$1.err"
  echo $? > "$DIR/$1.rc"
}
once audit
if gone; then echo gone; else echo alive; fi > "$DIR/after-audit"
once enforce
n=0; while ! gone && [ $n -lt 100 ]; do n=$((n+1)); sleep 0.05; done
if gone; then echo gone; else echo alive; fi > "$DIR/after-enforce"
`
	run := runInPIDNamespace(t, dir, script, "LOCK="+lock, "NS="+ns)
	read, report := run.read, run.report
	restorePID, _ := strconv.Atoi(read("restore.pid"))

	rep := report("audit")
	if rc := read("audit.rc"); rc != "2" {
		t.Errorf("audit exit %s, want 2 (findings)", rc)
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
	if got := read("after-audit"); got != "alive" {
		t.Errorf("after the audit run the restore is %s, want alive", got)
	}

	rep = report("enforce")
	executed := false
	for _, d := range rep.Decisions {
		if d.Target == hungTarget && d.Outcome == "executed" {
			executed = true
		}
	}
	if !executed {
		t.Errorf("enforce: the kill was not executed: %+v", rep.Decisions)
	}
	if got := read("after-enforce"); got != "gone" {
		t.Errorf("after the enforce run the restore is %s, want gone", got)
	}
}
