// Package netnstest gives tests a private network namespace on the real
// kernel, deleted when the test ends, and helpers to run commands in it.
package netnstest

import (
	"crypto/rand"
	"encoding/hex"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
)

// NeedRoot skips the test with a clear message when not running as root.
func NeedRoot(t testing.TB, why string) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: " + why)
	}
}

// NeedCommands skips the test when a command is not installed.
func NeedCommands(t testing.TB, cmds ...string) {
	t.Helper()
	for _, c := range cmds {
		if _, err := exec.LookPath(c); err != nil {
			t.Skipf("needs %s (Debian packages iptables, iproute2, util-linux)", c)
		}
	}
}

// New creates a network namespace with lo up and returns its name; it is
// deleted when the test ends. It skips when not root.
func New(t testing.TB) string {
	t.Helper()
	NeedRoot(t, "creates a network namespace")
	NeedCommands(t, "ip")
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	name := "rmdtest-" + hex.EncodeToString(b)
	if out, err := exec.Command("ip", "netns", "add", name).CombinedOutput(); err != nil {
		t.Fatalf("ip netns add %s: %v: %s", name, err, out)
	}
	t.Cleanup(func() {
		if out, err := exec.Command("ip", "netns", "del", name).CombinedOutput(); err != nil {
			t.Errorf("ip netns del %s: %v: %s", name, err, out)
		}
	})
	Run(t, name, "", "ip", "link", "set", "lo", "up")
	return name
}

// Run runs a command in the namespace with stdin and fails the test on
// error, returning its stdout.
func Run(t testing.TB, ns, stdin string, args ...string) string {
	t.Helper()
	out, err := Cmd(ns, stdin, args...).Output()
	if err != nil {
		msg := ""
		if ee, ok := err.(*exec.ExitError); ok {
			msg = string(ee.Stderr)
		}
		t.Fatalf("in %s: %s: %v: %s", ns, strings.Join(args, " "), err, msg)
	}
	return string(out)
}

// Cmd returns an unstarted command running args in the namespace.
func Cmd(ns, stdin string, args ...string) *exec.Cmd {
	cmd := exec.Command("ip", append([]string{"netns", "exec", ns}, args...)...)
	if stdin != "" {
		cmd.Stdin = strings.NewReader(stdin)
	}
	return cmd
}

// Prefix is the command prefix that runs a command in the namespace.
func Prefix(ns string) []string { return []string{"ip", "netns", "exec", ns} }

// StartGroup starts cmd in a process group of its own and, when the test
// ends, kills that group by the PID it started (children such as flock's
// sleep included) and reaps it.
func StartGroup(t testing.TB, cmd *exec.Cmd) {
	t.Helper()
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatalf("start %v: %v", cmd.Args, err)
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	t.Cleanup(func() {
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		<-done
	})
}
