package procs

import (
	"context"
	"fmt"
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

// fakeScanClock gives the comm scans a clock of the test's own and the
// refresh interval for the test's duration. The returned function
// advances that clock; advancing by commScanTTL or more starts a new
// cycle (a new scan).
func fakeScanClock(t *testing.T, refresh time.Duration) func(time.Duration) {
	t.Helper()
	now := time.Unix(1_000_000, 0)
	commScans.mu.Lock()
	oldNow, oldRefresh := commScans.now, commScans.refresh
	commScans.now = func() time.Time { return now } // called under mu
	commScans.refresh = refresh
	commScans.mu.Unlock()
	t.Cleanup(func() {
		commScans.mu.Lock()
		commScans.now, commScans.refresh = oldNow, oldRefresh
		commScans.mu.Unlock()
	})
	return func(d time.Duration) {
		commScans.mu.Lock()
		now = now.Add(d)
		commScans.mu.Unlock()
	}
}

// TestScanCommsReusesComms, on a procfs-shaped directory: a scan reads the
// comm of a process new to it, once more at the next scan, and then only
// when its refresh is due; a directory with a new inode (a reused PID) is
// read at once, a vanished one dropped.
func TestScanCommsReusesComms(t *testing.T) {
	const refresh = time.Minute // nothing is due before the test says so
	advance := fakeScanClock(t, refresh)
	root := t.TempDir()
	mk := func(pid, comm string) {
		t.Helper()
		if err := os.MkdirAll(filepath.Join(root, pid), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(root, pid, "comm"), []byte(comm+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	mk("1", "init")
	mk("2", "sh")
	mk("3", "kworker/0:1")
	mk("self", "not a pid")
	mk("0042", "not canonical")
	scan := func(wantReads int, want map[int32]string) {
		t.Helper()
		advance(2 * time.Second) // a new cycle
		s, err := scanComms(root)
		if err != nil {
			t.Fatal(err)
		}
		got := map[int32]string{}
		for _, p := range s.procs {
			got[p.pid] = p.comm
		}
		if s.reads != wantReads || len(got) != len(want) {
			t.Fatalf("scan read %d comms, got %v; want %d reads, %v", s.reads, got, wantReads, want)
		}
		for pid, c := range want {
			if got[pid] != c {
				t.Fatalf("pid %d comm %q, want %q (all: %v)", pid, got[pid], c, got)
			}
		}
	}
	all := map[int32]string{1: "init", 2: "sh", 3: "kworker/0:1"}
	scan(3, all) // new
	scan(3, all) // read again once (caught between fork and exec?)
	scan(0, all) // reused
	// 2 execs in place: the same directory, a new comm, unseen until
	// its refresh is due.
	mk("2", "iptables-restor")
	scan(0, all)
	// A new process is read at once.
	mk("4", "kube-proxy")
	all[4] = "kube-proxy"
	scan(1, all)
	// PID 3 reused by another process: another /proc/3 inode (the old
	// directory is moved away, not removed, so that its inode number
	// cannot be given to the new one).
	if err := os.Rename(filepath.Join(root, "3"), filepath.Join(root, "old3")); err != nil {
		t.Fatal(err)
	}
	mk("3", "bash")
	all[3] = "bash"
	scan(2, all) // 3 new, 4 read again
	// 1 exits.
	if err := os.RemoveAll(filepath.Join(root, "1")); err != nil {
		t.Fatal(err)
	}
	delete(all, 1)
	scan(1, all) // 3 read again
	scan(0, all)
	// The refresh (at most refresh after the last read) shows 2's new comm.
	advance(refresh)
	all[2] = "iptables-restor"
	scan(3, all)
	if ok, err := CommRunning(root, "iptables-restor"); !ok || err != nil {
		t.Fatalf("CommRunning = %v %v", ok, err)
	}
}

// TestRefreshAfterSpreads: each PID's comm is reused for between half the
// refresh interval and all of it.
func TestRefreshAfterSpreads(t *testing.T) {
	seen := map[time.Duration]bool{}
	for pid := int32(1); pid < 100; pid++ {
		d := refreshAfter(pid, commRefresh)
		if d <= commRefresh/2 || d > commRefresh {
			t.Fatalf("pid %d: %v", pid, d)
		}
		seen[d] = true
	}
	if len(seen) != 16 {
		t.Errorf("%d distinct intervals, want 16", len(seen))
	}
	if refreshAfter(7, 0) != 0 {
		t.Error("a zero refresh reuses comms")
	}
}

// TestListProcInodes checks on this kernel what the scan relies on: the
// inode number getdents64 gives for /proc/<pid> is the directory's own
// (stat), stays while the process lives, differs between processes, and
// a PID reused by a new process comes with another inode (forced with
// ns_last_pid when root).
func TestListProcInodes(t *testing.T) {
	list := func() map[int32]uint64 {
		t.Helper()
		ents, err := listProc("/proc", make([]byte, 4096), 0)
		if err != nil {
			t.Fatal(err)
		}
		m := map[int32]uint64{}
		inos := map[uint64]int32{}
		for i, e := range ents {
			if i > 0 && ents[i-1].pid >= e.pid {
				t.Fatalf("not sorted by PID: %d after %d", e.pid, ents[i-1].pid)
			}
			if other, dup := inos[e.ino]; dup && e.ino > 1 {
				t.Fatalf("pids %d and %d share inode %d", other, e.pid, e.ino)
			}
			inos[e.ino] = e.pid
			m[e.pid] = e.ino
		}
		return m
	}
	stat := func(pid int) uint64 {
		t.Helper()
		var st syscall.Stat_t
		if err := syscall.Stat("/proc/"+strconv.Itoa(pid), &st); err != nil {
			t.Fatal(err)
		}
		return st.Ino
	}
	self := os.Getpid()
	before := list()
	if ino := before[int32(self)]; ino <= 1 || ino != stat(self) {
		t.Fatalf("self: getdents inode %d, stat %d", ino, stat(self))
	}
	a := exec.Command("sleep", "600")
	netnstest.StartGroup(t, a)
	pidA := a.Process.Pid
	withA := list()
	inoA := withA[int32(pidA)]
	if inoA <= 1 || inoA != stat(pidA) {
		t.Fatalf("child %d: getdents inode %d, stat %d", pidA, inoA, stat(pidA))
	}
	if withA[int32(self)] != before[int32(self)] {
		t.Errorf("self's inode changed between two listings: %d, %d", before[int32(self)], withA[int32(self)])
	}
	if os.Geteuid() != 0 {
		t.Skip("forcing a PID's reuse (ns_last_pid) needs root")
	}
	if err := syscall.Kill(pidA, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the child reaped", func() bool { _, err := os.Stat("/proc/" + strconv.Itoa(pidA)); return err != nil })
	for try := 0; ; try++ {
		if try == 50 {
			t.Skip("pid not reused after 50 tries (a busy machine took it)")
		}
		if err := os.WriteFile("/proc/sys/kernel/ns_last_pid", []byte(strconv.Itoa(pidA-1)), 0); err != nil {
			t.Skipf("ns_last_pid: %v", err)
		}
		b := exec.Command("sleep", "600")
		netnstest.StartGroup(t, b)
		if b.Process.Pid != pidA {
			_ = syscall.Kill(b.Process.Pid, syscall.SIGKILL)
			continue
		}
		inoB := list()[int32(pidA)]
		if inoB <= 1 || inoB == inoA || inoB != stat(pidA) {
			t.Fatalf("pid %d reused: inode %d, was %d (stat now %d)", pidA, inoB, inoA, stat(pidA))
		}
		t.Logf("pid %d: inode %d, reused by a new process: inode %d (try %d)", pidA, inoA, inoB, try)
		return
	}
}

// TestRealFindAfterExecInPlace: a process that execs in place into the
// program looked for (same PID, same /proc/<pid> inode, new comm) is found
// once its comm's refresh is due, not before; a new process is found at
// the next scan and an exited one is dropped.
func TestRealFindAfterExecInPlace(t *testing.T) {
	const refresh = 10 * time.Second
	advance := fakeScanClock(t, refresh)
	sleep, err := exec.LookPath("sleep")
	if err != nil {
		t.Skip("needs sleep")
	}
	// comm and argv[0] are the name of the exec'd path: a link to sleep.
	const name = "procscan-execd"
	prog := filepath.Join(t.TempDir(), name)
	if err := os.Symlink(sleep, prog); err != nil {
		t.Fatal(err)
	}
	r := New("/proc")
	ctx := context.Background()
	find := func() []int32 {
		t.Helper()
		advance(2 * time.Second) // a new cycle
		ps, err := r.Find(ctx, []string{name})
		if err != nil {
			t.Fatal(err)
		}
		var pids []int32
		for _, p := range ps {
			pids = append(pids, p.Pid)
		}
		return pids
	}
	sh := exec.Command("sh", "-c", `read x; exec "$0" 600`, prog)
	w, err := sh.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	netnstest.StartGroup(t, sh)
	pid := int32(sh.Process.Pid)
	waitFor(t, "sh to run", func() bool {
		b, _ := os.ReadFile("/proc/" + strconv.Itoa(int(pid)) + "/comm")
		return string(b) == "sh\n"
	})
	if got := find(); len(got) != 0 {
		t.Fatalf("found %v before the exec", got)
	}
	find() // the second read of a new process's comm
	if _, err := w.Write([]byte("go\n")); err != nil {
		t.Fatal(err)
	}
	// The exec is complete when the argv is there too: the kernel sets
	// the comm first and cmdline reads empty until the loader set up the
	// new stack (see TestFindRereadsAnArgvReadEmpty).
	execd := func(pid int) func() bool {
		return func() bool {
			b, _ := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/comm")
			a, _ := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cmdline")
			return string(b) == name+"\n" && strings.HasPrefix(string(a), prog+"\x00")
		}
	}
	waitFor(t, "the exec", execd(int(pid)))
	// Within the refresh the remembered comm ("sh") is used: argv is not
	// read again (scan 3 is not a full argv refresh).
	if got := find(); len(got) != 0 || r.scans%refreshScans == 1 {
		t.Fatalf("scan %d found %v, before the comm's refresh", r.scans, got)
	}
	advance(refresh)
	if got := find(); !slices.Equal(got, []int32{pid}) {
		t.Fatalf("after the refresh: %v, want [%d]", got, pid)
	}
	// A new process is found at the next scan.
	other := exec.Command(prog, "600")
	netnstest.StartGroup(t, other)
	waitFor(t, "the new process to exec", execd(other.Process.Pid))
	if got := find(); !slices.Equal(got, []int32{pid, int32(other.Process.Pid)}) && !slices.Equal(got, []int32{int32(other.Process.Pid), pid}) {
		t.Fatalf("with a new process: %v, want %d and %d", got, pid, other.Process.Pid)
	}
	// An exited process is dropped.
	if err := syscall.Kill(int(pid), syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the exec'd process reaped", func() bool { _, err := os.Stat("/proc/" + strconv.Itoa(int(pid))); return err != nil })
	if got := find(); !slices.Equal(got, []int32{int32(other.Process.Pid)}) {
		t.Fatalf("after %d exited: %v", pid, got)
	}
	s, err := scanComms("/proc")
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range s.procs {
		if p.pid == pid {
			t.Fatalf("exited pid %d still in the scan: %+v", pid, p)
		}
	}
}

// TestScanConcurrent: Finds, CommRunning and new cycles from several
// goroutines share scans safely (run with -race) and agree.
func TestScanConcurrent(t *testing.T) {
	root := t.TempDir()
	for pid, comm := range map[string]string{"1": "init", "7": "kube-proxy", "9": "iptables-restor"} {
		os.MkdirAll(filepath.Join(root, pid), 0o755)
		os.WriteFile(filepath.Join(root, pid, "comm"), []byte(comm+"\n"), 0o644)
		os.WriteFile(filepath.Join(root, pid, "cmdline"), []byte(comm+"\x00"), 0o644)
		os.WriteFile(filepath.Join(root, pid, "stat"), []byte(pid+" ("+comm+") S 1 1 1 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 500 0 0"), 0o644)
	}
	os.WriteFile(filepath.Join(root, "stat"), []byte("btime 1000\n"), 0o644)
	r := New(root)
	errs := make(chan error, 4)
	for g := range 4 {
		go func() {
			for i := range 50 {
				if i%10 == g {
					ExpireCommScans()
				}
				ps, err := r.Find(context.Background(), []string{"kube-proxy"})
				if err == nil && (len(ps) != 1 || ps[0].Pid != 7) {
					err = fmt.Errorf("found %+v", ps)
				}
				if ok, cerr := CommRunning(root, "iptables-restor"); err == nil && (!ok || cerr != nil) {
					err = fmt.Errorf("CommRunning = %v %v", ok, cerr)
				}
				if err != nil {
					errs <- err
					return
				}
			}
			errs <- nil
		}()
	}
	for range 4 {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
}

// TestFindRereadsAnArgvReadEmpty, on a procfs-shaped directory: a process
// caught in the middle of execve shows its new comm before its argv
// (cmdline reads empty until the binary loader has set up the new stack).
// The empty argv must be read again at the next scan, not remembered until
// the comm changes or the refreshScans-th scan: that is how
// TestRealFindAfterExecInPlace missed a just-exec'd process about 2 times
// in 90. An argv read empty twice (a kernel thread) is then remembered.
func TestFindRereadsAnArgvReadEmpty(t *testing.T) {
	advance := fakeScanClock(t, time.Hour)
	root := t.TempDir()
	writeUnder(t, root, "100/comm", "procscan-execd\n")
	writeUnder(t, root, "100/cmdline", "") // mid-exec
	writeUnder(t, root, "2/comm", "kthreadd\n")
	writeUnder(t, root, "2/cmdline", "") // a kernel thread
	r := New(root)
	find := func() {
		t.Helper()
		advance(2 * time.Second) // a new cycle
		if _, err := r.Find(context.Background(), []string{"procscan-execd"}); err != nil {
			t.Fatal(err)
		}
	}
	find()
	if e := r.argv[100]; e.name != "" {
		t.Fatalf("argv read as %q from an empty cmdline", e.name)
	}
	writeUnder(t, root, "100/cmdline", "/tmp/x/procscan-execd\x00600\x00") // the exec completed
	find()
	if e := r.argv[100]; e.name != "procscan-execd" {
		t.Fatalf("after the exec completed the scan remembers argv[0] %q (entry %+v), want procscan-execd", e.name, e)
	}
	find() // the kernel thread's second empty read
	// A kernel thread's argv is not read at every scan.
	writeUnder(t, root, "2/cmdline", "not read\x00")
	find()
	if e := r.argv[2]; e.name != "" {
		t.Fatalf("kernel thread's argv read again at an ordinary scan: %+v", e)
	}
}
