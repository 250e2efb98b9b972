package procs

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"strings"
	"testing"
)

// TestRealGoMain reads the Go build information of real processes'
// executables: this test binary's names its package, sleep has none, a
// PID that does not exist is ErrNotFound.
func TestRealGoMain(t *testing.T) {
	r := New("/proc")
	ctx := context.Background()
	self, err := r.GoMain(ctx, int32(os.Getpid()))
	if err != nil || !strings.HasSuffix(self, "internal/procs.test") {
		t.Fatalf("this test binary: %q, %v", self, err)
	}
	sleep := exec.Command("sleep", "30")
	if err := sleep.Start(); err != nil {
		t.Skipf("no sleep: %v", err)
	}
	t.Cleanup(func() { _ = sleep.Process.Kill(); _ = sleep.Wait() })
	if p, err := r.GoMain(ctx, int32(sleep.Process.Pid)); err == nil || !strings.Contains(err.Error(), "no Go build information") {
		t.Fatalf("sleep: %q, %v", p, err)
	}
	if _, err := r.GoMain(ctx, 1<<22+7); !errors.Is(err, ErrNotFound) {
		t.Fatalf("no such pid: %v", err)
	}
	p := Process{Exe: "/usr/local/bin/kube-proxy", CapEff: CapNetAdmin, NetKey: 1}
	if err := CheckProgram(p, "kube-proxy", 1, "k8s.io/kubernetes/cmd/kube-proxy", nil); err != nil {
		t.Errorf("real kube-proxy refused: %v", err)
	}
	if err := CheckProgram(p, "kube-proxy", 1, self, nil); err == nil {
		t.Error("another Go program accepted as kube-proxy")
	}
	if err := CheckProgram(p, "kube-proxy", 2, "k8s.io/kubernetes/cmd/kube-proxy", nil); err == nil {
		t.Error("a kube-proxy of another network namespace accepted")
	}
	// Without ptrace (no executable read) the process's own facts pass;
	// its cgroup decides (procident).
	p.Exe = ""
	if err := CheckProgram(p, "kube-proxy", 1, "", errors.New("unreadable")); err != nil {
		t.Errorf("unreadable executable held against it: %v", err)
	}
}
