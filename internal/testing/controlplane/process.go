package controlplane

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"syscall"
	"testing"
	"time"
)

// Process is a program the harness started. It is stopped by its PID
// (SIGTERM, then SIGKILL after a grace period, always reaped), never by name.
type Process struct {
	// Name is a short label ("etcd", "kube-apiserver", ...).
	Name string
	// LogPath is the file holding its stdout and stderr.
	LogPath string
	// Grace is how long Stop waits after SIGTERM before SIGKILL (default
	// 15 s).
	Grace time.Duration

	cmd  *exec.Cmd
	done chan struct{}
	mu   sync.Mutex
	err  error // Wait's result, valid after done is closed
}

// startProcess starts cmd with its output in dir/<name>.log. It registers a
// cleanup that stops the process (idempotent with Stop) and, when the test
// failed, logs the tail of its output.
func startProcess(t testing.TB, name, dir string, cmd *exec.Cmd) *Process {
	t.Helper()
	logPath := filepath.Join(dir, name+".log")
	f, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		t.Fatalf("open %s: %v", logPath, err)
	}
	cmd.Stdout, cmd.Stderr = f, f
	if err := cmd.Start(); err != nil {
		f.Close()
		t.Fatalf("start %s: %v", name, err)
	}
	p := &Process{Name: name, LogPath: logPath, cmd: cmd, done: make(chan struct{})}
	go func() {
		err := cmd.Wait()
		f.Close()
		p.mu.Lock()
		p.err = err
		p.mu.Unlock()
		close(p.done)
	}()
	t.Cleanup(func() {
		p.Stop(t)
		if t.Failed() {
			t.Logf("--- last lines of %s (pid %d, %s):\n%s", name, p.Pid(), logPath, tail(logPath, 25))
		}
	})
	return p
}

// Pid is the process ID.
func (p *Process) Pid() int { return p.cmd.Process.Pid }

// Exited reports whether the process has ended (and was reaped).
func (p *Process) Exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// Stop sends SIGTERM, waits up to Grace, then SIGKILLs and waits again. It
// is safe to call more than once and after the process exited on its own.
func (p *Process) Stop(t testing.TB) {
	t.Helper()
	if p.Exited() {
		return
	}
	grace := p.Grace
	if grace <= 0 {
		grace = 15 * time.Second
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
		return
	case <-time.After(grace):
	}
	t.Logf("%s (pid %d) did not exit %v after SIGTERM; sending SIGKILL", p.Name, p.Pid(), grace)
	_ = p.cmd.Process.Kill()
	select {
	case <-p.done:
	case <-time.After(15 * time.Second):
		t.Errorf("%s (pid %d) still running 15s after SIGKILL", p.Name, p.Pid())
	}
}

// Signal sends sig to the process (by PID).
func (p *Process) Signal(sig os.Signal) error { return p.cmd.Process.Signal(sig) }

// tail returns the last n lines of a file, for failure reports.
func tail(path string, n int) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return fmt.Sprintf("(cannot read: %v)", err)
	}
	lines := bytes.Split(bytes.TrimRight(b, "\n"), []byte("\n"))
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return string(bytes.Join(lines, []byte("\n")))
}

// StartProcess starts cmd (built with NetNS.Command for a namespace of the
// test's) as startProcess does for the harness's own processes: output in
// dir/<name>.log, stopped by PID in t.Cleanup, its log's tail printed when
// the test failed.
func StartProcess(t testing.TB, name, dir string, cmd *exec.Cmd) *Process {
	t.Helper()
	return startProcess(t, name, dir, cmd)
}
