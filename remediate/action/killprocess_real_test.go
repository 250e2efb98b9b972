package action

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

	"github.com/remediate-dev/remediate/detect"
	"github.com/remediate-dev/remediate/internal/finding"
	"github.com/remediate-dev/remediate/internal/netnstest"
	"github.com/remediate-dev/remediate/internal/node"
	"github.com/remediate-dev/remediate/internal/procs"
	"github.com/remediate-dev/remediate/policy"
)

func eventually(t *testing.T, what string, d time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", d, what)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func detector(t *testing.T, typ string, n *node.Node, set func(any)) detect.Detector {
	t.Helper()
	ty, _ := detect.Lookup(typ)
	p := ty.NewParams()
	set(p)
	d, err := ty.New(p, n)
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// TestRealHungRestoreOnHeldXtablesLock runs a real iptables-legacy-restore
// -w in a test namespace, blocked on a private xtables lock file held by
// flock(1) + sleep; the detectors report the hung restore and the real
// holders; KillProcess's plan (dry run) leaves the restore alive and
// Execute kills it, re-checked by the detector.
func TestRealHungRestoreOnHeldXtablesLock(t *testing.T) {
	ns := netnstest.New(t)
	netnstest.NeedCommands(t, "flock", "iptables-legacy-restore")
	ctx := context.Background()
	lock := filepath.Join(t.TempDir(), "xtables.lock")

	holder := exec.Command("flock", lock, "sleep", "300")
	netnstest.StartGroup(t, holder)
	pr := procs.New("/proc")
	eventually(t, "flock to hold the lock", 10*time.Second, func() bool {
		fl, err := pr.FileLocks(ctx, lock)
		return err == nil && len(fl.Holders) == 2
	})

	restore := netnstest.Cmd(ns, "*filter\n:INPUT ACCEPT [0:0]\n-A INPUT -j ACCEPT\nCOMMIT\n", "iptables-legacy-restore", "-w")
	restore.Env = append(os.Environ(), "XTABLES_LOCKFILE="+lock)
	netnstest.StartGroup(t, restore)
	restorePID := int32(restore.Process.Pid) // ip netns exec execs in place

	n := &node.Node{Name: "test", ProcRoot: "/proc", XtablesLock: lock, Clock: clock.RealClock{}, Log: zaptest.NewLogger(t), Procs: pr}
	hung := detector(t, "HungIPTablesRestore", n, func(p any) {
		p.(*detect.HungIPTablesRestoreParams).MinAge = policy.D(500 * time.Millisecond)
	})
	var hf finding.Finding
	eventually(t, "the hung restore to be reported", 15*time.Second, func() bool {
		fs, err := hung.Detect(ctx)
		if err != nil {
			t.Fatal(err)
		}
		for _, f := range fs {
			if f.Evidence["pid"] == restorePID && f.Evidence["waitsOnXtablesLock"] == true {
				hf = f
				return true
			}
		}
		return false
	})
	t.Logf("finding: %s %s %v", hf.Target, hf.Message, hf.Evidence)
	if hf.Severity != finding.Critical || hf.Evidence["name"] != "iptables-legacy-restore" || !strings.Contains(hf.Message, "held by flock") {
		t.Errorf("finding = %+v", hf)
	}
	// In the test's namespace, not the node's, but waiting on the node's
	// lock: a target, its namespace in the evidence.
	if ns := hf.Evidence["netns"]; ns == "" || ns == hf.Evidence["nodeNetns"] || hf.Evidence["notATarget"] != nil {
		t.Errorf("netns evidence = %v (node %v), notATarget %v", ns, hf.Evidence["nodeNetns"], hf.Evidence["notATarget"])
	}
	// comm is the truncated multi-call name; argv[0] matched.
	if p, _ := pr.Get(ctx, restorePID); p.Comm != "iptables-legacy" {
		t.Logf("comm = %q", p.Comm)
	}

	contention := detector(t, "XtablesLockContention", n, func(p any) {
		p.(*detect.XtablesLockContentionParams).MaxWaiters = 1
	})
	cf, err := contention.Detect(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(cf) != 2 || cf[0].Evidence["name"] != "flock" || cf[1].Evidence["name"] != "sleep" || cf[0].Evidence["pid"] != int32(holder.Process.Pid) {
		t.Fatalf("contention findings = %+v", cf)
	}
	ws := cf[0].Evidence["waiters"].([]map[string]any)
	if len(ws) != 1 || ws[0]["pid"] != restorePID {
		t.Errorf("waiters = %v", ws)
	}
	// What the engine's order and KillProcess read, typed: the waiter and
	// the holder with its measured hold (the Subject the detectors fill).
	if sp := hf.Subject.Process; sp == nil || !sp.WaitsOnXtablesLock || sp.HoldsXtablesLock || hf.Subject.AgeSeconds <= 0 {
		t.Errorf("hung restore subject = %+v (process %+v)", hf.Subject, sp)
	}
	if sp := cf[0].Subject.Process; sp == nil || !sp.HoldsXtablesLock || !sp.HoldMeasured || sp.HoldSeconds != cf[0].Evidence["holdSeconds"] {
		t.Errorf("lock holder subject = %+v (process %+v), evidence %v", cf[0].Subject, sp, cf[0].Evidence)
	}

	ty, _ := Lookup("KillProcess")
	kp := ty.NewParams().(*KillProcessParams)
	kp.GracePeriod = policy.D(2 * time.Second)
	kill, err := ty.New(kp, n)
	if err != nil {
		t.Fatal(err)
	}
	// Dry run: the plan only.
	plan, err := kill.Plan(ctx, hf)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("plan: %s", plan.Summary)
	time.Sleep(300 * time.Millisecond)
	if alive, _ := procs.Alive(ctx, pr, restorePID, int64(hf.Evidence["createTimeMs"].(int64))); !alive {
		t.Fatal("the dry run killed the restore")
	}
	// The lock holders are not in the default allowlist (restores only).
	if _, err := kill.Plan(ctx, cf[1]); err == nil {
		t.Error("plan accepted killing sleep with the default allowlist")
	}

	// Enforce.
	res, err := kill.Execute(ctx, hf)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("result: %s %v", res.Summary, res.Details)
	if sigs := res.Details["signals"].([]string); len(sigs) != 1 || sigs[0] != "SIGTERM" {
		t.Errorf("signals = %v", sigs)
	}
	fs, err := hung.Detect(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range fs {
		if f.Target == hf.Target {
			t.Fatalf("restore still reported after the kill: %+v", f)
		}
	}
	// The lock holder is untouched.
	if fl, err := pr.FileLocks(ctx, lock); err != nil || len(fl.Holders) != 2 || len(fl.Waiters) != 0 {
		t.Errorf("after the kill: %+v %v", fl, err)
	}
}

// TestRealKillLockHolder points KillProcess at the real holders of the lock
// (flock and its child sleep, allowed here by a configured program list).
// Killing the flock wrapper leaves its child holding the lock: the kill is
// a failure although the process is gone (it escalates instead of reading
// as "executed"). Killing the child releases the lock and the waiter gets it:
// a success, although the lock is held again (by the waiter, which was not a
// holder before the kill).
func TestRealKillLockHolder(t *testing.T) {
	netnstest.NeedCommands(t, "flock")
	ctx := context.Background()
	lock := filepath.Join(t.TempDir(), "xtables.lock")
	netnstest.StartGroup(t, exec.Command("flock", lock, "sleep", "300"))
	pr := procs.New("/proc")
	eventually(t, "flock to hold the lock", 10*time.Second, func() bool {
		fl, err := pr.FileLocks(ctx, lock)
		return err == nil && len(fl.Holders) == 2
	})
	// The waiter holds the lock a while once it has it: the kill that
	// releases the lock must not count the waiter's hold against itself.
	waiter := exec.Command("flock", lock, "sleep", "2")
	netnstest.StartGroup(t, waiter)

	n := &node.Node{Name: "test", ProcRoot: "/proc", XtablesLock: lock, Clock: clock.RealClock{}, Log: zaptest.NewLogger(t), Procs: pr}
	contention := detector(t, "XtablesLockContention", n, func(p any) {
		p.(*detect.XtablesLockContentionParams).MaxHold = policy.D(300 * time.Millisecond)
	})
	ty, _ := Lookup("KillProcess")
	kp := ty.NewParams().(*KillProcessParams)
	kp.Names = []string{"flock", "sleep"}
	kp.MinHoldTime = policy.D(300 * time.Millisecond)
	kill, err := ty.New(kp, n)
	if err != nil {
		t.Fatal(err)
	}
	if fs, _ := contention.Detect(ctx); len(fs) != 0 {
		t.Fatalf("first cycle already flagged: %+v", fs)
	}
	time.Sleep(400 * time.Millisecond)
	fs, err := contention.Detect(ctx)
	if err != nil || len(fs) != 2 || fs[0].Evidence["name"] != "flock" || fs[1].Evidence["name"] != "sleep" {
		t.Fatalf("findings = %+v %v", fs, err)
	}
	// flock and sleep are not iptables programs: info, and the default
	// KillProcess refuses them.
	for _, f := range fs {
		if f.Severity != finding.Info || !strings.Contains(f.Message, "not an iptables/nft program") {
			t.Errorf("finding %s: %s %s", f.Target, f.Severity, f.Message)
		}
		if _, err := kill.Plan(ctx, f); err == nil || !strings.Contains(err.Error(), "is not an iptables/nft program") {
			t.Errorf("plan for %s = %v, want a refusal", f.Target, err)
		}
	}
	kp.Programs = []string{"flock", "sleep"}
	if kill, err = ty.New(kp, n); err != nil {
		t.Fatal(err)
	}
	// The wrapper: gone, but its child still holds the lock.
	_, err = kill.Execute(ctx, fs[0])
	if _, skip := finding.IsSkip(err); err == nil || skip || !strings.Contains(err.Error(), "is still held by sleep") {
		t.Fatalf("killing the flock wrapper = %v, want a failure naming sleep", err)
	}
	if fl, err := pr.FileLocks(ctx, lock); err != nil || !fl.Held || len(fl.Waiters) != 1 {
		t.Fatalf("after killing the wrapper: %+v %v", fl, err)
	}
	if _, err := kill.Execute(ctx, fs[1]); err != nil {
		t.Fatalf("kill %s: %v", fs[1].Target, err)
	}
	eventually(t, "the waiter to get the lock and exit", 10*time.Second, func() bool {
		fl, err := pr.FileLocks(ctx, lock)
		return err == nil && !fl.Held && len(fl.Waiters) == 0
	})
	if fs, _ := contention.Detect(ctx); len(fs) != 0 {
		t.Errorf("still flagged: %+v", fs)
	}
}

// TestRealTargetsOutOfReach runs, as an attacker would, a sleep that calls
// itself iptables-restore (exec -a) and a real iptables-legacy-restore in a
// test-made network namespace that neither holds nor waits on the node's
// xtables lock (it waits on its stdin). Both are reported at info level
// with the reason and their namespace, and KillProcess refuses both.
func TestRealTargetsOutOfReach(t *testing.T) {
	ns := netnstest.New(t)
	netnstest.NeedCommands(t, "sleep", "iptables-legacy-restore")
	ctx := context.Background()
	lock := filepath.Join(t.TempDir(), "xtables.lock")
	if err := os.WriteFile(lock, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	sleepPath, err := exec.LookPath("sleep")
	if err != nil {
		t.Fatal(err)
	}
	impostor := &exec.Cmd{Path: sleepPath, Args: []string{"iptables-restore", "300"}}
	netnstest.StartGroup(t, impostor)

	stdinR, stdinW, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { stdinW.Close() })
	other := netnstest.Cmd(ns, "", "iptables-legacy-restore", "-w")
	other.Stdin = stdinR
	other.Env = append(os.Environ(), "XTABLES_LOCKFILE="+lock)
	netnstest.StartGroup(t, other)
	stdinR.Close()

	pr := procs.New("/proc")
	n := &node.Node{Name: "test", ProcRoot: "/proc", XtablesLock: lock, Clock: clock.RealClock{}, Log: zaptest.NewLogger(t), Procs: pr}
	hung := detector(t, "HungIPTablesRestore", n, func(p any) {
		p.(*detect.HungIPTablesRestoreParams).MinAge = policy.D(300 * time.Millisecond)
	})
	want := map[int32]string{
		int32(impostor.Process.Pid): `executable "` + sleepPath + `" is not an iptables/nft program`,
		int32(other.Process.Pid):    "not the node's",
	}
	got := map[int32]finding.Finding{}
	eventually(t, "both to be reported", 15*time.Second, func() bool {
		fs, err := hung.Detect(ctx)
		if err != nil {
			t.Fatal(err)
		}
		for _, f := range fs {
			if pid, _ := f.Evidence["pid"].(int32); want[pid] != "" {
				got[pid] = f
			}
		}
		return len(got) == 2
	})
	kp, _ := Lookup("KillProcess")
	params := kp.NewParams().(*KillProcessParams)
	params.GracePeriod = policy.D(time.Second)
	kill, err := kp.New(params, n)
	if err != nil {
		t.Fatal(err)
	}
	for pid, f := range got {
		t.Logf("finding: %s %s", f.Severity, f.Message)
		if f.Severity != finding.Info || !strings.Contains(f.Message, want[pid]) || f.Evidence["netns"] == "" || f.Evidence["nodeNetns"] == "" {
			t.Errorf("pid %d: %s %q %v", pid, f.Severity, f.Message, f.Evidence)
		}
		_, err := kill.Execute(ctx, f)
		if reason, skip := finding.IsSkip(err); !skip || !strings.Contains(reason, strings.TrimPrefix(want[pid], "executable ")) {
			t.Errorf("pid %d: Execute = %v, want a refusal", pid, err)
		}
		if alive, _ := procs.Alive(ctx, pr, pid, f.Evidence["createTimeMs"].(int64)); !alive {
			t.Errorf("pid %d was killed", pid)
		}
	}
	if got[int32(other.Process.Pid)].Evidence["netns"] == got[int32(other.Process.Pid)].Evidence["nodeNetns"] {
		t.Error("the restore in the test namespace shows the node's namespace")
	}
}
