package main

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestPolicyCheckFIFO (issue 27, item 5): `remediate policy check FIFO`
// hung in open(2) for ever (and ignored SIGTERM); the real binary now
// refuses it at once.
func TestPolicyCheckFIFO(t *testing.T) {
	fifo := filepath.Join(t.TempDir(), "policy.yaml")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	cmd := mainCmd(os.Args[0], "policy", "check", fifo)
	var out strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		if cmd.ProcessState.ExitCode() != 1 || !strings.Contains(out.String(), "not a regular file") {
			t.Fatalf("policy check of a FIFO: %v, exit %d, output %q; want exit 1 naming it not a regular file", err, cmd.ProcessState.ExitCode(), out.String())
		}
	case <-time.After(time.Minute): // a hang, not a timing check
		_ = cmd.Process.Kill()
		<-done
		t.Fatal("policy check of a FIFO hung")
	}
}

// TestDaemonSurvivesHostilePolicyFiles (issue 27, item 6), on the real
// binary: the live policy swapped for a FIFO stopped the cycles (the loop
// blocked in open(2)) while /healthz stayed 200, and SIGTERM was ignored;
// swapped for a 1 GiB file it took RSS to 1.2 GB, 2.0 GB after SIGHUP.
// Now each swap is a rejected reload, the cycles go on, RSS stays small,
// and SIGTERM stops the daemon.
func TestDaemonSurvivesHostilePolicyFiles(t *testing.T) {
	dir := t.TempDir()
	pol := writePolicy(t, dir, "audit", 1)
	addr := freeAddr(t)
	cmd := mainCmd(os.Args[0], "--policy", pol, "--state-dir", filepath.Join(dir, "state"), "--metrics-addr", addr, "--node-name", "node1")
	logs, _ := startLogged(t, cmd)
	get := func(path string) (int, string) { return httpGet(addr, path) }
	cyclesRE := regexp.MustCompile(`(?m)^remediate_cycle_duration_seconds_count (\d+)$`)
	cycles := func() int {
		_, m := get("/metrics")
		s := cyclesRE.FindStringSubmatch(m)
		if s == nil {
			return -1
		}
		n, _ := strconv.Atoi(s[1])
		return n
	}
	cyclesGoOn := func(what string) {
		t.Helper()
		n := cycles()
		waitFor(t, "cycles after "+what, func() bool { return cycles() >= n+2 })
		if c, body := get("/healthz"); c != 200 {
			t.Fatalf("healthz %d after %s: %s", c, what, body)
		}
	}
	waitFor(t, "readyz", func() bool { c, _ := get("/readyz"); return c == 200 })

	// 1. Swapped for a FIFO (renamed over it: a new inode, as a ConfigMap
	// update is): the poll sees a change, the reload is rejected.
	fifo := filepath.Join(dir, "fifo")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(fifo, pol); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the FIFO's reload rejected", func() bool { return logs.count("policy reload rejected") >= 1 })
	if !logs.has("not a regular file") {
		t.Errorf("the rejection does not say why:\n%s", logs.String())
	}
	cyclesGoOn("a FIFO policy")
	cmd.Process.Signal(syscall.SIGHUP)
	waitFor(t, "the FIFO's SIGHUP reload rejected", func() bool { return logs.count("policy reload rejected") >= 2 })
	cyclesGoOn("SIGHUP with a FIFO policy")

	// 2. A valid policy again, then swapped for a 1 GiB (sparse) file, then
	// SIGHUP.
	good := writePolicy(t, t.TempDir(), "audit", 2)
	if err := os.Rename(good, pol); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the valid policy reloaded", func() bool { return logs.has(`"msg":"policy reloaded"`) })
	big := filepath.Join(dir, "big")
	f, err := os.Create(big)
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Truncate(1 << 30); err != nil {
		t.Fatal(err)
	}
	f.Close()
	if err := os.Rename(big, pol); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the big file's reload rejected", func() bool { return logs.count("policy reload rejected") >= 3 })
	cmd.Process.Signal(syscall.SIGHUP)
	waitFor(t, "the big file's SIGHUP reload rejected", func() bool { return logs.count("policy reload rejected") >= 4 })
	if !logs.has("too large") {
		t.Errorf("the rejection does not say why:\n%s", logs.String())
	}
	cyclesGoOn("a 1 GiB policy")
	if rss := vmRSS(t, cmd.Process.Pid); rss > 256<<20 {
		t.Errorf("RSS %d MiB after a 1 GiB policy and SIGHUP, want well under 256 MiB", rss>>20)
	} else {
		t.Logf("RSS %d MiB after a 1 GiB policy and SIGHUP", rss>>20)
	}

	// 3. SIGTERM stops it.
	cmd.Process.Signal(syscall.SIGTERM)
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("exit after SIGTERM: %v\n%s", err, logs.String())
		}
	case <-time.After(time.Minute): // a hang, not a timing check
		t.Fatalf("daemon did not stop after SIGTERM\n%s", logs.String())
	}
}

// vmRSS is a process's resident set size in bytes.
func vmRSS(t *testing.T, pid int) int64 {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			if err != nil {
				t.Fatal(err)
			}
			return kb << 10
		}
	}
	t.Fatalf("no VmRSS in /proc/%d/status", pid)
	return 0
}
