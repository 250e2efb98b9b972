//go:build linux

package detect

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/remediate-dev/remediate/internal/finding"
	"github.com/remediate-dev/remediate/internal/netnstest"
	"github.com/remediate-dev/remediate/internal/node"
	"github.com/remediate-dev/remediate/internal/procs"
	"go.uber.org/zap"
	clocktesting "k8s.io/utils/clock/testing"
)

// TestRealKubeProxyOfAnotherNetNS (issue 27, item 9), with real processes
// in real network namespaces: a kube-proxy executable running in another
// network namespace (a nested cluster's, kind's) while none runs in this
// node's made kube-proxy "present", so both refusing endpoints were two
// critical KubeProxyUnreachable findings, and IPTablesVersionSkew took it
// for this node's. Now it is not this node's kube-proxy: the checks skip
// saying so. The same executable started in this node's namespace is
// this node's kube-proxy (its refusals are findings).
func TestRealKubeProxyOfAnotherNetNS(t *testing.T) {
	ns := netnstest.New(t) // skips when not root
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
	pr := procs.New("/proc")
	ctx := context.Background()
	// waitExec waits for pid to show as kube-proxy with its executable.
	waitExec := func(pid int) procs.Process {
		t.Helper()
		for deadline := time.Now().Add(20 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
			procs.ExpireCommScans()
			ps, err := pr.Find(ctx, []string{"kube-proxy"})
			if err != nil {
				t.Fatal(err)
			}
			for _, p := range ps {
				if p.Pid == int32(pid) && p.Exe == kpBin && p.NetNS != "" {
					return p
				}
			}
		}
		t.Fatalf("pid %d never showed as %s", pid, kpBin)
		return procs.Process{}
	}
	elsewhere := netnstest.Cmd(ns, "", kpBin, "600")
	netnstest.StartGroup(t, elsewhere)
	p := waitExec(elsewhere.Process.Pid)
	if p.NetNS == pr.SelfNetNS() {
		t.Fatalf("the namespace's process shows this node's network namespace %s", p.NetNS)
	}

	c, addr := refusingKubeProxy(t)
	n := &node.Node{Clock: clocktesting.NewFakeClock(captureHealthy), Log: zap.NewNop(), KubeProxy: c, ProcRoot: "/proc", Procs: pr}
	if kp, _, err := findKubeProxy(ctx, n); err == nil {
		t.Skipf("a kube-proxy of this node runs on this machine (pid %d): cannot test its absence", kp.Pid)
	} else if !errors.Is(err, errNoNodeKubeProxy) || !strings.Contains(err.Error(), "runs in another network namespace") {
		t.Fatalf("findKubeProxy with kube-proxy only in %s: %v, want none of this node's", ns, err)
	}
	fs, err := newDetector(t, "KubeProxyUnreachable", n, nil).Detect(ctx)
	if r, ok := finding.IsSkip(err); !ok || !strings.Contains(r, "kube-proxy is not running on this node") || !strings.Contains(r, addr) {
		t.Fatalf("kube-proxy only in another network namespace: findings %+v, %v; want a skip", fs, err)
	}

	here := exec.Command(kpBin, "600")
	netnstest.StartGroup(t, here)
	waitExec(here.Process.Pid)
	kp, _, err := findKubeProxy(ctx, n)
	if err != nil || kp.Pid != int32(here.Process.Pid) {
		t.Fatalf("findKubeProxy with one in this node's namespace: %+v, %v; want pid %d", kp, err, here.Process.Pid)
	}
	fs, err = newDetector(t, "KubeProxyUnreachable", n, nil).Detect(ctx)
	wantTargets(t, "this node's kube-proxy, refusing", fs, err, "kube-proxy/healthz", "kube-proxy/metrics")
}
