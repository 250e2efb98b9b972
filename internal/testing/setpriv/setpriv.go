//go:build linux

// Package setpriv re-runs a test under setpriv with the chart's default
// capabilities (CAP_NET_ADMIN, CAP_NET_RAW, CAP_KILL; uid 0; no
// CAP_SYS_PTRACE, no CAP_DAC_READ_SEARCH), so that the code under test
// meets the kernel's refusals exactly as the default pod does: other root
// processes' /proc/<pid>/exe, ns/net, fd/N and fdinfo are refused,
// /proc/<pid>/stat, status, cmdline, cgroup, net/dev and /proc/locks are
// not.
package setpriv

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// DefaultCaps are the chart's default capabilities (deploy/).
const DefaultCaps = "net_admin,net_raw,kill"

const envChild = "REMEDIATE_SETPRIV_CHILD"

// Child reports whether this test process is the re-run under setpriv.
func Child() bool { return os.Getenv(envChild) == "1" }

// Available skips t unless it runs as root with setpriv installed.
func Available(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root")
	}
	if _, err := exec.LookPath("setpriv"); err != nil {
		t.Skip("no setpriv")
	}
}

// Run re-runs the test t (by its full name, in this test binary) under
// setpriv with caps as the only capabilities (bounding set; none
// inheritable or ambient), env added to its environment, and fails t with
// the child's output when the child fails. It returns the output.
func Run(t *testing.T, caps string, env ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	name := "^" + strings.ReplaceAll(t.Name(), "/", "$/^") + "$"
	cmd := exec.CommandContext(ctx, "setpriv", "--inh-caps=-all", "--bounding-set=-all,+"+strings.ReplaceAll(caps, ",", ",+"), "--ambient-caps=-all", "--",
		os.Args[0], "-test.run", name, "-test.count=1", "-test.v")
	cmd.Env = append(append(os.Environ(), envChild+"=1"), env...)
	out, err := cmd.CombinedOutput()
	if err != nil || !strings.Contains(string(out), "--- PASS") {
		t.Fatalf("under setpriv (%s): %v\n%s", caps, err, out)
	}
	return string(out)
}

// Nobody is the user a test runs something as when it must be any user
// at all: uid and gid 65534, no capabilities (a non-root uid's effective
// set is empty).
const Nobody = 65534

// NobodyAttr returns the SysProcAttr that runs a command as Nobody.
func NobodyAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: Nobody, Gid: Nobody}}
}

// NobodyCopy returns a directory Nobody can traverse (0755, removed when
// t ends) and a copy of this test binary in it (the work tree may not be
// readable by Nobody), for running this binary as Nobody. It skips t
// without root.
func NobodyCopy(t *testing.T, name string) (dir, bin string) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root to run a process as another user")
	}
	dir, err := os.MkdirTemp("", "remediate-nobody-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	src, err := os.ReadFile(os.Args[0])
	if err != nil {
		t.Fatal(err)
	}
	bin = filepath.Join(dir, name)
	if err := os.WriteFile(bin, src, 0o755); err != nil {
		t.Fatal(err)
	}
	return dir, bin
}
