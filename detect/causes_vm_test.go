//go:build linux

package detect

import (
	"context"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"
	"k8s.io/utils/clock"

	"github.com/remediate-dev/remediate/internal/causes"
	"github.com/remediate-dev/remediate/internal/cluster"
	"github.com/remediate-dev/remediate/internal/cluster/clustertest"
	"github.com/remediate-dev/remediate/internal/cpustat"
	"github.com/remediate-dev/remediate/internal/finding"
	"github.com/remediate-dev/remediate/internal/kubeproxy"
	"github.com/remediate-dev/remediate/internal/node"
	"github.com/remediate-dev/remediate/internal/procs"
	"github.com/remediate-dev/remediate/internal/testing/vm"
)

// TestVMCgroupV2ThrottlingCause runs only inside the test VM (make
// test-vm): a slow-sync finding ranks CPU throttling first when the
// process named kube-proxy (a CPU-bound stand-in, found by the real procs
// adapter) is in a cgroup v2 group limited to 5% of a CPU, with the
// figures the real cpustat adapter reads from the kernel's cpu.stat
// through DaemonSet-like roots. kube-proxy's metrics (the slow syncs, a
// 12k-rule nat table, no endpoint churn) come from the fake.
func TestVMCgroupV2ThrottlingCause(t *testing.T) {
	vm.RequireGuest(t)
	vm.Cgroup2(t)
	// kube-proxy's container cgroup as the kubelet's cgroupfs driver names
	// it, and its pod in the (fake) API view: the daemon tells kube-proxy
	// by its cgroup and the API (issue 41).
	const kpUID = "7a1b2c3d-0000-4000-8000-0000000000c3"
	cg := vm.NewCgroup(t, "/kubepods/burstable/pod"+kpUID+"/"+strings.Repeat("c3", 32), "5000 100000")
	p := cg.Spin(t, "kube-proxy")
	procRoot, cgroupRoot := vm.HostRoots(t)
	clk := clock.RealClock{}
	kp := kubeproxy.NewFake(clk, 10*time.Second)
	pv := clustertest.NewPods(time.Now())
	pv.Set(cluster.Pod{Namespace: "kube-system", Name: "kube-proxy-vm", UID: kpUID, Labels: map[string]string{"k8s-app": "kube-proxy"},
		ControllerKind: "DaemonSet", ControllerName: "kube-proxy"})
	n := &node.Node{Name: "vm", ProcRoot: procRoot, Clock: clk, Log: zap.NewNop(), KubeProxy: kp, Pods: pv,
		Procs: onlyPID{procs.New(procRoot), int32(p.Pid)}, CPU: cpustat.New(cpustat.Config{ProcRoot: procRoot, CgroupRoot: cgroupRoot}),
		XtablesLock: "/run/xtables.lock"}
	d := newDetector(t, "KubeProxySyncSlow", n, func(p any) { p.(*KubeProxySyncSlowParams).Window.Duration = time.Minute })
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	detect := func() (finding.Finding, *causes.Cause, []causes.Cause) {
		t.Helper()
		fs, err := d.Detect(ctx)
		if err != nil || len(fs) != 1 {
			t.Fatalf("slow syncs: %v %v", fs, err)
		}
		likely, _ := fs[0].Evidence[causes.EvidenceLikely].([]causes.Cause)
		ruled, _ := fs[0].Evidence[causes.EvidenceRuledOut].([]causes.Cause)
		for _, c := range append(likely, ruled...) {
			if c.Kind == causes.CPUThrottling {
				return fs[0], &c, likely
			}
		}
		t.Fatalf("no throttling cause: %+v", fs[0].Evidence)
		return finding.Finding{}, nil, nil
	}

	kp.SetMetrics(slowMetrics(100, 0, 10))
	if fs, err := d.Detect(ctx); err != nil || len(fs) != 0 {
		t.Fatalf("first scrape: %v %v", fs, err)
	}
	time.Sleep(1500 * time.Millisecond)
	kp.SetMetrics(slowMetrics(110, 10, 10))
	_, thr, _ := detect()
	t.Logf("first finding: %s", thr.Summary)
	if !strings.Contains(thr.Summary, "since its cgroup started") || figure(thr, "throttledPeriods") <= 0 {
		t.Errorf("first look: %+v, want the cgroup's totals, throttled", thr)
	}

	// Next cycle: the figures over the window, against the kernel's.
	before := cg.CPUStat(t)
	time.Sleep(2 * time.Second)
	kp.SetMetrics(slowMetrics(120, 20, 10))
	f, thr, likely := detect()
	after := cg.CPUStat(t)
	t.Logf("top cause: %s", f.Evidence[causes.EvidenceTop])
	if len(likely) == 0 || likely[0].Kind != causes.CPUThrottling {
		t.Errorf("top cause %v, want cpu-throttling (likely %+v)", f.Evidence[causes.EvidenceTop], likely)
	}
	if !strings.Contains(thr.Summary, "over the last") || !strings.Contains(thr.Summary, "cgroup "+cg.Path) {
		t.Errorf("throttling %q: want the window's figures for cgroup %s", thr.Summary, cg.Path)
	}
	share, throttled, periods := figure(thr, "throttledShare"), figure(thr, "throttledPeriods"), figure(thr, "periods")
	kThrottled, kPeriods := float64(after["nr_throttled"]-before["nr_throttled"]), float64(after["nr_periods"]-before["nr_periods"])
	// The detector's two samples are taken just before the test's two
	// reads: the counts agree within a period at each end.
	if share < 0.8 || periods < 10 || abs(periods-kPeriods) > 2 || abs(throttled-kThrottled) > 2 {
		t.Errorf("throttling figures: share %.2f, %v of %v periods; the kernel's cpu.stat counted %v of %v over the cycle",
			share, throttled, periods, kThrottled, kPeriods)
	}
}

func abs(x float64) float64 { return max(x, -x) }
