package main

import (
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestMisconfiguredPathsFailAtStart: a path flag that does not exist or is
// not what it says is an error naming the flag, the path and the reason,
// before anything runs (exit 1, nothing on stdout).
func TestMisconfiguredPathsFailAtStart(t *testing.T) {
	dir := t.TempDir()
	pol := writePolicy(t, dir, "audit", 0)
	state := filepath.Join(dir, "state")
	file := filepath.Join(dir, "file")
	os.WriteFile(file, []byte("x"), 0o644)
	corrupt := filepath.Join(dir, "corrupt-kubeconfig")
	os.WriteFile(corrupt, []byte("apiVersion: v1\nkind: Config\nclusters: [{name: c, cluster: {server: \"https://127.0.0.1:1\"\n"), 0o600)
	empty := filepath.Join(dir, "empty-kubeconfig")
	os.WriteFile(empty, []byte("apiVersion: v1\nkind: Config\n"), 0o600)
	cases := []struct {
		args []string
		want string
	}{
		{[]string{"--kubeconfig", corrupt}, "Error: --kubeconfig " + corrupt + ": "},
		{[]string{"--kubeconfig", empty}, "Error: --kubeconfig " + empty + ": invalid configuration"},
		{[]string{"--policy", filepath.Join(dir, "nope.yaml")}, "Error: --policy " + dir + "/nope.yaml: no such file or directory"},
		{[]string{"--policy", dir}, "Error: --policy " + dir + ": is a directory, not a file"},
		{[]string{"--kubeconfig", "/nonexistent"}, "Error: --kubeconfig /nonexistent: no such file or directory"},
		{[]string{"--proc-root", "/nonexistent"}, "Error: --proc-root /nonexistent: no such file or directory"},
		{[]string{"--proc-root", dir}, "Error: --proc-root " + dir + ": not a procfs"},
		{[]string{"--sys-root", "/nonexistent"}, "Error: --sys-root /nonexistent: no such file or directory"},
		{[]string{"--sys-root", file}, "Error: --sys-root " + file + ": not a directory"},
		{[]string{"--cgroup-root", "/nonexistent"}, "Error: --cgroup-root /nonexistent: no such file or directory"},
		{[]string{"--xtables-lock", "/nonexistent/xtables.lock"}, "Error: --xtables-lock /nonexistent/xtables.lock: its directory: no such file or directory"},
		{[]string{"--xtables-lock", dir}, "Error: --xtables-lock " + dir + ": is a directory"},
	}
	for _, c := range cases {
		args := append([]string{"--once", "--policy", pol, "--state-dir", state}, c.args...)
		code, out, errOut := run(t, args...)
		if code != exitError || out != "" || !strings.Contains(errOut, c.want) {
			t.Errorf("%q: exit %d\nstdout %q\nstderr %q\nwant   %q", c.args, code, out, errOut, c.want)
		}
	}
	// All at once, each named.
	code, _, errOut := run(t, "--once", "--policy", pol, "--state-dir", state, "--kubeconfig", "/nonexistent", "--proc-root", "/nonexistent")
	if code != exitError || strings.Count(errOut, "Error: ") != 2 {
		t.Errorf("two mistakes: exit %d\n%s", code, errOut)
	}
	// A lock file that does not exist yet in an existing directory is fine.
	code, _, errOut = run(t, "--once", "--policy", pol, "--state-dir", state, "--xtables-lock", filepath.Join(dir, "xtables.lock"))
	if code != exitOK {
		t.Errorf("lock file not created yet: exit %d\n%s", code, errOut)
	}
}

// TestSilentAPIServerIsOneLine: an API server that accepts connections and
// never answers is said in one warning line within the probe's bound; no
// client-go noise above debug level.
func TestSilentAPIServerIsOneLine(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() { // accept and hold, never answer
		var held []net.Conn
		for {
			c, err := ln.Accept()
			if err != nil {
				for _, c := range held {
					c.Close()
				}
				return
			}
			held = append(held, c)
		}
	}()
	dir := t.TempDir()
	kc := filepath.Join(dir, "kubeconfig")
	os.WriteFile(kc, []byte(fmt.Sprintf(`apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "https://%s", insecure-skip-tls-verify: true}}]
contexts: [{name: c, context: {cluster: c, user: u}}]
current-context: c
users: [{name: u, user: {token: x}}]
`, ln.Addr())), 0o600)
	pol := writePolicy(t, dir, "audit", 0)
	cmd := mainCmd(os.Args[0], "--once", "--sample", "0", "--dry-run", "--policy", pol, "--state-dir", filepath.Join(dir, "state"), "--kubeconfig", kc, "--node-name", "n1")
	var stderr strings.Builder
	cmd.Stderr = &stderr
	start := time.Now()
	out, err := cmd.Output()
	took := time.Since(start)
	if err != nil {
		t.Fatalf("%v\n%s\n%s", err, out, stderr.String())
	}
	lines := strings.Split(strings.TrimSpace(stderr.String()), "\n")
	if len(lines) != 1 || !strings.Contains(lines[0], "WARN") || !strings.Contains(lines[0], "kubernetes API server not answering") ||
		!strings.Contains(lines[0], "no answer within 5s from https://"+ln.Addr().String()) {
		t.Errorf("want one warning line, got:\n%s", stderr.String())
	}
	if took > apiProbeTimeout+5*time.Second {
		t.Errorf("took %s", took)
	}
}
