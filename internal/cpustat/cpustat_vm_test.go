//go:build linux

package cpustat

import (
	"context"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/remediate-dev/remediate/internal/testing/vm"
)

// TestVMCgroupV2Throttling runs only inside the test VM (make test-vm):
// the real adapter on a real kernel's cgroup v2 (the development and CI
// hosts' cpu controller is v1). A CPU-bound process in a nested group
// limited to 5% of a CPU (cpu.max "5000 100000", as kubelet sets a
// container's limit of 50m) and one in an unlimited group are read
// through bind mounts of /proc and the hierarchy (the roots a DaemonSet
// is given), from the root cgroup namespace and from a private one
// (containerd's default on v2, where /proc/<pid>/cgroup shows
// "0::/../../.."). A process whose quota is on its pod's group, not its
// own, is read from the pod's: the kernel counts nothing in its own.
func TestVMCgroupV2Throttling(t *testing.T) {
	vm.RequireGuest(t)
	vm.Cgroup2(t)
	lim := vm.NewCgroup(t, "/kubepods/burstable/pod-kp/ctr-kp", "5000 100000")
	free := vm.NewCgroup(t, "/kubepods/besteffort/pod-free/ctr-free", "")
	daemon := vm.NewCgroup(t, "/kubepods/besteffort/pod-daemon/ctr-daemon", "")
	// The quota on the pod only (as a systemd slice's CPUQuota=).
	podLim := vm.NewCgroup(t, "/kubepods/burstable/pod-lim", "5000 100000")
	podCtr := vm.NewCgroup(t, "/kubepods/burstable/pod-lim/ctr", "")
	start := time.Now()
	kp := lim.Spin(t, "kube-proxy")
	busy := free.Spin(t, "busy")
	inPod := podCtr.Spin(t, "in-pod")
	procRoot, cgroupRoot := vm.HostRoots(t)
	r := New(Config{ProcRoot: procRoot, CgroupRoot: cgroupRoot})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	if b, err := os.ReadFile(filepath.Join(procRoot, strconv.Itoa(kp.Pid), "cgroup")); err != nil || string(b) != "0::"+lim.Path+"\n" {
		t.Fatalf("/proc/%d/cgroup = %q, %v; want the v2 line only, 0::%s", kp.Pid, b, err, lim.Path)
	}
	// read returns cpustat's reading, sandwiched between two raw reads of
	// cpu.stat with a parser of the test's own.
	read := func(pid int) (before map[string]uint64, c CgroupCPU, after map[string]uint64) {
		t.Helper()
		before = lim.CPUStat(t)
		c, err := r.CgroupCPU(ctx, int32(pid))
		if err != nil {
			t.Fatalf("CgroupCPU(%d): %v", pid, err)
		}
		return before, c, lim.CPUStat(t)
	}
	between := func(what string, lo, got, hi uint64) {
		t.Helper()
		if got < lo || got > hi {
			t.Errorf("%s = %d, cpu.stat read around it says %d..%d", what, got, lo, hi)
		}
	}
	check := func(b map[string]uint64, c CgroupCPU, a map[string]uint64) {
		t.Helper()
		for _, k := range []string{"nr_periods", "nr_throttled", "throttled_usec", "usage_usec"} {
			if _, ok := b[k]; !ok {
				t.Fatalf("the kernel's cpu.stat has no %s: %v", k, b)
			}
		}
		if c.Version != 2 || c.Path != lim.Path || !c.Quota {
			t.Errorf("got version %d path %q quota %v, want 2 %q true", c.Version, c.Path, c.Quota, lim.Path)
		}
		between("periods", b["nr_periods"], c.Periods, a["nr_periods"])
		between("throttled", b["nr_throttled"], c.Throttled, a["nr_throttled"])
		between("throttled µs", b["throttled_usec"], uint64(c.ThrottledTime/time.Microsecond), a["throttled_usec"])
		between("usage µs", b["usage_usec"], uint64(c.Usage/time.Microsecond), a["usage_usec"])
	}

	time.Sleep(time.Second)
	b0, first, a0 := read(kp.Pid)
	check(b0, first, a0)
	t0 := time.Now()
	time.Sleep(2 * time.Second)
	b1, second, a1 := read(kp.Pid)
	check(b1, second, a1)
	el := time.Since(t0)
	d, ok := second.Sub(first)
	if !ok {
		t.Fatalf("counters went down: %+v then %+v", first, second)
	}
	share := float64(d.Throttled) / float64(max(d.Periods, 1))
	t.Logf("kube-proxy at 5%% over %v: %d of %d periods throttled (%.0f%%), stopped %v, ran %v; lifetime %+v",
		el.Round(time.Millisecond), d.Throttled, d.Periods, 100*share, d.ThrottledTime, d.Usage, second)
	// 100 ms periods: ~20 in 2 s (fewer if the guest's timers lag under
	// TCG); a process that always wants the CPU exhausts nearly every one.
	if d.Periods < 10 || d.Periods > uint64(el/(100*time.Millisecond))+2 {
		t.Errorf("%d periods in %v, want about one per 100 ms", d.Periods, el)
	}
	if d.Throttled == 0 || share < 0.8 {
		t.Errorf("throttled in %d of %d periods (%.0f%%), want nr_throttled rising in ≥ 80%% of them", d.Throttled, d.Periods, 100*share)
	}
	// Units: stopped for most of the wall time (≈ 95 ms of each 100 ms
	// period), running for about 5% of it; a µs/ns mix-up is 1000x off.
	// throttled_usec adds up the time each CPU's run queue of the group
	// was throttled: a process that moved between CPUs counts on more
	// than one (3.0 s in 2.0 s of wall time seen on the 2-CPU guest).
	if d.ThrottledTime < el/2 || d.ThrottledTime > el*time.Duration(runtime.NumCPU())+200*time.Millisecond {
		t.Errorf("throttled %v in %v of wall time on %d CPUs, want most of it (at most once per CPU)", d.ThrottledTime, el, runtime.NumCPU())
	}
	if d.Usage <= 0 || d.Usage > el*15/100+20*time.Millisecond {
		t.Errorf("ran %v in %v under a 5%% quota", d.Usage, el)
	}

	// Unlimited: spinning for as long, never throttled.
	c, err := r.CgroupCPU(ctx, int32(busy.Pid))
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("unlimited: %+v (%v since it started)", c, time.Since(start).Round(time.Millisecond))
	if c.Version != 2 || c.Path != free.Path || !c.Quota || c.Periods != 0 || c.Throttled != 0 || c.ThrottledTime != 0 {
		t.Errorf("unlimited group: %+v, want v2 %s with throttling counters at 0", c, free.Path)
	}
	if c.Usage < time.Since(start)/4 {
		t.Errorf("unlimited spinner ran only %v in %v", c.Usage, time.Since(start))
	}

	// Quota on the pod: the kernel counts periods only there, none in the
	// container's own cpu.stat; cpustat reads the pod's.
	own := podCtr.CPUStat(t)
	c, err = r.CgroupCPU(ctx, int32(inPod.Pid))
	if err != nil {
		t.Fatal(err)
	}
	pod := podLim.CPUStat(t)
	t.Logf("quota on the pod: %+v; container's own cpu.stat %v, pod's %v", c, own, pod)
	if own["nr_periods"] != 0 || own["nr_throttled"] != 0 {
		t.Errorf("the container's own cpu.stat counts periods under its pod's quota: %v", own)
	}
	if c.Path != podLim.Path || c.Throttled == 0 || c.Throttled > pod["nr_throttled"] ||
		float64(c.Throttled) < 0.7*float64(c.Periods) {
		t.Errorf("process limited by its pod's quota: %+v, want the pod's (%s) throttling, mostly throttled", c, podLim.Path)
	}

	// The same from a private cgroup namespace rooted at the daemon's
	// container: the process's path climbs out of it.
	err = vm.InCgroupNS(t, daemon, func() error {
		b, err := os.ReadFile(filepath.Join(procRoot, strconv.Itoa(kp.Pid), "cgroup"))
		if err != nil {
			return err
		}
		if want := "0::/../../../burstable/pod-kp/ctr-kp\n"; string(b) != want {
			t.Errorf("from the daemon's cgroup namespace /proc/%d/cgroup = %q, want %q", kp.Pid, b, want)
		}
		if b, _ := os.ReadFile(filepath.Join(procRoot, "1", "cgroup")); !strings.HasPrefix(string(b), "0::/../../../..") {
			t.Errorf("/proc/1/cgroup = %q, want four levels up", b)
		}
		b2, c, a2 := read(kp.Pid)
		check(b2, c, a2)
		if c.Throttled < second.Throttled {
			t.Errorf("from the private namespace: %+v, earlier %+v", c, second)
		}
		free, err := r.CgroupCPU(ctx, int32(busy.Pid))
		if err != nil {
			return err
		}
		if free.Path != "/kubepods/besteffort/pod-free/ctr-free" || free.Periods != 0 {
			t.Errorf("unlimited group from the private namespace: %+v", free)
		}
		if c, err := r.CgroupCPU(ctx, int32(inPod.Pid)); err != nil || c.Path != podLim.Path || c.Throttled == 0 {
			t.Errorf("quota on the pod, from the private namespace: %+v %v", c, err)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}
