package procs

import (
	"context"
	"errors"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/remediate-dev/remediate/internal/netnstest"
)

// start runs a command and stops it (its process group, by PID) when the
// test ends.
func start(t *testing.T, name string, args ...string) *exec.Cmd {
	t.Helper()
	cmd := exec.Command(name, args...)
	netnstest.StartGroup(t, cmd) // own group: cleanup also stops flock's sleep
	return cmd
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func TestRealFileLocksFindsRealHoldersAndWaiters(t *testing.T) {
	if _, err := exec.LookPath("flock"); err != nil {
		t.Skip("needs flock(1) from util-linux")
	}
	ctx := context.Background()
	lockFile := filepath.Join(t.TempDir(), "xtables.lock")
	r := New("/proc")

	if _, err := r.FileLocks(ctx, lockFile); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("missing lock file: %v, want fs.ErrNotExist", err)
	}
	holder := start(t, "flock", lockFile, "sleep", "300")
	var fl FileLocks
	// The child holds the lock from its fork, before its exec of sleep is
	// complete (until then it shows flock's argv, or mid-exec the comm
	// sleep and an empty argv): wait for the exec too.
	waitFor(t, "the lock to be held with its child", func() bool {
		var err error
		fl, err = r.FileLocks(ctx, lockFile)
		return err == nil && fl.Held && len(fl.Holders) == 2 && fl.Holders[1].Name() == "sleep"
	})
	if len(fl.LockPIDs) != 1 || fl.LockPIDs[0] != int32(holder.Process.Pid) {
		t.Errorf("LockPIDs = %v, want [%d] (the flock caller)", fl.LockPIDs, holder.Process.Pid)
	}
	// flock(1) and its child sleep share the locked open file: both hold.
	if fl.Holders[0].Name() != "flock" || fl.Holders[1].Name() != "sleep" || fl.Holders[1].PPid != fl.Holders[0].Pid {
		t.Errorf("holders = %+v", fl.Holders)
	}
	if fl.Holders[1].ParentName != "flock" {
		t.Errorf("ParentName = %q", fl.Holders[1].ParentName)
	}

	waiter := start(t, "flock", lockFile, "true")
	waitFor(t, "the waiter", func() bool {
		var err error
		fl, err = r.FileLocks(ctx, lockFile)
		return err == nil && len(fl.Waiters) == 1
	})
	if fl.Waiters[0].Pid != int32(waiter.Process.Pid) || fl.Waiters[0].State != "S" {
		t.Errorf("waiters = %+v", fl.Waiters)
	}

	// Find by argv[0] basename, with a create time that is stable.
	found, err := r.Find(ctx, []string{"sleep"})
	if err != nil {
		t.Fatal(err)
	}
	var sleep Process
	for _, p := range found {
		if p.Pid == fl.Holders[1].Pid {
			sleep = p
		}
	}
	if sleep.CreateTimeMs != fl.Holders[1].CreateTimeMs || sleep.CreateTimeMs == 0 {
		t.Fatalf("Find sleep = %+v, holder %+v", sleep, fl.Holders[1])
	}
	if age := sleep.Age(time.Now()); age < -2*time.Second || age > time.Minute { // btime is whole seconds
		t.Errorf("age = %v", age)
	}

	// Identity is re-checked: a wrong create time sends nothing.
	if err := r.Signal(ctx, sleep.Pid, sleep.CreateTimeMs-10, syscall.SIGKILL); !errors.Is(err, ErrNotSame) {
		t.Fatalf("Signal with wrong create time = %v, want ErrNotSame", err)
	}
	if ok, _ := Alive(ctx, r, sleep.Pid, sleep.CreateTimeMs); !ok {
		t.Fatal("sleep died from a refused signal")
	}
	// Killing only the flock caller leaves its child holding the lock.
	flk := fl.Holders[0]
	if err := r.Signal(ctx, flk.Pid, flk.CreateTimeMs, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "flock caller gone", func() bool { ok, _ := Alive(ctx, r, flk.Pid, flk.CreateTimeMs); return !ok })
	fl, err = r.FileLocks(ctx, lockFile)
	if err != nil || !fl.Held || len(fl.Holders) != 1 || fl.Holders[0].Pid != sleep.Pid {
		t.Fatalf("after killing the flock caller: %+v %v", fl, err)
	}
	if err := r.Signal(ctx, sleep.Pid, sleep.CreateTimeMs, syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "lock released and waiter done", func() bool {
		fl, err := r.FileLocks(ctx, lockFile)
		return err == nil && !fl.Held && len(fl.Waiters) == 0
	})
	// The lock is released when the exiting process closes its files,
	// slightly before it is gone.
	waitFor(t, "sleep gone", func() bool { ok, _ := Alive(ctx, r, sleep.Pid, sleep.CreateTimeMs); return !ok })
	if err := r.Signal(ctx, sleep.Pid, sleep.CreateTimeMs, syscall.SIGKILL); !errors.Is(err, ErrNotFound) && !errors.Is(err, ErrNotSame) {
		t.Errorf("signal to a gone process = %v", err)
	}
	if err := r.Signal(ctx, 1, 1, syscall.SIGTERM); err == nil {
		t.Error("signal to pid 1 allowed")
	}
}

// BenchmarkFileLocksHeld measures finding the real holders of a held lock
// on this machine: every descriptor of every process is stat'ed, which is
// what the lock contention detector pays in a cycle where the lock is held.
func BenchmarkFileLocksHeld(b *testing.B) {
	if _, err := exec.LookPath("flock"); err != nil {
		b.Skip("needs flock(1)")
	}
	lockFile := filepath.Join(b.TempDir(), "xtables.lock")
	netnstest.StartGroup(b, exec.Command("flock", lockFile, "sleep", "300"))
	r := New("/proc")
	ctx := context.Background()
	deadline := time.Now().Add(10 * time.Second)
	for {
		fl, err := r.FileLocks(ctx, lockFile)
		if err == nil && len(fl.Holders) == 2 {
			break
		}
		if time.Now().After(deadline) {
			b.Fatal("lock not held")
		}
		time.Sleep(20 * time.Millisecond)
	}
	pids, _ := os.ReadDir("/proc")
	b.Logf("%d entries in /proc", len(pids))
	for b.Loop() {
		if _, err := r.FileLocks(ctx, lockFile); err != nil {
			b.Fatal(err)
		}
	}
}

// TestRealOtherProcRoot reads through a proc root that is not "/proc" (the
// same procfs reached by another path, like a DaemonSet's /host/proc).
func TestRealOtherProcRoot(t *testing.T) {
	root := "/proc/self/root/proc"
	if _, err := os.Stat(root + "/locks"); err != nil {
		t.Skipf("no %s: %v", root, err)
	}
	r := New(root)
	ctx := context.Background()
	self, err := r.Get(ctx, int32(os.Getpid()))
	if err != nil {
		t.Fatal(err)
	}
	viaProc, err := New("/proc").Get(ctx, int32(os.Getpid()))
	if err != nil || viaProc.CreateTimeMs != self.CreateTimeMs || viaProc.Name() != self.Name() {
		t.Fatalf("through %s: %+v; through /proc: %+v %v", root, self, viaProc, err)
	}
	if r.Self() != int32(os.Getpid()) {
		t.Errorf("Self = %d, want %d", r.Self(), os.Getpid())
	}
	found, err := r.Find(ctx, []string{self.Name()})
	if err != nil || len(found) == 0 {
		t.Fatalf("Find(%q) = %v %v", self.Name(), found, err)
	}
}

// TestRealCheckPIDNamespace: /proc is this process's PID namespace; the
// procfs of a new PID namespace (mounted by a child of unshare) is not, and
// Signal refuses through it instead of signalling whatever has that PID here.
func TestRealCheckPIDNamespace(t *testing.T) {
	if err := New("/proc").CheckPIDNamespace(); err != nil {
		t.Fatalf("/proc: %v", err)
	}
	if _, err := exec.LookPath("unshare"); err != nil || os.Geteuid() != 0 {
		t.Skip("needs root and unshare(1)")
	}
	mnt := t.TempDir()
	child := exec.Command("unshare", "--pid", "--fork", "sh", "-c", "mount -t proc proc "+mnt+" && exec sleep 300")
	netnstest.StartGroup(t, child)
	t.Cleanup(func() { _ = syscall.Unmount(mnt, syscall.MNT_DETACH) })
	waitFor(t, "the other PID namespace's procfs", func() bool {
		_, err := os.Stat(filepath.Join(mnt, "locks"))
		return err == nil
	})
	other := New(mnt)
	err := other.CheckPIDNamespace()
	if err == nil {
		t.Fatal("the procfs of another PID namespace passed the check")
	}
	t.Log(err)
	// PID 1 there is sleep; pid 2 is nobody there, but may be someone here.
	me := int32(os.Getpid())
	if serr := other.Signal(context.Background(), me, 1, syscall.SIGTERM); serr == nil || !strings.Contains(serr.Error(), "PID namespace") {
		t.Errorf("Signal through another namespace's procfs = %v", serr)
	}
}

func FuzzParseCapEff(f *testing.F) {
	f.Add([]byte("Name:\tiptables\nCapInh:\t0000000000000000\nCapEff:\t000001ffffffffff\n"))
	f.Add([]byte("CapEff:\tzz\n"))
	f.Fuzz(func(t *testing.T, b []byte) {
		c, ok := parseCapEff(b)
		if !ok && c != 0 {
			t.Fatalf("not ok but %x", c)
		}
	})
}

func TestParseCapEff(t *testing.T) {
	c, ok := parseCapEff([]byte("Name:\tx\nCapPrm:\t0000000000000000\nCapEff:\t0000000000001000\n"))
	if !ok || c != CapNetAdmin {
		t.Errorf("got %x %v", c, ok)
	}
	if _, ok := parseCapEff([]byte("Name:\tx\n")); ok {
		t.Error("no CapEff line parsed as ok")
	}
}

// TestRealFindReadsArgvOnlyWhenCommChanges, on a procfs-shaped directory:
// argv[0] is read for a new PID and again when its comm changes (exec),
// not while the comm stays (a changed cmdline then shows at the next full
// refresh, every refreshScans-th scan); a vanished PID is forgotten.
func TestRealFindReadsArgvOnlyWhenCommChanges(t *testing.T) {
	root := t.TempDir()
	write := func(rel, s string) { t.Helper(); writeUnder(t, root, rel, s) }
	proc := func(pid int, comm, argv string) {
		d := strconv.Itoa(pid)
		write(d+"/comm", comm+"\n")
		write(d+"/cmdline", argv)
		write(d+"/stat", d+" ("+comm+") S 1 1 1 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 500 0 0")
	}
	write("stat", "cpu 0\nbtime 1000\n")
	proc(10, "bash", "bash\x00-c\x00x\x00")
	proc(11, "sleep", "iptables-restore\x00300\x00") // exec -a
	proc(12, "kworker/0:1", "")
	r := New(root)
	ctx := context.Background()
	find := func() []int32 {
		t.Helper()
		// A new cycle: the comm scan of the last one has expired.
		commScans.mu.Lock()
		delete(commScans.m, root)
		commScans.mu.Unlock()
		ps, err := r.Find(ctx, []string{"iptables-restore"})
		if err != nil {
			t.Fatal(err)
		}
		var pids []int32
		for _, p := range ps {
			pids = append(pids, p.Pid)
		}
		return pids
	}
	if got := find(); !slices.Equal(got, []int32{11}) {
		t.Fatalf("first scan: %v, want the impostor 11", got)
	}
	// 10 execs iptables-restore: exec changes the comm.
	proc(10, "iptables-restor", "iptables-restore\x00-w\x00")
	if got := find(); !slices.Equal(got, []int32{10, 11}) {
		t.Fatalf("after exec: %v", got)
	}
	// A match is read whole before it is returned: 11 rewriting its argv
	// away is seen at once.
	proc(11, "sleep", "sleep\x00300\x00")
	if got := find(); !slices.Equal(got, []int32{10}) {
		t.Fatalf("after 11 rewrote its argv: %v", got)
	}
	// The other way, comm unchanged, argv[0] is not read again until the
	// next full scan (scan refreshScans+1).
	proc(11, "sleep", "iptables-restore\x00300\x00")
	for scan := r.scans + 1; scan <= refreshScans; scan++ {
		if got := find(); !slices.Equal(got, []int32{10}) {
			t.Fatalf("scan %d: %v (argv re-read although the comm is unchanged?)", scan, got)
		}
	}
	if got := find(); !slices.Equal(got, []int32{10, 11}) {
		t.Fatalf("full scan %d: %v, want 10 and 11", r.scans, got)
	}
	if err := os.RemoveAll(filepath.Join(root, "10")); err != nil {
		t.Fatal(err)
	}
	if got := find(); !slices.Equal(got, []int32{11}) {
		t.Fatalf("after 10 exited: %v", got)
	}
	if _, ok := r.argv[10]; ok || len(r.argv) != 2 {
		t.Errorf("remembered %v", r.argv)
	}
}

// TestRealFindsOfOneCycleShareAScan: the Finds of one cycle (one shared
// comm scan) count as one scan and read each argv at most once for it,
// even on a full-refresh scan; the next cycle's scan counts again.
func TestRealFindsOfOneCycleShareAScan(t *testing.T) {
	root := t.TempDir()
	write := func(rel, s string) { t.Helper(); writeUnder(t, root, rel, s) }
	write("stat", "cpu 0\nbtime 1000\n")
	write("11/comm", "sleep\n")
	write("11/cmdline", "sleep\x00300\x00")
	write("11/stat", "11 (sleep) S 1 1 1 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 500 0 0")
	r := New(root)
	ctx := context.Background()
	newCycle := func() {
		commScans.mu.Lock()
		delete(commScans.m, root)
		commScans.mu.Unlock()
	}
	find := func() int {
		t.Helper()
		ps, err := r.Find(ctx, []string{"iptables-restore"})
		if err != nil {
			t.Fatal(err)
		}
		return len(ps)
	}
	newCycle()
	if n := find(); n != 0 || r.scans != 1 {
		t.Fatalf("first Find: %d found, scan %d", n, r.scans)
	}
	// Same cycle (scan 1 is a full refresh): argv is not read again.
	write("11/cmdline", "iptables-restore\x00300\x00")
	for i := 0; i < 3; i++ {
		if n := find(); n != 0 || r.scans != 1 {
			t.Fatalf("Find %d of the same cycle: %d found, scan %d (argv read twice for one scan?)", i+2, n, r.scans)
		}
	}
	// The following cycles count one scan each; the rewritten argv shows
	// at the next full refresh, refreshScans cycles later, and not before.
	for c := 2; c <= refreshScans; c++ {
		newCycle()
		if n := find() + find(); n != 0 || r.scans != uint64(c) {
			t.Fatalf("cycle %d: %d found, scan %d", c, n, r.scans)
		}
	}
	newCycle()
	if n := find(); n != 1 || r.scans != refreshScans+1 {
		t.Fatalf("full refresh: %d found, scan %d, want 1 at scan %d", n, r.scans, refreshScans+1)
	}
}

// TestScanCommsShared: the scans of one cycle share one read of the comms
// (a process started after it is seen by the next cycle's scan), and
// CommRunning answers from it.
func TestScanCommsShared(t *testing.T) {
	root := t.TempDir()
	mk := func(pid, comm string) {
		if err := os.MkdirAll(filepath.Join(root, pid), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(root, pid, "comm"), []byte(comm+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	mk("1", "init")
	if ok, err := CommRunning(root, "kube-proxy"); ok || err != nil {
		t.Fatalf("kube-proxy running: %v %v", ok, err)
	}
	mk("2", "kube-proxy")
	if ok, _ := CommRunning(root, "kube-proxy"); ok {
		t.Fatal("the cycle's scan was read again")
	}
	commScans.mu.Lock()
	commScans.m[root].at = time.Now().Add(-commScanTTL)
	commScans.mu.Unlock()
	if ok, _ := CommRunning(root, "kube-proxy"); !ok {
		t.Fatal("the next cycle's scan does not see kube-proxy")
	}
}

// BenchmarkFindOnABusyNode: one cycle's process scans (HungIPTablesRestore's
// and HungNFT's Find, kube-proxy's absence check) with 1,000 extra
// processes running: one shared comm scan, argv read only for new PIDs
// (and for all on every refreshScans-th scan). "comms-reused" is the
// steady state between comm refreshes (each comm is read again every
// commRefresh/2 to commRefresh, so at a 30 s interval about half the
// cycles read it, at 2 s one in ~22); "comms-read" reads every comm every
// cycle, as all scans did before the /proc/<pid> inodes were compared.
// cpu-ns/op is this process's user+system CPU per cycle (getrusage), the
// kernel's work on /proc included.
func BenchmarkFindOnABusyNode(b *testing.B) {
	if _, err := exec.LookPath("sleep"); err != nil {
		b.Skip("needs sleep")
	}
	for range 1000 {
		netnstest.StartGroup(b, exec.Command("sleep", "600"))
	}
	for _, bc := range []struct {
		name    string
		refresh time.Duration
	}{{"comms-reused", commRefresh}, {"comms-read", 0}} {
		b.Run(bc.name, func(b *testing.B) {
			commScans.mu.Lock()
			commScans.refresh = bc.refresh
			commScans.mu.Unlock()
			defer func() {
				commScans.mu.Lock()
				commScans.refresh = commRefresh
				commScans.mu.Unlock()
			}()
			r := New("/proc")
			ctx := context.Background()
			b.ReportAllocs()
			cpu0 := cpuTime(b)
			for b.Loop() {
				ExpireCommScans() // a new cycle
				if _, err := r.Find(ctx, []string{"iptables-restore", "iptables-legacy-restore", "ip6tables-restore"}); err != nil {
					b.Fatal(err)
				}
				if _, err := r.Find(ctx, []string{"nft"}); err != nil {
					b.Fatal(err)
				}
				if _, err := CommRunning("/proc", "kube-proxy"); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(cpuTime(b)-cpu0)/float64(b.N), "cpu-ns/op")
		})
	}
}

// cpuTime is this process's user+system CPU so far.
func cpuTime(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// writeUnder writes s to root/rel, making its directories.
func writeUnder(t *testing.T, root, rel, s string) {
	t.Helper()
	p := filepath.Join(root, rel)
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, []byte(s), 0o644); err != nil {
		t.Fatal(err)
	}
}
