package action

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/zap/zaptest"
	"k8s.io/utils/clock"

	"github.com/remediate-dev/remediate/detect"
	"github.com/remediate-dev/remediate/internal/finding"
	"github.com/remediate-dev/remediate/internal/netnstest"
	"github.com/remediate-dev/remediate/internal/node"
	"github.com/remediate-dev/remediate/internal/procs"
	"github.com/remediate-dev/remediate/policy"
)

// TestRealStuckNFTChildOfKubeProxy runs, on the real kernel, a process whose
// executable is kube-proxy (a Go program built as k8s.io/kubernetes/cmd/kube-proxy) with a child whose
// argv[0] is .../nft (a symlink to sleep), and another "nft" whose parent
// is not kube-proxy. HungNFT reports only the first; KillProcess with its
// defaults refuses the second (wrong parent) and kills the first.
func TestRealStuckNFTChildOfKubeProxy(t *testing.T) {
	netnstest.NeedRoot(t, "signals real processes")
	sleepBin := "/bin/sleep"
	if _, err := os.Stat(sleepBin); err != nil {
		t.Skip("needs /bin/sleep")
	}
	dir := t.TempDir()
	nft := filepath.Join(dir, "nft")
	// A copy, not a symlink: KillProcess checks the executable's name
	// (/proc/PID/exe), which a symlink would resolve to sleep.
	bin, err := os.ReadFile(sleepBin)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(nft, bin, 0o755); err != nil {
		t.Fatal(err)
	}
	// kube-proxy must be a real one (its Go build information names
	// kube-proxy's main package): a stand-in built so.
	kp := buildKubeProxyStandIn(t)
	other := filepath.Join(dir, "admin-shell")
	if err := os.WriteFile(other, []byte("#!/bin/sh\n\""+nft+"\" 300 &\necho $! > \""+dir+"/other.pid\"\nwait\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	netnstest.StartGroup(t, exec.Command(kp, filepath.Join(dir, "child.pid"), nft, "300"))
	netnstest.StartGroup(t, exec.Command(other))
	readPID := func(name string) int32 {
		var pid int32
		eventually(t, name, 10*time.Second, func() bool {
			b, err := os.ReadFile(filepath.Join(dir, name))
			if err != nil || len(strings.TrimSpace(string(b))) == 0 {
				return false
			}
			var p int
			for _, c := range strings.TrimSpace(string(b)) {
				p = p*10 + int(c-'0')
			}
			pid = int32(p)
			return true
		})
		return pid
	}
	child, adminNFT := readPID("child.pid"), readPID("other.pid")

	ctx := context.Background()
	pr := procs.New("/proc")
	n := &node.Node{Name: "test", ProcRoot: "/proc", Clock: clock.RealClock{}, Log: zaptest.NewLogger(t), Procs: pr}
	hung := detector(t, "HungNFT", n, func(p any) { p.(*detect.HungNFTParams).MinAge = policy.D(300 * time.Millisecond) })
	var mine finding.Finding
	eventually(t, "the stuck nft of kube-proxy to be reported", 10*time.Second, func() bool {
		fs, err := hung.Detect(ctx)
		if err != nil {
			t.Fatal(err)
		}
		for _, f := range fs {
			switch f.Evidence["pid"] {
			case child:
				mine = f
			case adminNFT:
				t.Fatalf("the nft of a non-kube-proxy parent was reported: %+v", f)
			}
		}
		return mine.Target != ""
	})
	if mine.Evidence["parentName"] != "kube-proxy" {
		t.Errorf("evidence %v", mine.Evidence)
	}

	a := newKillReal(t, n)
	adminProc, err := pr.Get(ctx, adminNFT)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := a.Execute(ctx, finding.Finding{Detector: "HungNFT", Target: procs.Target(adminNFT, adminProc.CreateTimeMs),
		Subject: finding.Subject{Kind: finding.KindProcess, Process: &finding.Process{ProgressChecked: true, CPUTicks: adminProc.CPUTicks}}}); err == nil {
		t.Fatal("KillProcess signalled an nft whose parent is not kube-proxy")
	} else if r, ok := finding.IsSkip(err); !ok || !strings.Contains(r, "has parent") {
		t.Fatalf("refusal: %v", err)
	}
	if alive, err := procs.Alive(ctx, pr, adminNFT, adminProc.CreateTimeMs); err != nil || !alive {
		t.Fatalf("the administrator's nft is gone: %v", err)
	}
	if _, err := a.Execute(ctx, mine); err != nil {
		t.Fatalf("kill kube-proxy's nft: %v", err)
	}
	ct := mine.Evidence["createTimeMs"].(int64)
	eventually(t, "kube-proxy's nft to be gone", 10*time.Second, func() bool {
		alive, err := procs.Alive(ctx, pr, child, ct)
		return err == nil && !alive
	})
}

func newKillReal(t *testing.T, n *node.Node) Action {
	t.Helper()
	ty, _ := Lookup("KillProcess")
	p := ty.NewParams().(*KillProcessParams)
	p.GracePeriod, p.KillWait = policy.D(time.Second), policy.D(2*time.Second)
	a, err := ty.New(p, n)
	if err != nil {
		t.Fatal(err)
	}
	return a
}

// buildKubeProxyStandIn builds, once per test binary run, a Go program
// whose build information names kube-proxy's main package
// (k8s.io/kubernetes/cmd/kube-proxy) and that does what matters here: it
// starts a child (`kube-proxy PIDFILE PROGRAM ARGS...`), writes the child's
// PID to PIDFILE and waits for it. It is as real a kube-proxy as
// KillProcess can tell one from the outside.
func buildKubeProxyStandIn(t *testing.T) string {
	t.Helper()
	standInOnce.Do(func() {
		goBin, err := exec.LookPath("go")
		if err != nil {
			standInErr = err
			return
		}
		src, err := os.MkdirTemp("", "remediate-kp-standin-")
		if err != nil {
			standInErr = err
			return
		}
		defer os.RemoveAll(src)
		main := `package main

import (
	"os"
	"os/exec"
	"strconv"
)

func main() {
	c := exec.Command(os.Args[2], os.Args[3:]...)
	if err := c.Start(); err != nil {
		os.Exit(2)
	}
	_ = os.WriteFile(os.Args[1], []byte(strconv.Itoa(c.Process.Pid)), 0o644)
	_ = c.Wait()
}
`
		if err := os.MkdirAll(filepath.Join(src, "cmd", "kube-proxy"), 0o755); err == nil {
			err = os.WriteFile(filepath.Join(src, "go.mod"), []byte("module k8s.io/kubernetes\n\ngo 1.22\n"), 0o644)
			if err == nil {
				err = os.WriteFile(filepath.Join(src, "cmd", "kube-proxy", "main.go"), []byte(main), 0o644)
			}
			if err != nil {
				standInErr = err
				return
			}
		}
		out, err := os.MkdirTemp("", "remediate-kp-bin-")
		if err != nil {
			standInErr = err
			return
		}
		standInPath = filepath.Join(out, "kube-proxy")
		cmd := exec.Command(goBin, "build", "-o", standInPath, "./cmd/kube-proxy")
		cmd.Dir = src
		cmd.Env = append(os.Environ(), "GOWORK=off", "GOFLAGS=-mod=mod", "GOTOOLCHAIN=local", "CGO_ENABLED=0")
		if b, err := cmd.CombinedOutput(); err != nil {
			standInErr = fmt.Errorf("go build: %v\n%s", err, b)
		}
	})
	if standInErr != nil {
		t.Fatalf("building the kube-proxy stand-in: %v", standInErr)
	}
	return standInPath
}

var (
	standInOnce sync.Once
	standInPath string
	standInErr  error
)

// TestRealImpostorKubeProxyNFTIsNotKilled (issue 27 item 1): a copy of
// bash named kube-proxy runs the real nft, stuck opening a FIFO. HungNFT
// reports it by the parent's name, but KillProcess checks the parent as it
// checks a target and refuses, saying why; the nft lives. The same nft
// under a real kube-proxy (the stand-in) is killed.
func TestRealImpostorKubeProxyNFTIsNotKilled(t *testing.T) {
	netnstest.NeedRoot(t, "runs nft with CAP_NET_ADMIN and signals real processes")
	netnstest.NeedCommands(t, "nft", "bash", "mkfifo")
	dir := t.TempDir()
	bash, err := os.ReadFile("/bin/bash")
	if err != nil {
		t.Skip("needs /bin/bash")
	}
	impostor := filepath.Join(dir, "kube-proxy")
	if err := os.WriteFile(impostor, bash, 0o755); err != nil {
		t.Fatal(err)
	}
	nftPath, _ := exec.LookPath("nft")
	fifo := func(name string) string {
		p := filepath.Join(dir, name)
		if out, err := exec.Command("mkfifo", p).CombinedOutput(); err != nil {
			t.Fatalf("mkfifo: %v %s", err, out)
		}
		return p
	}
	// "; true": bash must fork nft, not exec it in its place.
	fake := exec.Command(impostor, "-c", nftPath+" -f "+fifo("fifo1")+"; true")
	netnstest.StartGroup(t, fake)
	realKP := buildKubeProxyStandIn(t)
	netnstest.StartGroup(t, exec.Command(realKP, filepath.Join(dir, "real.pid"), nftPath, "-f", fifo("fifo2")))

	ctx := context.Background()
	pr := procs.New("/proc")
	n := &node.Node{Name: "test", ProcRoot: "/proc", Clock: clock.RealClock{}, Log: zaptest.NewLogger(t), Procs: pr}
	hung := detector(t, "HungNFT", n, func(p any) { p.(*detect.HungNFTParams).MinAge = policy.D(300 * time.Millisecond) })
	var underImpostor, underReal finding.Finding
	eventually(t, "both stuck nfts to be reported", 20*time.Second, func() bool {
		fs, err := hung.Detect(ctx)
		if err != nil {
			t.Fatal(err)
		}
		for _, f := range fs {
			switch f.Evidence["ppid"] {
			case int32(fake.Process.Pid):
				underImpostor = f
			}
			if b, err := os.ReadFile(filepath.Join(dir, "real.pid")); err == nil && fmt.Sprint(f.Evidence["pid"]) == strings.TrimSpace(string(b)) {
				underReal = f
			}
		}
		return underImpostor.Target != "" && underReal.Target != ""
	})
	a := newKillReal(t, n)
	ref, err := procs.ParseRef(underImpostor.Target)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := a.Plan(ctx, underImpostor); err == nil {
		t.Fatal("KillProcess planned to kill the nft of a bash named kube-proxy")
	}
	_, err = a.Execute(ctx, underImpostor)
	if r, ok := finding.IsSkip(err); !ok || !strings.Contains(r, `is not a real kube-proxy`) || !strings.Contains(r, "not the Go program k8s.io/kubernetes/cmd/kube-proxy") {
		t.Fatalf("the impostor's nft: %v, want a refusal saying the parent is not a real kube-proxy", err)
	}
	if alive, err := procs.Alive(ctx, pr, ref.Pid, ref.CreateTimeMs); err != nil || !alive {
		t.Fatalf("the impostor's nft was killed (alive %v, %v)", alive, err)
	}
	if _, err := a.Execute(ctx, underReal); err != nil {
		t.Fatalf("the real kube-proxy's nft: %v", err)
	}
	rref, _ := procs.ParseRef(underReal.Target)
	eventually(t, "the real kube-proxy's nft to be gone", 10*time.Second, func() bool {
		alive, err := procs.Alive(ctx, pr, rref.Pid, rref.CreateTimeMs)
		return err == nil && !alive
	})
}
