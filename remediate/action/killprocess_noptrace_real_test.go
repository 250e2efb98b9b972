//go:build linux

package action

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"
	"k8s.io/utils/clock"

	"github.com/remediate-dev/remediate/detect"
	"github.com/remediate-dev/remediate/internal/finding"
	"github.com/remediate-dev/remediate/internal/netnstest"
	"github.com/remediate-dev/remediate/internal/node"
	"github.com/remediate-dev/remediate/internal/procs"
	"github.com/remediate-dev/remediate/internal/testing/setpriv"
	"github.com/remediate-dev/remediate/policy"
)

// TestRealStuckRestoreWithoutPtrace (issue 41) runs the real detectors and
// KillProcess with exactly the chart's default capabilities (setpriv:
// NET_ADMIN, NET_RAW, KILL; no SYS_PTRACE) against real processes: a
// real iptables-legacy-restore in a network namespace the test makes,
// waiting for a temporary xtables lock (XTABLES_LOCKFILE) that flock holds,
// and a busy process calling itself iptables-restore. HungIPTablesRestore
// reports the stuck restore (critical, waiting on the lock, its holder
// named from /proc/locks, identity host-cgroup: none of it from exe or
// fds, which the kernel refuses here) and never the busy one;
// XtablesLockContention names flock as the holder (holdersFrom
// proc-locks); KillProcess kills the restore through its pidfd and
// refuses the holder (flock is no allowlisted name). On main the process
// checks were skipped ("needs CAP_SYS_PTRACE") and nothing was found.
func TestRealStuckRestoreWithoutPtrace(t *testing.T) {
	if setpriv.Child() {
		stuckRestoreChild(t)
		return
	}
	setpriv.Available(t)
	restore, err := exec.LookPath("iptables-legacy-restore")
	if err != nil {
		t.Skip("needs iptables-legacy-restore")
	}
	ns := netnstest.New(t)
	lock := filepath.Join(t.TempDir(), "xtables.lock")
	holder := exec.Command("flock", lock, "sleep", "300")
	netnstest.StartGroup(t, holder)
	pr := procs.New("/proc")
	ctx := context.Background()
	waitUntil(t, "the lock held", func() bool {
		fl, err := pr.FileLocks(ctx, lock)
		return err == nil && fl.Held
	})
	stuck := exec.Command("ip", "netns", "exec", ns, restore, "-w", "300")
	stuck.Stdin = strings.NewReader("*filter\nCOMMIT\n")
	stuck.Env = append(os.Environ(), "XTABLES_LOCKFILE="+lock)
	netnstest.StartGroup(t, stuck)
	busy := exec.Command("bash", "-c", "exec -a iptables-restore bash -c 'while :; do :; done'")
	netnstest.StartGroup(t, busy)
	waitUntil(t, "the restore waiting", func() bool {
		fl, err := pr.FileLocks(ctx, lock)
		return err == nil && len(fl.Waiters) == 1 && fl.Waiters[0].Pid == int32(stuck.Process.Pid)
	})
	waitUntil(t, "the busy process renamed", func() bool {
		p, err := pr.Get(ctx, int32(busy.Process.Pid))
		return err == nil && p.Name() == "iptables-restore"
	})
	time.Sleep(1200 * time.Millisecond) // minAge 1s
	out := setpriv.Run(t, setpriv.DefaultCaps, "T_LOCK="+lock, fmt.Sprintf("T_STUCK=%d", stuck.Process.Pid),
		fmt.Sprintf("T_BUSY=%d", busy.Process.Pid), fmt.Sprintf("T_HOLDER=%d", holder.Process.Pid))
	for _, l := range strings.Split(out, "\n") {
		if strings.Contains(l, "noptrace_real_test.go") {
			t.Log(strings.TrimSpace(l))
		}
	}
	if alive, err := procs.Alive(ctx, pr, int32(stuck.Process.Pid), mustCreate(t, pr, stuck.Process.Pid)); err == nil && alive {
		t.Error("the stuck restore survived the kill")
	}
}

func mustCreate(t *testing.T, pr *procs.Real, pid int) int64 {
	p, err := pr.Get(context.Background(), int32(pid))
	if err != nil {
		return 1 // gone: no create time to compare
	}
	return p.CreateTimeMs
}

func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(15 * time.Second); !cond(); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
	}
}

func envPID(t *testing.T, name string) int32 {
	t.Helper()
	n, err := strconv.Atoi(os.Getenv(name))
	if err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	return int32(n)
}

// stuckRestoreChild is the part run under setpriv.
func stuckRestoreChild(t *testing.T) {
	ctx := context.Background()
	pr := procs.New("/proc")
	stuck, busy, holder := envPID(t, "T_STUCK"), envPID(t, "T_BUSY"), envPID(t, "T_HOLDER")
	if p, err := pr.Get(ctx, stuck); err != nil || p.Exe != "" {
		t.Fatalf("the restore's executable is readable (%q, %v): not running without CAP_SYS_PTRACE", p.Exe, err)
	}
	n := &node.Node{Name: "n1", ProcRoot: "/proc", XtablesLock: os.Getenv("T_LOCK"), Clock: clock.RealClock{}, Log: zap.NewNop(), Procs: pr,
		Unavailable: map[string]string{}}
	newDet := func(name string, set func(any)) detect.Detector {
		ty, _ := detect.Lookup(name)
		p := ty.NewParams()
		set(p)
		d, err := ty.New(p, n)
		if err != nil {
			t.Fatal(err)
		}
		return d
	}
	hung := newDet("HungIPTablesRestore", func(p any) { p.(*detect.HungIPTablesRestoreParams).MinAge = policy.D(time.Second) })
	fs, err := hung.Detect(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var restoreF *finding.Finding
	for i, f := range fs {
		switch f.Evidence["pid"] {
		case busy:
			t.Errorf("the busy process was judged hung: %s", f.Message)
		case stuck:
			restoreF = &fs[i]
		}
	}
	if restoreF == nil {
		t.Fatalf("the stuck restore not found: %+v (judged %q)", fs, hung.(detect.Judged).Judged())
	}
	f := *restoreF
	if f.Severity != finding.Critical || f.Evidence["waitsOnXtablesLock"] != true || f.Evidence["identity"] != "host-cgroup" ||
		!strings.Contains(f.Message, fmt.Sprintf("held by flock (pid %d)", holder)) || f.Evidence["notATarget"] != nil {
		t.Fatalf("stuck restore finding: %s %s %v", f.Severity, f.Message, f.Evidence)
	}
	t.Logf("HungIPTablesRestore: %s", f.Message)
	if j := hung.(detect.Judged).Judged(); !strings.Contains(j, fmt.Sprintf("pid %d:", busy)) {
		t.Errorf("the busy process is not said to make progress: %q", j)
	}

	lockDet := newDet("XtablesLockContention", func(p any) {
		p.(*detect.XtablesLockContentionParams).MaxRestoreWait = policy.D(time.Second)
	})
	lfs, err := lockDet.Detect(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var holderF *finding.Finding
	for i, lf := range lfs {
		if lf.Evidence["pid"] == holder {
			holderF = &lfs[i]
		}
	}
	if holderF == nil || holderF.Evidence["holdersFrom"] != procs.HoldersFromProcLocks || holderF.Evidence["name"] != "flock" || holderF.Evidence["identity"] != "host-cgroup" {
		t.Fatalf("the holder not named from /proc/locks: %+v", lfs)
	}
	t.Logf("XtablesLockContention: %s", holderF.Message)

	ty, _ := Lookup("KillProcess")
	kp := ty.NewParams().(*KillProcessParams)
	kp.GracePeriod, kp.KillWait, kp.MinHoldTime = policy.D(2*time.Second), policy.D(2*time.Second), policy.D(0)
	kill, err := ty.New(kp, n)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := kill.Plan(ctx, *holderF); err == nil || !strings.Contains(err.Error(), "not in the allowlist") {
		t.Errorf("the holder (flock) planned: %v", err)
	}
	res, err := kill.Execute(ctx, f)
	if err != nil {
		t.Fatalf("killing the stuck restore without CAP_SYS_PTRACE: %v", err)
	}
	t.Logf("KillProcess: %s", res.Summary)
}
