package action_test

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap/zaptest"
	"k8s.io/utils/clock"

	"github.com/remediate-dev/remediate/internal/netnstest"
	"github.com/remediate-dev/remediate/internal/node"
	"github.com/remediate-dev/remediate/internal/procs"
	"github.com/remediate-dev/remediate/policy"
	"github.com/remediate-dev/remediate/remediate"
	"github.com/remediate-dev/remediate/remediate/journal"
)

const enginePolicy = `apiVersion: remediate.dev/v1alpha1
kind: RemediationPolicy
mode: MODE
rules:
- name: kill-hung-iptables-restore
  detector: {type: HungIPTablesRestore, minAge: 300ms}
  action: {type: KillProcess, gracePeriod: 2s, killWait: 2s}
  maxAttempts: 2
  verifyAfter: 10s
- name: xtables-lock-contention
  detector: {type: XtablesLockContention, maxWaiters: 1}
`

// TestRealEngineAuditAndEnforce drives a real hung iptables-legacy-restore
// through the policy loader and the engine (one-shot cycles): audit mode
// reports "dry-run" and leaves it alive, enforce mode kills it.
func TestRealEngineAuditAndEnforce(t *testing.T) {
	ns := netnstest.New(t)
	netnstest.NeedCommands(t, "flock", "iptables-legacy-restore")
	ctx := context.Background()
	dir := t.TempDir()
	lock := filepath.Join(dir, "xtables.lock")
	holder := exec.Command("flock", lock, "sleep", "300")
	netnstest.StartGroup(t, holder)
	pr := procs.New("/proc")
	waitLocks(t, pr, lock, func(fl procs.FileLocks) bool { return len(fl.Holders) == 2 })
	restore := netnstest.Cmd(ns, "*filter\n:INPUT ACCEPT [0:0]\nCOMMIT\n", "iptables-legacy-restore", "-w")
	restore.Env = append(os.Environ(), "XTABLES_LOCKFILE="+lock)
	netnstest.StartGroup(t, restore)
	restorePID := int32(restore.Process.Pid)
	// The engine acts on every finding: scope what it sees to the processes
	// this test started, so it never kills another test's (or anyone's)
	// iptables-restore on this machine.
	mine := map[int32]bool{int32(holder.Process.Pid): true, restorePID: true}
	n := &node.Node{Name: "test", ProcRoot: "/proc", XtablesLock: lock, Clock: clock.RealClock{}, Log: zaptest.NewLogger(t),
		Procs: scopedProcs{Interface: pr, mine: func(p procs.Process) bool { return mine[p.Pid] || mine[p.PPid] }}}
	waitLocks(t, pr, lock, func(fl procs.FileLocks) bool { return len(fl.Waiters) == 1 })
	time.Sleep(400 * time.Millisecond) // older than the policy's minAge

	run := func(mode string) *remediate.Report {
		t.Helper()
		// A cycle of its own: the process scan another test's cycle
		// shared less than a second ago does not show this test's restore.
		procs.ExpireCommScans()
		rep, _ := onceCycle(t, n, strings.Replace(enginePolicy, "MODE", mode, 1), filepath.Join(dir, "state-"+mode))
		return rep
	}
	decision := func(rep *remediate.Report) remediate.Decision {
		for _, d := range rep.Decisions {
			if d.Rule == "kill-hung-iptables-restore" {
				return d
			}
		}
		t.Fatalf("no decision for the restore: %+v", rep.Decisions)
		return remediate.Decision{}
	}
	hasFinding := func(rep *remediate.Report, rule string) bool {
		for _, f := range rep.Findings {
			if f.Rule == rule {
				return true
			}
		}
		return false
	}

	rep := run("audit")
	if d := decision(rep); d.Outcome != remediate.OutcomeDryRun || !strings.Contains(d.Reason, "SIGTERM") {
		t.Errorf("audit decision = %+v", d)
	}
	if !hasFinding(rep, "xtables-lock-contention") {
		t.Error("no lock contention finding")
	}
	time.Sleep(200 * time.Millisecond)
	if p, err := pr.Get(ctx, restorePID); err != nil || p.Name() != "iptables-legacy-restore" {
		t.Fatalf("audit mode: restore gone (%v)", err)
	}

	rep = run("enforce")
	if d := decision(rep); d.Outcome != remediate.OutcomeExecuted {
		t.Errorf("enforce decision = %+v", d)
	}
	if _, err := pr.Get(ctx, restorePID); err == nil {
		t.Error("enforce mode: restore still running")
	}
}

// onceCycle loads the policy src, runs one engine cycle as --once does on n
// with its state and journal in state, logs the findings and decisions, and
// returns the report and the journal.
func onceCycle(t *testing.T, n *node.Node, src, state string) (*remediate.Report, []journal.Record) {
	t.Helper()
	ctx := context.Background()
	pf := filepath.Join(t.TempDir(), "policy.yaml")
	if err := os.WriteFile(pf, []byte(src), 0o600); err != nil {
		t.Fatal(err)
	}
	pol, err := policy.Load(pf, remediate.Catalog{})
	if err != nil {
		t.Fatal(err)
	}
	j, err := journal.Open(state, 1<<20, 2)
	if err != nil {
		t.Fatal(err)
	}
	e, err := remediate.New(pol, remediate.Options{Node: n, StateDir: state, Once: true, Journal: j, Log: zaptest.NewLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close(ctx)
	rep, err := e.Cycle(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range rep.Findings {
		t.Logf("finding %s %s: %s", f.Rule, f.Target, f.Message)
	}
	for _, d := range rep.Decisions {
		t.Logf("decision %s %s %s: %s", d.Rule, d.Target, d.Outcome, d.Reason)
	}
	recs, err := journal.ReadAll(state)
	if err != nil {
		t.Fatal(err)
	}
	return rep, recs
}

func waitLocks(t *testing.T, pr procs.Interface, lock string, cond func(procs.FileLocks) bool) {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for {
		fl, err := pr.FileLocks(context.Background(), lock)
		if err == nil && cond(fl) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting on the locks of %s: %+v %v", lock, fl, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// scopedProcs limits Find to the test's own processes. Everything else
// (lock holders of the test's private lock file, signals with identity
// checks) goes to the real adapter.
type scopedProcs struct {
	procs.Interface
	mine func(procs.Process) bool
}

func (s scopedProcs) Find(ctx context.Context, names []string) ([]procs.Process, error) {
	all, err := s.Interface.Find(ctx, names)
	var out []procs.Process
	for _, p := range all {
		if s.mine(p) {
			out = append(out, p)
		}
	}
	return out, err
}
