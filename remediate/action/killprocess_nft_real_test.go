package action

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap/zaptest"
	"k8s.io/utils/clock"

	"github.com/remediate-dev/remediate/detect"
	"github.com/remediate-dev/remediate/internal/netnstest"
	"github.com/remediate-dev/remediate/internal/node"
	"github.com/remediate-dev/remediate/internal/procs"
	"github.com/remediate-dev/remediate/policy"
)

// TestRealStuckNFTChildOfKubeProxy runs, on the real kernel, a process whose
// command name is kube-proxy (a shell script so named) with a child whose
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
	kp := filepath.Join(dir, "kube-proxy")
	if err := os.WriteFile(kp, []byte("#!/bin/sh\n\""+nft+"\" 300 &\necho $! > \""+dir+"/child.pid\"\nwait\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	other := filepath.Join(dir, "admin-shell")
	if err := os.WriteFile(other, []byte("#!/bin/sh\n\""+nft+"\" 300 &\necho $! > \""+dir+"/other.pid\"\nwait\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	netnstest.StartGroup(t, exec.Command(kp))
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
	var mine detect.Finding
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
	if _, err := a.Execute(ctx, detect.Finding{Detector: "HungNFT", Target: procs.Target(adminNFT, adminProc.CreateTimeMs)}); err == nil {
		t.Fatal("KillProcess signalled an nft whose parent is not kube-proxy")
	} else if r, ok := detect.IsSkip(err); !ok || !strings.Contains(r, "has parent") {
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
