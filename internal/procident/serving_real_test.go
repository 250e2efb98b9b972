//go:build linux

package procident_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/remediate-dev/remediate/internal/cluster"
	"github.com/remediate-dev/remediate/internal/procident"
	"github.com/remediate-dev/remediate/internal/procs"
	"github.com/remediate-dev/remediate/internal/sockdiag"
	"github.com/remediate-dev/remediate/internal/testing/controlplane"
	"github.com/remediate-dev/remediate/internal/testing/podcgroup"
)

// TestRealKubeProxyByItsPorts (issue 37 point 2), with the real
// kube-proxy v1.34.4 on a real apiserver in a network namespace the test
// made, its sockets dumped there through sock_diag and its cgroups the
// test's own (on the unified hierarchy):
//
//   - kube-proxy run as a host process of a systemd unit
//     (kube-proxy.service) beside a process also named kube-proxy that
//     serves nothing: by name both are host processes with CAP_NET_ADMIN
//     in the node's namespace (KubeProxy accepts both: which one is the
//     node's cannot be told); by its ports the real one is, with the
//     shape "systemd unit" and the advice to restart the unit;
//   - the same binary copied as k3s-server in a k3s.service cgroup beside
//     a containerd shim: it is the embedded proxy, its restart advice is
//     k3s's unit, and its real iptables command (waiting on the xtables
//     lock a flock holds) is its own while the flock is not; the name rule
//     the lock-holder ranking used (kube-proxy or a child of kube-proxy)
//     calls that command foreign.
func TestRealKubeProxyByItsPorts(t *testing.T) {
	cp := controlplane.Start(t, controlplane.Options{}) // skips without root or binaries
	tr := podcgroup.New(t, "kpports")
	tree, err := procs.NewCgroupTree("/sys/fs/cgroup")
	if err != nil {
		t.Skipf("no unified cgroup hierarchy: %v", err)
	}
	kp := cp.StartKubeProxy(controlplane.KubeProxyOptions{})
	kp.Stop(t) // its configuration, Node and PATH are reused below
	ctx := context.Background()
	nsPath := filepath.Join("/var/run/netns", cp.NetNS.Name)
	pr := procs.New("/proc")
	listening := procident.Listening{
		Sockets: func(ctx context.Context, ports ...uint16) ([]sockdiag.Listener, error) {
			return sockdiag.Listeners(ctx, sockdiag.Options{NetNS: nsPath}, ports...)
		},
		Cgroups: tree, Procs: pr,
	}
	ports := procident.PortsOf(kp.MetricsURL, kp.HealthzURL)
	// The namespace's key (Process.NetKey), from a process of its own.
	sleeper := controlplane.StartProcess(t, "sleep", t.TempDir(), cp.NetNS.Command("sleep", "3600"))
	nsKey := waitProc(t, pr, int32(sleeper.Pid()), "sleep").NetKey
	noPods := procident.PodsFrom(nil)

	// startIn runs bin (named by its path) with kube-proxy's flags, moved
	// by into to its cgroup before it execs, and waits until it serves
	// both ports; start moves it into a unit's cgroup.
	startIn := func(t *testing.T, name, bin string, into func(pid int)) *controlplane.Process {
		t.Helper()
		cmd := cp.NetNS.Command("sh", "-c", `read go; exec "$0" "$@"`, bin, "--config", kp.ConfigPath, "--v", "2")
		cmd.Env = kp.Env()
		in, err := cmd.StdinPipe()
		if err != nil {
			t.Fatal(err)
		}
		p := controlplane.StartProcess(t, name, t.TempDir(), cmd)
		into(p.Pid())
		fmt.Fprintln(in, "go")
		for deadline := time.Now().Add(2 * time.Minute); ; time.Sleep(250 * time.Millisecond) {
			ls, err := listening.Sockets(ctx, ports...)
			if err == nil && len(ls) == 2 {
				return p
			}
			if p.Exited() || time.Now().After(deadline) {
				t.Fatalf("%s never served ports %v (last %+v, %v); log:\n%s", name, ports, ls, err, readTail(p.LogPath))
			}
		}
	}
	start := func(t *testing.T, name, bin, unit string) *controlplane.Process {
		return startIn(t, name, bin, func(pid int) { tr.IntoUnit(t, unit, pid) })
	}

	t.Run("systemd unit beside an impostor", func(t *testing.T) {
		real := start(t, "kube-proxy-unit", filepath.Join(cp.BinDir, "kube-proxy"), "kube-proxy.service")
		defer real.Stop(t)
		impostor := copyOf(t, "/bin/sleep", "kube-proxy")
		imp := controlplane.StartProcess(t, "impostor", t.TempDir(), cp.NetNS.Command(impostor, "3600"))
		defer imp.Stop(t)
		waitProc(t, pr, int32(imp.Pid()), "kube-proxy")
		procs.ExpireCommScans()
		named, err := pr.Find(ctx, []string{"kube-proxy"})
		if err != nil {
			t.Fatal(err)
		}
		var byName []int32
		for _, p := range named {
			if p.NetKey == nsKey && procident.KubeProxy(p, noPods, nsKey).OK() {
				byName = append(byName, p.Pid)
			}
		}
		if !slices.Contains(byName, int32(real.Pid())) || !slices.Contains(byName, int32(imp.Pid())) {
			t.Fatalf("by name, this node's kube-proxy may be %v; want both pid %d (real) and %d (impostor): the gap the ports close", byName, real.Pid(), imp.Pid())
		}
		p, id, err := listening.KubeProxy(ctx, ports, noPods, nsKey)
		if err != nil || p.Pid != int32(real.Pid()) {
			t.Fatalf("by its ports: pid %d %s %v, want the real kube-proxy %d (impostor %d)", p.Pid, id, err, real.Pid(), imp.Pid())
		}
		if id.Shape() != procident.ShapeSystemdUnit || id.Unit != "kube-proxy.service" ||
			!strings.Contains(id.RestartHow(), "systemctl restart kube-proxy.service") || id.Served == nil ||
			!strings.HasSuffix(id.Served.Cgroup, "/kube-proxy.service") || !slices.Equal(id.Served.Ports, []uint16{10249, 10256}) {
			t.Fatalf("identity %s (shape %q, restart %q)", id, id.Shape(), id.RestartHow())
		}
		t.Logf("%s", id)
		withoutPtrace(t, nsPath, p.Pid, procident.ShapeSystemdUnit)
	})

	t.Run("renamed binary in a DaemonSet pod", func(t *testing.T) {
		const uid = "7a7a7a7a-1111-2222-3333-444444444444"
		bin := copyOf(t, filepath.Join(cp.BinDir, "kube-proxy"), "proxy-server")
		p := startIn(t, "proxy-server", bin, func(pid int) { tr.Into(t, uid, "", pid) })
		defer p.Stop(t)
		pods := procident.PodsFrom([]cluster.Pod{{Namespace: "kube-system", Name: "kube-proxy-n1", UID: uid,
			Labels: map[string]string{"k8s-app": "kube-proxy"}, ControllerKind: "DaemonSet", ControllerName: "kube-proxy"}})
		got, id, err := listening.KubeProxy(ctx, ports, pods, nsKey)
		if err != nil || got.Pid != int32(p.Pid()) || id.Method != procident.CgroupAPI || id.Shape() != procident.ShapeDaemonSetPod || id.Pod != "kube-system/kube-proxy-n1" {
			t.Fatalf("by its ports: pid %d %s %v, want proxy-server %d of kube-proxy's pod", got.Pid, id, err, p.Pid())
		}
		if named := procident.KubeProxy(got, pods, nsKey); named.OK() {
			t.Fatalf("by its executable's name %s is kube-proxy: %s", got.Exe, named)
		}
		t.Logf("%s", id)
	})

	t.Run("k3s-server and its restore", func(t *testing.T) {
		k3sBin := copyOf(t, filepath.Join(cp.BinDir, "kube-proxy"), "k3s-server")
		// A containerd shim in k3s's cgroup, as on a k3s node (started
		// first: the cgroup then holds two processes of no parent there).
		shimBin := copyOf(t, "/bin/sleep", "containerd-shim-runc-v2")
		shimCmd := cp.NetNS.Command("sh", "-c", `read go; exec "$0" "$@"`, shimBin, "3600")
		in, err := shimCmd.StdinPipe()
		if err != nil {
			t.Fatal(err)
		}
		shim := controlplane.StartProcess(t, "shim", t.TempDir(), shimCmd)
		defer shim.Stop(t)
		tr.IntoUnit(t, "k3s.service", shim.Pid())
		fmt.Fprintln(in, "go")
		k3s := start(t, "k3s-server", k3sBin, "k3s.service")
		defer k3s.Stop(t)
		p, id, err := listening.KubeProxy(ctx, ports, noPods, nsKey)
		if err != nil || p.Pid != int32(k3s.Pid()) {
			t.Fatalf("by its ports: pid %d %s %v, want k3s-server %d", p.Pid, id, err, k3s.Pid())
		}
		if id.Shape() != procident.ShapeEmbedded || !strings.Contains(id.RestartHow(), "systemctl restart k3s.service") {
			t.Fatalf("identity %s (shape %q, restart %q), want embedded", id, id.Shape(), id.RestartHow())
		}
		t.Logf("%s", id)
		withoutPtrace(t, nsPath, p.Pid, procident.ShapeEmbedded)

		// Its iptables-restore, stalled behind a held xtables lock.
		holder := controlplane.HoldLock(t, kp.XtablesLock)
		defer holder.Release(t)
		svc := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "kpports", Namespace: "default"},
			Spec: corev1.ServiceSpec{Ports: []corev1.ServicePort{{Port: 80, Protocol: corev1.ProtocolTCP}}}}
		cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		if _, err := cp.Client.CoreV1().Services("default").Create(cctx, svc, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		// kube-proxy waits for the lock 5 s per command (-w 5), polling
		// with LOCK_NB: its command is found as its child, the flock as
		// the holder. With the lock held its sync stops at the iptables -N
		// of its chains, before its iptables-restore: any of them counts.
		var restore, flock procs.Process
		for deadline := time.Now().Add(90 * time.Second); restore.Pid == 0; time.Sleep(100 * time.Millisecond) {
			procs.ExpireCommScans()
			rs, err := pr.Find(ctx, []string{"iptables", "ip6tables", "iptables-restore", "ip6tables-restore"})
			if err != nil {
				t.Fatal(err)
			}
			for _, r := range rs {
				if r.PPid == p.Pid {
					restore = r
				}
			}
			if time.Now().After(deadline) {
				t.Fatalf("no iptables command of k3s-server (pid %d) seen in 90 s", p.Pid)
			}
		}
		l, err := pr.FileLocks(ctx, kp.XtablesLock)
		if err != nil || len(l.Holders) != 1 || l.Holders[0].Pid != int32(holder.Pid()) {
			t.Fatalf("the lock's holders: %+v %v, want the flock %d", l, err, holder.Pid())
		}
		flock = l.Holders[0]
		oldRule := restore.Name() == "kube-proxy" || restore.ParentName == "kube-proxy"
		if oldRule || !procident.OwnProcess(restore, p) {
			t.Fatalf("%s (pid %d, parent %q): by name kube-proxy's %v, OwnProcess %v; want false then true", restore.Name(), restore.Pid, restore.ParentName, oldRule, procident.OwnProcess(restore, p))
		}
		if flock.Pid == 0 || procident.OwnProcess(flock, p) {
			t.Fatalf("the flock holding the lock (%+v) is k3s-server's own", flock)
		}
		t.Logf("%s (pid %d, parent %s) is the proxy's own; %s (pid %d) is not", restore.Name(), restore.Pid, restore.ParentName, flock.Name(), flock.Pid)
	})
}

const envNoPtrace = "REMEDIATE_TEST_KP_PORTS_CHILD"

// withoutPtrace re-runs TestRealKubeProxyByItsPortsWithoutPtrace as the
// chart's default pod runs: in the namespace's network namespace (its
// "host network", joined with nsenter so that /sys/fs/cgroup stays
// mounted), uid 0 with only CAP_NET_ADMIN, CAP_NET_RAW and CAP_KILL
// (setpriv): no CAP_SYS_PTRACE, no CAP_SYS_ADMIN. It must find pid by its
// ports from its own namespace, by the socket's cgroup alone.
func withoutPtrace(t *testing.T, nsPath string, pid int32, shape procident.Shape) {
	t.Helper()
	if _, err := exec.LookPath("setpriv"); err != nil {
		t.Skip("no setpriv")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "nsenter", "--net="+nsPath, "--", "setpriv", "--inh-caps=-all", "--bounding-set=-all,+net_admin,+net_raw,+kill", "--ambient-caps=-all", "--",
		os.Args[0], "-test.run", "^TestRealKubeProxyByItsPortsWithoutPtrace$", "-test.count=1", "-test.v")
	cmd.Env = append(os.Environ(), envNoPtrace+"=1", fmt.Sprintf("T_PID=%d", pid), "T_SHAPE="+string(shape))
	out, err := cmd.CombinedOutput()
	if err != nil || !strings.Contains(string(out), "--- PASS") {
		t.Fatalf("without CAP_SYS_PTRACE: %v\n%s", err, out)
	}
	for _, line := range strings.Split(string(out), "\n") {
		if strings.Contains(line, "without ptrace:") {
			t.Log(strings.TrimSpace(line))
		}
	}
}

// TestRealKubeProxyByItsPortsWithoutPtrace is the child of withoutPtrace
// (skipped otherwise).
func TestRealKubeProxyByItsPortsWithoutPtrace(t *testing.T) {
	if os.Getenv(envNoPtrace) != "1" {
		t.Skip("run by TestRealKubeProxyByItsPorts under setpriv")
	}
	var pid int32
	fmt.Sscan(os.Getenv("T_PID"), &pid)
	pr := procs.New("/proc")
	ctx := context.Background()
	if _, err := pr.OwnsListener(ctx, pid, 10249); !errors.Is(err, procs.ErrNoPtrace) {
		t.Fatalf("pid %d's descriptors are readable (%v): not the default pod's privileges", pid, err)
	}
	l, err := procident.NewListening("/sys/fs/cgroup", pr)
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	p, id, err := l.KubeProxy(ctx, []uint16{10249, 10256}, procident.PodsFrom(nil), pr.SelfNetKey())
	took := time.Since(start)
	if err != nil || p.Pid != pid || string(id.Shape()) != os.Getenv("T_SHAPE") || id.Served == nil || id.Served.ByDescriptor {
		t.Fatalf("pid %d %s %v; want pid %d, shape %s, by the socket's cgroup", p.Pid, id, err, pid, os.Getenv("T_SHAPE"))
	}
	t.Logf("without ptrace: %s (in %s)", id, took.Round(time.Microsecond))
}

// waitProc waits until pid shows under the name.
func waitProc(t *testing.T, pr *procs.Real, pid int32, name string) procs.Process {
	t.Helper()
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		p, err := pr.Get(context.Background(), pid)
		if err == nil && p.Name() == name && p.NetKey != 0 {
			return p
		}
		if time.Now().After(deadline) {
			t.Fatalf("pid %d never showed as %s: %+v %v", pid, name, p, err)
		}
	}
}

// copyOf copies the executable src to a temporary file named name.
func copyOf(t *testing.T, src, name string) string {
	t.Helper()
	b, err := os.ReadFile(src)
	if err != nil {
		t.Fatal(err)
	}
	dst := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(dst, b, 0o755); err != nil {
		t.Fatal(err)
	}
	return dst
}

func readTail(path string) string {
	f, err := os.Open(path)
	if err != nil {
		return err.Error()
	}
	defer f.Close()
	b, _ := io.ReadAll(f)
	if len(b) > 3000 {
		b = b[len(b)-3000:]
	}
	return string(b)
}
