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
	"strings"
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
