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
	"testing"
	"time"

	"github.com/remediate-dev/remediate/internal/netnstest"
	"github.com/remediate-dev/remediate/internal/testing/setpriv"
)

// envInt reads an int the parent test passed to its setpriv child.
func envInt(t *testing.T, name string) int32 {
	t.Helper()
	n, err := strconv.Atoi(os.Getenv(name))
	if err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	return int32(n)
}

// TestRealFactsWithoutPtrace runs the real adapter with exactly the
// chart's default capabilities (setpriv: NET_ADMIN, NET_RAW, KILL) against
// root processes with every capability: their executables and network
// namespaces' links are refused (so nothing of this test passes on exe),
// but the cgroup place, the network namespace key (/proc/<pid>/net/dev's
// inode: the node's for a host process, another for one in a namespace
// the test makes), the CPU time of a spinning process, and the xtables
// lock's holder (/proc/locks' caller) and waiter are read. The fd method
// finds the same holder (and flock's child) with every capability.
// Fails on the code before the change: Process had no Cgroup, NetKey or
// CPUTicks, and FileLocks found no holder without ptrace.
func TestRealFactsWithoutPtrace(t *testing.T) {
	ctx := context.Background()
	r := New("/proc")
	if setpriv.Child() {
		if p, err := r.Get(ctx, 1); err == nil && p.Exe != "" {
			t.Fatalf("the child reads pid 1's executable (%s): not running without CAP_SYS_PTRACE", p.Exe)
		}
		host, err := r.Get(ctx, envInt(t, "T_HOST"))
		if err != nil {
			t.Fatal(err)
		}
		if host.Exe != "" || host.NetNS != "" {
			t.Fatalf("exe %q / netns %q readable without ptrace", host.Exe, host.NetNS)
		}
		if host.Cgroup.Place != CgroupHost || host.NetKey == 0 || host.NetKey != r.SelfNetKey() || host.CapEff&CapNetAdmin == 0 {
			t.Fatalf("host process: %+v (self net key %d)", host, r.SelfNetKey())
		}
		other, err := r.Get(ctx, envInt(t, "T_NETNS"))
		if err != nil {
			t.Fatal(err)
		}
		if other.NetKey == 0 || other.NetKey == r.SelfNetKey() {
			t.Fatalf("process in another netns: key %d, self %d", other.NetKey, r.SelfNetKey())
		}
		spin := envInt(t, "T_SPIN")
		a, err := r.Get(ctx, spin)
		if err != nil {
			t.Fatal(err)
		}
		// A busy machine may give the spinner little CPU: its time
		// advances within seconds all the same.
		start := time.Now()
		b := a
		for b.CPUTicks <= a.CPUTicks && time.Since(start) < 5*time.Second {
			time.Sleep(100 * time.Millisecond)
			if b, err = r.Get(ctx, spin); err != nil {
				t.Fatal(err)
			}
		}
		if b.CPUTicks <= a.CPUTicks {
			t.Fatalf("spinning process: %d then %d ticks", a.CPUTicks, b.CPUTicks)
		}
		t.Logf("spinner: %.2f s of CPU in %s", float64(b.CPUTicks-a.CPUTicks)/TicksPerSecond, time.Since(start).Round(10*time.Millisecond))
		fl, err := r.FileLocks(ctx, os.Getenv("T_LOCK"))
		if err != nil {
			t.Fatal(err)
		}
		holder, waiter := envInt(t, "T_HOLDER"), envInt(t, "T_WAITER")
		if !fl.Held || fl.HoldersFrom != HoldersFromProcLocks || len(fl.Holders) != 1 || fl.Holders[0].Pid != holder {
			t.Fatalf("holders without ptrace: %+v, want flock pid %d from /proc/locks", fl, holder)
		}
		if len(fl.Waiters) != 1 || fl.Waiters[0].Pid != waiter || fl.Waiters[0].Cgroup.Place != CgroupHost {
			t.Fatalf("waiters: %+v, want pid %d", fl.Waiters, waiter)
		}
		return
	}
	setpriv.Available(t)
	if _, err := exec.LookPath("flock"); err != nil {
		t.Skip("needs flock(1)")
	}
	host := start(t, "sleep", "300")
	ns := netnstest.New(t)
	other := exec.Command("ip", "netns", "exec", ns, "sleep", "300")
	netnstest.StartGroup(t, other)
	spin := start(t, "sh", "-c", "while :; do :; done")
	lock := filepath.Join(t.TempDir(), "xtables.lock")
	holder := start(t, "flock", lock, "sleep", "300")
	waitFor(t, "the lock to be held", func() bool {
		fl, err := r.FileLocks(ctx, lock)
		return err == nil && fl.Held && len(fl.Holders) == 2 && fl.Holders[1].Name() == "sleep"
	})
	waiter := start(t, "flock", lock, "true")
	waitFor(t, "a waiter", func() bool {
		fl, err := r.FileLocks(ctx, lock)
		return err == nil && len(fl.Waiters) == 1
	})
	fl, err := r.FileLocks(ctx, lock)
	if err != nil || fl.HoldersFrom != HoldersFromFDInfo || !slices.ContainsFunc(fl.Holders, func(p Process) bool { return p.Pid == int32(holder.Process.Pid) }) {
		t.Fatalf("with every capability: %+v %v", fl, err)
	}
	waitFor(t, "ip netns exec to exec sleep", func() bool {
		p, err := r.Get(ctx, int32(other.Process.Pid))
		return err == nil && p.Name() == "sleep"
	})
	out := setpriv.Run(t, setpriv.DefaultCaps,
		fmt.Sprintf("T_HOST=%d", host.Process.Pid), fmt.Sprintf("T_NETNS=%d", other.Process.Pid), fmt.Sprintf("T_SPIN=%d", spin.Process.Pid),
		"T_LOCK="+lock, fmt.Sprintf("T_HOLDER=%d", holder.Process.Pid), fmt.Sprintf("T_WAITER=%d", waiter.Process.Pid))
	for _, l := range strings.Split(out, "\n") {
		if strings.Contains(l, "spinner:") {
			t.Log(strings.TrimSpace(l))
		}
	}
}

// TestRealPodCgroup moves a process into a cgroup named as the kubelet
// names a container's (systemd driver, containerd, on the unified
// hierarchy) and reads its pod UID and container ID through the real
// adapter without ptrace (the setpriv child).
func TestRealPodCgroup(t *testing.T) {
	ctx := context.Background()
	r := New("/proc")
	uid := "5d3c6e1a-9b7f-4c2e-8a1d-0f2e3d4c5b6a"
	ctr := strings.Repeat("ab12", 16)
	if setpriv.Child() {
		p, err := r.Get(ctx, envInt(t, "T_POD"))
		if err != nil {
			t.Fatal(err)
		}
		if p.Cgroup != (Cgroup{Place: CgroupPod, PodUID: uid, ContainerID: ctr}) {
			t.Fatalf("cgroup: %+v", p.Cgroup)
		}
		return
	}
	setpriv.Available(t)
	base := "/sys/fs/cgroup/unified"
	if _, err := os.Stat(filepath.Join(base, "cgroup.procs")); err != nil {
		base = "/sys/fs/cgroup"
		if _, err := os.Stat(filepath.Join(base, "cgroup.controllers")); err != nil {
			t.Skip("no cgroup v2 hierarchy")
		}
	}
	top := filepath.Join(base, fmt.Sprintf("kubepods.slice-remediate-test-%d", os.Getpid()))
	dir := filepath.Join(top, "kubepods-pod"+strings.ReplaceAll(uid, "-", "_")+".slice", "cri-containerd-"+ctr+".scope")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Skipf("cannot make a cgroup: %v", err)
	}
	// Removed after the process is gone (cleanups run last-in first-out:
	// this one after start's).
	t.Cleanup(func() {
		for _, d := range []string{dir, filepath.Dir(dir), top} {
			for i := 0; i < 50 && os.Remove(d) != nil; i++ {
				time.Sleep(20 * time.Millisecond)
			}
		}
	})
	p := start(t, "sleep", "300")
	if err := os.WriteFile(filepath.Join(dir, "cgroup.procs"), []byte(strconv.Itoa(p.Process.Pid)), 0); err != nil {
		t.Fatalf("moving pid %d into %s: %v", p.Process.Pid, dir, err)
	}
	setpriv.Run(t, setpriv.DefaultCaps, fmt.Sprintf("T_POD=%d", p.Process.Pid))
}
