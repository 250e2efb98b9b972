//go:build linux

package detect

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

	"go.uber.org/zap"
	"k8s.io/utils/clock"

	"github.com/remediate-dev/remediate/internal/cluster"
	"github.com/remediate-dev/remediate/internal/cluster/clustertest"
	"github.com/remediate-dev/remediate/internal/netnstest"
	"github.com/remediate-dev/remediate/internal/node"
	"github.com/remediate-dev/remediate/internal/procident"
	"github.com/remediate-dev/remediate/internal/procs"
	"github.com/remediate-dev/remediate/internal/testing/podcgroup"
	"github.com/remediate-dev/remediate/internal/testing/setpriv"
)

// TestRealKubeProxyByCgroupWithoutPtrace (issue 41): three real processes
// named kube-proxy (copies of sleep) on this machine, in this node's
// network namespace: one in a cgroup named as the kubelet names the
// kube-proxy DaemonSet pod's container, one in a user pod's cgroup (an
// impostor, whatever its executable), one a host process (another test's
// cluster). With exactly the default capabilities (no SYS_PTRACE: no
// executable is readable) findKubeProxy takes the one in kube-proxy's
// pod's cgroup, by cgroup+api, instead of refusing as ambiguous; with the
// kube-proxy pod gone from the API it refuses the impostor and, the host
// one being the only candidate left, takes it (host-cgroup). On main
// findKubeProxy without SYS_PTRACE refused ("needs CAP_SYS_PTRACE").
func TestRealKubeProxyByCgroupWithoutPtrace(t *testing.T) {
	kpUID, userUID := "7a1b2c3d-0000-4000-8000-0000000000a1", "7a1b2c3d-0000-4000-8000-0000000000b2"
	kpPod := cluster.Pod{Namespace: "kube-system", Name: "kube-proxy-x", UID: kpUID, Labels: map[string]string{"k8s-app": "kube-proxy"},
		ControllerKind: "DaemonSet", ControllerName: "kube-proxy"}
	userPod := cluster.Pod{Namespace: "default", Name: "impostor", UID: userUID, ControllerKind: "ReplicaSet", ControllerName: "impostor-1"}
	if setpriv.Child() {
		ctx := context.Background()
		pv := clustertest.NewPods(time.Now())
		pv.Set(kpPod, userPod)
		n := &node.Node{ProcRoot: "/proc", Clock: clock.RealClock{}, Log: zap.NewNop(), Procs: procs.New("/proc"), Pods: pv}
		want := func(name string) int32 {
			v, _ := strconv.Atoi(os.Getenv(name))
			return int32(v)
		}
		p, id, err := findAmongTests(ctx, n, want("T_KP"), want("T_HOST"), want("T_IMPOSTOR"))
		if err != nil || p.Pid != want("T_KP") || id.Method != procident.CgroupAPI || id.Pod != "kube-system/kube-proxy-x" || p.Exe != "" {
			t.Fatalf("with the API's kube-proxy pod: %+v %s %v; want pid %s by cgroup+api, no executable read", p, id, err, os.Getenv("T_KP"))
		}
		t.Logf("kube-proxy: pid %d, identity %s", p.Pid, id)
		pv.Delete("kube-system", "kube-proxy-x")
		p, id, err = findAmongTests(ctx, n, want("T_KP"), want("T_HOST"), want("T_IMPOSTOR"))
		if err != nil || p.Pid != want("T_HOST") || id.Method != procident.HostCgroup {
			t.Fatalf("without a kube-proxy pod: %+v %s %v; want the host one (pid %s)", p, id, err, os.Getenv("T_HOST"))
		}
		return
	}
	setpriv.Available(t)
	sleep, err := exec.LookPath("sleep")
	if err != nil {
		t.Skip("needs sleep")
	}
	b, err := os.ReadFile(sleep)
	if err != nil {
		t.Fatal(err)
	}
	kpBin := filepath.Join(t.TempDir(), "kube-proxy")
	if err := os.WriteFile(kpBin, b, 0o755); err != nil {
		t.Fatal(err)
	}
	cg := podcgroup.New(t, "test")
	start := func() *exec.Cmd {
		c := exec.Command(kpBin, "600")
		netnstest.StartGroup(t, c)
		return c
	}
	kp, impostor, host := start(), start(), start()
	cg.Into(t, kpUID, "", kp.Process.Pid)
	cg.Into(t, userUID, "", impostor.Process.Pid)
	pr := procs.New("/proc")
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		procs.ExpireCommScans()
		ps, _ := pr.Find(context.Background(), []string{"kube-proxy"})
		seen := 0
		for _, p := range ps {
			if p.Pid == int32(kp.Process.Pid) || p.Pid == int32(impostor.Process.Pid) || p.Pid == int32(host.Process.Pid) {
				seen++
			}
		}
		if seen == 3 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the three kube-proxies never showed")
		}
	}
	out := setpriv.Run(t, setpriv.DefaultCaps, fmt.Sprintf("T_KP=%d", kp.Process.Pid), fmt.Sprintf("T_HOST=%d", host.Process.Pid), fmt.Sprintf("T_IMPOSTOR=%d", impostor.Process.Pid))
	for _, l := range strings.Split(out, "\n") {
		if strings.Contains(l, "kube-proxy: pid") {
			t.Log(strings.TrimSpace(l))
		}
	}
}

// TestRealKubeProxyShapesWithoutPtrace (issue 37): kube-proxy outside a
// DaemonSet pod, on this machine's kernel, with the chart's default
// capabilities (no SYS_PTRACE): a copy of sleep named k3s-server in a
// cgroup named as systemd names k3s's unit is this node's kube-proxy,
// embedded in k3s (its restart: k3s's unit); then, k3s gone, a kube-proxy
// in a kube-proxy.service cgroup is, as a systemd unit. On main no
// process but one named kube-proxy was looked for, and the unit was not
// read.
func TestRealKubeProxyShapesWithoutPtrace(t *testing.T) {
	if setpriv.Child() {
		n := &node.Node{ProcRoot: "/proc", Clock: clock.RealClock{}, Log: zap.NewNop(), Procs: procs.New("/proc"), Pods: clustertest.NewPods(time.Now())}
		want, _ := strconv.Atoi(os.Getenv("T_PID"))
		p, id, err := findAmongTests(context.Background(), n, int32(want))
		if err != nil || p.Pid != int32(want) || string(id.Shape()) != os.Getenv("T_SHAPE") || id.Unit != os.Getenv("T_UNIT") || !strings.Contains(id.RestartHow(), "systemctl restart "+os.Getenv("T_UNIT")) {
			t.Fatalf("got pid %d %+v (%s) %v; want pid %d, %s of %s", p.Pid, id, id.Shape(), err, want, os.Getenv("T_SHAPE"), os.Getenv("T_UNIT"))
		}
		t.Logf("kube-proxy: pid %d, %s; restart: %s", p.Pid, id, id.RestartHow())
		return
	}
	setpriv.Available(t)
	sleep, err := exec.LookPath("sleep")
	if err != nil {
		t.Skip("needs sleep")
	}
	b, err := os.ReadFile(sleep)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	start := func(name string) *exec.Cmd {
		bin := filepath.Join(dir, name)
		if err := os.WriteFile(bin, b, 0o755); err != nil {
			t.Fatal(err)
		}
		c := exec.Command(bin, "600")
		netnstest.StartGroup(t, c)
		return c
	}
	cg := podcgroup.New(t, "shape")
	k3s := start("k3s-server")
	cg.IntoUnit(t, "k3s.service", k3s.Process.Pid)
	log := func(out string) {
		for _, l := range strings.Split(out, "\n") {
			if strings.Contains(l, "kube-proxy: pid") {
				t.Log(strings.TrimSpace(l))
			}
		}
	}
	log(setpriv.Run(t, setpriv.DefaultCaps, fmt.Sprintf("T_PID=%d", k3s.Process.Pid), "T_SHAPE=embedded", "T_UNIT=k3s.service"))
	_ = k3s.Process.Kill()
	_, _ = k3s.Process.Wait()
	kp := start("kube-proxy")
	cg.IntoUnit(t, "kube-proxy.service", kp.Process.Pid)
	log(setpriv.Run(t, setpriv.DefaultCaps, fmt.Sprintf("T_PID=%d", kp.Process.Pid), "T_SHAPE=systemd unit", "T_UNIT=kube-proxy.service"))
}

// findAmongTests is findKubeProxy over the real process table
// (the real Find, by every name kube-proxy runs under, the real cgroups)
// with the candidates narrowed to this test's processes: other packages'
// tests, run in parallel, start host processes named kube-proxy that are
// as much "this node's" as the test's own.
func findAmongTests(ctx context.Context, n *node.Node, pids ...int32) (procs.Process, procident.Identity, error) {
	ps, err := n.Procs.Find(ctx, kubeProxyPrograms)
	if err != nil {
		return procs.Process{}, procident.Identity{}, err
	}
	var mine []procs.Process
	for _, p := range ps {
		if slices.Contains(pids, p.Pid) {
			mine = append(mine, p)
		}
	}
	return pickKubeProxy(mine, procident.PodsOf(n.Pods, n.Clock.Now()), n.Procs.SelfNetKey())
}
