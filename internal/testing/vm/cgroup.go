//go:build linux

package vm

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// The cgroup v2 helpers: the guest kernel (Debian's) has the cpu
// controller with CFS bandwidth, and nothing in the guest uses cgroups, so
// a test may mount the unified hierarchy, enable the cpu controller and
// make quota-limited groups there, which on the development and CI hosts
// (cgroup v1 cpu controller) it cannot.

// CgroupRoot is where Cgroup2 mounts the unified hierarchy in the guest.
const CgroupRoot = "/sys/fs/cgroup"

// RequireGuest skips t unless it runs inside the test VM, like Require,
// but without touching IPVS (for tests of other kernel features).
func RequireGuest(t testing.TB) {
	t.Helper()
	if !InVM() {
		t.Skip("runs only inside the test VM (make test-vm; " + EnvInVM + "=1)")
	}
}

// Cgroup2 mounts cgroup2 at CgroupRoot unless the guest's /init (or an
// earlier test binary) has, and enables the cpu controller for the root's
// children. It returns CgroupRoot. The mount is left in place: the VM is
// powered off after the tests.
func Cgroup2(t testing.TB) string {
	t.Helper()
	var st unix.Statfs_t
	if err := unix.Statfs(CgroupRoot, &st); err != nil {
		t.Fatalf("statfs %s: %v", CgroupRoot, err)
	}
	if st.Type != unix.CGROUP2_SUPER_MAGIC {
		if err := unix.Mount("cgroup2", CgroupRoot, "cgroup2", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, ""); err != nil {
			t.Fatalf("mounting cgroup2 on %s: %v", CgroupRoot, err)
		}
	}
	b, err := os.ReadFile(filepath.Join(CgroupRoot, "cgroup.controllers"))
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(strings.Fields(string(b)), "cpu") {
		t.Fatalf("the guest kernel's cgroup2 has no cpu controller (cgroup.controllers: %q)", strings.TrimSpace(string(b)))
	}
	enableCPU(t, CgroupRoot)
	return CgroupRoot
}

func enableCPU(t testing.TB, dir string) {
	t.Helper()
	if err := os.WriteFile(filepath.Join(dir, "cgroup.subtree_control"), []byte("+cpu"), 0o644); err != nil {
		t.Fatalf("enabling the cpu controller below %s: %v", dir, err)
	}
}

// Cgroup is a cgroup v2 group a test made under CgroupRoot.
type Cgroup struct {
	// Path is its path in the hierarchy ("/kubepods/pod1/ctr"), as
	// /proc/<pid>/cgroup's "0::" line shows it from the root namespace.
	Path string
	// Dir is its directory.
	Dir string
}

// NewCgroup makes the group p (absolute, e.g. "/kubepods/pod1/ctr") and
// any missing ancestors, with the cpu controller enabled in each ancestor
// (so p's cpu.stat carries nr_periods, nr_throttled and throttled_usec),
// and writes cpuMax ("5000 100000": 5 ms per 100 ms; "" leaves "max")
// to p's cpu.max. Cgroup2 must have run. What it made is removed when t
// ends, after the processes Spin started in it (whose cleanups run first).
func NewCgroup(t testing.TB, p, cpuMax string) *Cgroup {
	t.Helper()
	p = path.Clean("/" + p)
	dir := CgroupRoot
	for _, seg := range strings.Split(strings.TrimPrefix(p, "/"), "/") {
		enableCPU(t, dir)
		dir = filepath.Join(dir, seg)
		if err := os.Mkdir(dir, 0o755); err != nil {
			if !errors.Is(err, os.ErrExist) {
				t.Fatal(err)
			}
			continue
		}
		made := dir
		t.Cleanup(func() { removeCgroup(t, made) })
	}
	if cpuMax != "" {
		if err := os.WriteFile(filepath.Join(dir, "cpu.max"), []byte(cpuMax), 0o644); err != nil {
			t.Fatalf("cpu.max %q in %s: %v", cpuMax, dir, err)
		}
	}
	return &Cgroup{Path: p, Dir: dir}
}

// removeCgroup removes a group the test made, moving any process still in
// it to the root first.
func removeCgroup(t testing.TB, dir string) {
	for i := 0; i < 50; i++ {
		b, _ := os.ReadFile(filepath.Join(dir, "cgroup.procs"))
		for _, pid := range strings.Fields(string(b)) {
			_ = os.WriteFile(filepath.Join(CgroupRoot, "cgroup.procs"), []byte(pid), 0o644)
		}
		if err := os.Remove(dir); err == nil || errors.Is(err, os.ErrNotExist) {
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Errorf("cgroup %s not removed", dir)
}

// CPUStat reads the group's cpu.stat into a map, with a parser of its own
// (the tests compare it with what the code under test reads).
func (c *Cgroup) CPUStat(t testing.TB) map[string]uint64 {
	t.Helper()
	f, err := os.Open(filepath.Join(c.Dir, "cpu.stat"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	out := map[string]uint64{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		var k string
		var v uint64
		if _, err := fmt.Sscanf(sc.Text(), "%s %d", &k, &v); err != nil {
			t.Fatalf("%s/cpu.stat line %q: %v", c.Dir, sc.Text(), err)
		}
		out[k] = v
	}
	return out
}

// envSpin makes a test binary that imports this package spin forever
// instead of running its tests (Spin's child).
const envSpin = "REMEDIATE_VM_SPIN"

// spins is what Spin's child counts, CPU-bound until it is killed.
var spins atomic.Uint64

func init() {
	if os.Getenv(envSpin) == "1" && InVM() {
		for {
			spins.Add(1)
		}
	}
}

// Spin starts a CPU-bound process directly inside the group (cloned into
// the cgroup, so no instruction of it runs outside): this test binary run
// again through a symlink named name, which init turns into an endless
// loop. Its comm and argv[0] are name, as a process found by name (a
// stand-in "kube-proxy") needs. It is killed and reaped when t ends.
func (c *Cgroup) Spin(t testing.TB, name string) *os.Process {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	// A copy, not a symlink: /proc/<pid>/exe names the file executed,
	// and a stand-in for kube-proxy must show a kube-proxy executable
	// (detect's findKubeProxy).
	link := filepath.Join(t.TempDir(), name)
	b, err := os.ReadFile(exe)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(link, b, 0o755); err != nil {
		t.Fatal(err)
	}
	fd, err := unix.Open(c.Dir, unix.O_DIRECTORY|unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	cmd := &exec.Cmd{Path: link, Args: []string{link}, Env: append(os.Environ(), envSpin+"=1", EnvInVM+"=1"),
		SysProcAttr: &syscall.SysProcAttr{UseCgroupFD: true, CgroupFD: fd}}
	if err := cmd.Start(); err != nil {
		t.Fatalf("starting a spinner in %s: %v", c.Path, err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	return cmd.Process
}

// Procs returns the PIDs in the group's cgroup.procs.
func (c *Cgroup) Procs(t testing.TB) []int {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(c.Dir, "cgroup.procs"))
	if err != nil {
		t.Fatal(err)
	}
	var out []int
	for _, f := range strings.Fields(string(b)) {
		if n, err := strconv.Atoi(f); err == nil {
			out = append(out, n)
		}
	}
	return out
}

// InCgroupNS runs fn on an OS thread that has a cgroup namespace of its
// own rooted at c, as a daemon in a container with a private cgroup
// namespace (containerd's default on cgroup v2) sees the hierarchy: its
// /proc/<pid>/cgroup shows other groups' paths relative to c
// ("0::/../../other"). To root the namespace there, the whole test process
// is moved into c for the unshare, then back to the group it was in. The
// thread is not returned to the Go runtime: it exits with fn's goroutine.
func InCgroupNS(t testing.TB, c *Cgroup, fn func() error) error {
	t.Helper()
	b, err := os.ReadFile("/proc/self/cgroup")
	if err != nil {
		t.Fatal(err)
	}
	home := ""
	for _, l := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		if p, ok := strings.CutPrefix(l, "0::"); ok {
			home = p
		}
	}
	if home == "" {
		t.Fatalf("no cgroup v2 line in /proc/self/cgroup: %q", b)
	}
	move := func(dir string) error {
		return os.WriteFile(filepath.Join(dir, "cgroup.procs"), []byte(strconv.Itoa(os.Getpid())), 0o644)
	}
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread dies with this goroutine
		if err := move(c.Dir); err != nil {
			errc <- fmt.Errorf("moving the test process into %s: %w", c.Path, err)
			return
		}
		uerr := unix.Unshare(unix.CLONE_NEWCGROUP)
		if err := move(filepath.Join(CgroupRoot, filepath.FromSlash(home))); err != nil {
			errc <- fmt.Errorf("moving the test process back to %s: %w", home, err)
			return
		}
		if uerr != nil {
			errc <- fmt.Errorf("unshare(CLONE_NEWCGROUP): %w", uerr)
			return
		}
		errc <- fn()
	}()
	return <-errc
}

// HostRoots bind-mounts /proc and CgroupRoot under a temporary directory,
// as a DaemonSet gets the host's through hostPath volumes (--proc-root
// /host/proc --cgroup-root /host/sys/fs/cgroup), and returns the two
// roots; they are unmounted when t ends.
func HostRoots(t testing.TB) (procRoot, cgroupRoot string) {
	t.Helper()
	host := t.TempDir()
	bind := func(src, dst string) {
		if err := os.MkdirAll(dst, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := unix.Mount(src, dst, "", unix.MS_BIND|unix.MS_REC, ""); err != nil {
			t.Fatalf("bind-mounting %s on %s: %v", src, dst, err)
		}
		t.Cleanup(func() { _ = unix.Unmount(dst, unix.MNT_DETACH) })
	}
	procRoot, cgroupRoot = filepath.Join(host, "proc"), filepath.Join(host, "sys/fs/cgroup")
	bind("/proc", procRoot)
	bind(CgroupRoot, cgroupRoot)
	return procRoot, cgroupRoot
}
