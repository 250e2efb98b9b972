package main

import (
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/remediate-dev/remediate/internal/netnstest"
)

// hangListen listens on addrs, accepts every connection and never reads
// or answers (what the kernel does for a stopped process's listening
// sockets), then prints "listening" and waits to be killed.
func hangListen(addrs []string) {
	var mu sync.Mutex
	var held []net.Conn // referenced: a collected conn would be closed
	for _, a := range addrs {
		l, err := net.Listen("tcp", a)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(3)
		}
		go func() {
			for {
				c, err := l.Accept()
				if err != nil {
					return
				}
				mu.Lock()
				held = append(held, c)
				mu.Unlock()
			}
		}()
	}
	fmt.Println("listening")
	time.Sleep(10 * time.Minute)
}

// TestDaemonReportsFrozenKubeProxyProcess runs the daemon (audit) in a test
// network namespace next to a real process named kube-proxy (this test
// binary through a symlink of that name, started there by `ip netns exec`)
// that listens on 127.0.0.1:10249 and :10256 and is then SIGSTOPped by
// PID: the daemon reports KubeProxyFrozen naming its PID and state T after
// minSilence (10 s here, 2 m in the examples), and KubeProxyUnreachable
// from its first cycle. Other kube-proxies on this machine (other tests'
// namespaces) are not this node's: the one in the daemon's network
// namespace is picked. No apiserver: the drift is "not compared" in the
// evidence (the real-apiserver e2e is e2e_frozen_test.go).
func TestDaemonReportsFrozenKubeProxyProcess(t *testing.T) {
	ns := netnstest.New(t)
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	// A copy, not a symlink: this node's kube-proxy is a process whose
	// executable (/proc/<pid>/exe) is named kube-proxy.
	kpPath := filepath.Join(dir, "kube-proxy")
	if err := copyExecutable(self, kpPath); err != nil {
		t.Fatal(err)
	}
	kp := exec.Command("ip", "netns", "exec", ns, kpPath)
	kp.Env = append(os.Environ(), "REMEDIATE_TEST_HANG_LISTEN=127.0.0.1:10249,127.0.0.1:10256")
	out, err := kp.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := kp.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { _ = kp.Wait(); close(done) }()
	t.Cleanup(func() {
		_ = kp.Process.Signal(syscall.SIGKILL) // by PID; a stopped process dies of SIGKILL too
		<-done
	})
	buf := make([]byte, 16)
	if n, err := out.Read(buf); err != nil || !strings.HasPrefix(string(buf[:n]), "listening") {
		t.Fatalf("the stand-in kube-proxy did not start: %q %v", buf[:n], err)
	}
	pid := kp.Process.Pid // ip netns exec execs it: the same PID
	if err := kp.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, 10*time.Second, "the stand-in stopped", func() bool {
		b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		i := strings.LastIndexByte(string(b), ')')
		return i > 0 && i+2 < len(b) && b[i+2] == 'T'
	})

	pol := filepath.Join(dir, "policy.yaml")
	if err := os.WriteFile(pol, []byte(`apiVersion: remediate.dev/v1alpha1
kind: RemediationPolicy
mode: audit
interval: 2s
jitter: 0
detectorTimeout: 2s
kubeProxy: {scrapeTimeout: 500ms}
rules:
- name: restart-frozen-kube-proxy
  detector: {type: KubeProxyFrozen, minSilence: 10s}
- name: kube-proxy-unreachable
  detector: {type: KubeProxyUnreachable}
`), 0o644); err != nil {
		t.Fatal(err)
	}
	daemon := mainCmd("ip", "netns", "exec", ns, self, "--policy", pol, "--state-dir", filepath.Join(dir, "state"),
		"--metrics-addr", "127.0.0.1:19811", "--node-name", "node1", "--proc-root", "/proc")
	logs, stop := startLogged(t, daemon)
	defer stop()
	start := time.Now()
	frozen := fmt.Sprintf(`"detector":"KubeProxyFrozen","target":"kube-proxy/frozen","severity":"critical","message":"kube-proxy (pid %d, state T (stopped (SIGSTOP))) is alive but has answered nothing on /metrics and /healthz for `, pid)
	waitUntil(t, 60*time.Second, "the daemon reports the frozen kube-proxy", func() bool { return logs.has(frozen) })
	after := time.Since(start)
	t.Logf("KubeProxyFrozen reported %v after the daemon started (minSilence 10s, interval 2s)", after.Round(time.Millisecond))
	if after < 10*time.Second {
		t.Errorf("reported after %v, before minSilence (10s)", after)
	}
	if !logs.has(`"detector":"KubeProxyUnreachable","target":"kube-proxy/metrics"`) {
		t.Errorf("no KubeProxyUnreachable finding:\n%s", logs.String())
	}
	stop()
}

// copyExecutable copies the program at src to dst, mode 0755, closed before
// it returns (no "text file busy" at exec).
func copyExecutable(src, dst string) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o755)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}
