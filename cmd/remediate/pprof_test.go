package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestDebugPprofLoopbackOnly: --debug-pprof serves Go's heap profile from
// the running daemon on a loopback address, and an address that is not
// loopback is refused at start (exit 1, naming the flag), nothing served.
func TestDebugPprofLoopbackOnly(t *testing.T) {
	dir := t.TempDir()
	pol := writePolicy(t, dir, "audit", 0)
	for _, addr := range []string{":6060", "0.0.0.0:6060", "10.0.0.1:6060", "[::]:6060", "example.com:6060", "127.0.0.1"} {
		code, _, errOut := run(t, "--policy", pol, "--state-dir", filepath.Join(dir, "refused"), "--metrics-addr", "", "--debug-pprof", addr)
		if code != exitError || !strings.Contains(errOut, "--debug-pprof") {
			t.Errorf("--debug-pprof %s: exit %d, stderr %q; want refused", addr, code, errOut)
		}
	}

	addr, paddr := freeAddr(t), freeAddr(t)
	cmd := mainCmd(os.Args[0], "--policy", pol, "--state-dir", filepath.Join(dir, "state"), "--metrics-addr", addr,
		"--node-name", "node1", "--debug-pprof", paddr)
	logs, stop := startLogged(t, cmd)
	defer stop()
	waitFor(t, "readyz", func() bool { c, _ := httpGet(addr, "/readyz"); return c == 200 })
	code, body := httpGet(paddr, "/debug/pprof/heap?gc=1")
	// A profile is gzip-compressed protobuf.
	if code != 200 || !strings.HasPrefix(body, "\x1f\x8b") {
		t.Fatalf("heap profile: %d %.200q\n%s", code, body, logs.String())
	}
	// Not on the metrics address.
	if c, _ := httpGet(addr, "/debug/pprof/heap"); c == 200 {
		t.Errorf("/debug/pprof served on --metrics-addr")
	}
}
