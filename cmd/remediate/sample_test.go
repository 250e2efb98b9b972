package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// fakeKubeProxy serves kube-proxy's /metrics (1.33+ per-family series) and
// /proxyMode; restoreFailures is read at every scrape.
func fakeKubeProxy(t *testing.T, restoreFailures func(scrape int64) int) (*httptest.Server, *atomic.Int64) {
	t.Helper()
	var scrapes atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/proxyMode":
			fmt.Fprint(w, "iptables")
		case "/metrics":
			n := scrapes.Add(1)
			fmt.Fprintf(w, `# TYPE kubeproxy_sync_proxy_rules_iptables_restore_failures_total counter
kubeproxy_sync_proxy_rules_iptables_restore_failures_total{ip_family="IPv4"} %d
# TYPE kubeproxy_sync_proxy_rules_iptables_partial_restore_failures_total counter
kubeproxy_sync_proxy_rules_iptables_partial_restore_failures_total{ip_family="IPv4"} 0
# TYPE kubeproxy_sync_proxy_rules_last_timestamp_seconds gauge
kubeproxy_sync_proxy_rules_last_timestamp_seconds{ip_family="IPv4"} %d
`, restoreFailures(n), time.Now().Unix())
		default:
			http.NotFound(w, r)
		}
	}))
	t.Cleanup(srv.Close)
	return srv, &scrapes
}

// policyFile writes a policy (apiVersion and kind added) into dir.
func policyFile(t *testing.T, dir, body string) string {
	t.Helper()
	p := filepath.Join(dir, "policy.yaml")
	if err := os.WriteFile(p, []byte("apiVersion: remediate.dev/v1alpha1\nkind: RemediationPolicy\n"+body), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

func restorePolicy(t *testing.T, dir, url string) string {
	return policyFile(t, dir, fmt.Sprintf(`mode: audit
kubeProxy:
  metricsURL: %[1]s/metrics
  healthzURL: %[1]s/healthz
  proxyModeURL: %[1]s/proxyMode
  syncPeriod: 30s
rules:
- name: restore-failures
  detector: {type: KubeProxyRestoreFailures}
- name: pending
  detector: {type: KubeProxyEndpointChangesPending}
`, url))
}

// A kube-proxy whose iptables-restore failure counter rises while --once
// samples is reported by one run of the real binary; with --sample 0 the
// same kube-proxy gives no verdict (one snapshot has no rate).
func TestOnceSampleRestoreFailuresRise(t *testing.T) {
	srv, scrapes := fakeKubeProxy(t, func(n int64) int {
		if n == 1 {
			return 7 // failures before the run do not count
		}
		return 9
	})
	dir := t.TempDir()
	pol := restorePolicy(t, dir, srv.URL)
	start := time.Now()
	cmd := mainCmd(os.Args[0], "--once", "--sample", "5s", "-o", "json", "--policy", pol,
		"--state-dir", filepath.Join(dir, "s1"), "--node-name", "n1")
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	took := time.Since(start)
	code := cmd.ProcessState.ExitCode()
	if code != exitFindings {
		t.Fatalf("exit %d (%v), want 2\n%s\n%s", code, err, out, stderr.String())
	}
	if took < 5*time.Second || took > 40*time.Second {
		t.Errorf("run took %s, want the 5s sample and well under a minute", took)
	}
	var rep struct {
		Findings []struct {
			Rule, Detector, Target, Severity, Message string
			Evidence                                  map[string]any
		}
		Sampled *struct {
			Seconds float64
			Rules   []string
			Capped  []string
		}
	}
	if err := json.Unmarshal(out, &rep); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	if len(rep.Findings) != 1 || rep.Findings[0].Detector != "KubeProxyRestoreFailures" || rep.Findings[0].Target != "kube-proxy/IPv4" ||
		rep.Findings[0].Severity != "critical" || rep.Findings[0].Evidence["failures"] != 2.0 {
		t.Fatalf("findings %+v, want one critical KubeProxyRestoreFailures for kube-proxy/IPv4 with 2 failures\n%s", rep.Findings, out)
	}
	if ws := rep.Findings[0].Evidence["windowSeconds"].(float64); ws < 4.5 || ws > 30 {
		t.Errorf("windowSeconds %v, want about the 5s sample", ws)
	}
	if rep.Sampled == nil || rep.Sampled.Seconds != 5 || strings.Join(rep.Sampled.Rules, ",") != "restore-failures,pending" ||
		strings.Join(rep.Sampled.Capped, ",") != "pending" {
		t.Errorf("sampled %+v, want 5s over restore-failures and pending, pending capped", rep.Sampled)
	}
	// stderr is no terminal here: no progress lines.
	if strings.Contains(stderr.String(), "sampling") {
		t.Errorf("progress lines on a non-terminal stderr:\n%s", stderr.String())
	}

	// One snapshot: the same rising kube-proxy gives nothing to judge.
	scrapes.Store(0)
	start = time.Now()
	cmd = mainCmd(os.Args[0], "--once", "--sample", "0", "-o", "json", "--policy", pol,
		"--state-dir", filepath.Join(dir, "s2"), "--node-name", "n1")
	out, _ = cmd.Output()
	if code := cmd.ProcessState.ExitCode(); code != exitOK || time.Since(start) > 5*time.Second {
		t.Fatalf("--sample 0: exit %d after %s, want 0 at once\n%s", code, time.Since(start), out)
	}
	if strings.Contains(string(out), `"sampled"`) {
		t.Errorf("--sample 0 reports sampling:\n%s", out)
	}
}

// A policy with no detector that judges across samples does not wait.
func TestOnceSampleNothingWindowed(t *testing.T) {
	dir := t.TempDir()
	pol := writePolicy(t, dir, "audit", 0)
	start := time.Now()
	code, out, _ := run(t, "--once", "--sample", "30s", "--policy", pol, "--state-dir", dir)
	if code != exitOK || time.Since(start) > 5*time.Second || strings.Contains(out, "Sampled:") {
		t.Fatalf("exit %d after %s\n%s", code, time.Since(start), out)
	}
}

func TestSampleFlagBounds(t *testing.T) {
	for _, c := range []struct{ args, msg string }{
		{"--once --sample 2s", "--sample must be 0 (one snapshot) or at least 5s"},
		{"--once --sample -1s", "--sample must be 0"},
		{"--once --sample 11m", "--sample must be at most 10m"},
		{"--bundle x.tar.gz", "--bundle needs --once"},
		{"--sample 20s", "--sample needs --once"},
		{"--once --bundle-max-mib 0", "--bundle-max-mib must be between 1 and 1024"},
	} {
		code, out, errOut := run(t, strings.Fields(c.args)...)
		if code != exitError || out != "" || !strings.Contains(errOut, c.msg) {
			t.Errorf("%s: exit %d, stderr %q, want %q", c.args, code, errOut, c.msg)
		}
	}
}

// openPTY returns a pseudo-terminal's controller and terminal ends.
func openPTY(t *testing.T) (ctl, tty *os.File) {
	t.Helper()
	ctl, err := os.OpenFile("/dev/ptmx", os.O_RDWR|unix.O_NOCTTY, 0)
	if err != nil {
		t.Skipf("no pseudo-terminals here: %v", err)
	}
	t.Cleanup(func() { ctl.Close() })
	if err := unix.IoctlSetPointerInt(int(ctl.Fd()), unix.TIOCSPTLCK, 0); err != nil {
		t.Fatal(err)
	}
	n, err := unix.IoctlGetInt(int(ctl.Fd()), unix.TIOCGPTN)
	if err != nil {
		t.Fatal(err)
	}
	tty, err = os.OpenFile(fmt.Sprintf("/dev/pts/%d", n), os.O_RDWR|unix.O_NOCTTY, 0)
	if err != nil {
		t.Fatal(err)
	}
	return ctl, tty
}

// With stderr on a terminal, the wait says how long is left.
func TestOnceSampleProgressOnTerminal(t *testing.T) {
	srv, _ := fakeKubeProxy(t, func(int64) int { return 0 })
	dir := t.TempDir()
	pol := restorePolicy(t, dir, srv.URL)
	ctl, tty := openPTY(t)
	cmd := mainCmd(os.Args[0], "--once", "--sample", "5s", "--policy", pol, "--state-dir", filepath.Join(dir, "s"), "--node-name", "n1")
	cmd.Stderr = tty
	var out bytes.Buffer
	cmd.Stdout = &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	tty.Close() // the child holds it
	var progress bytes.Buffer
	done := make(chan struct{})
	go func() { io.Copy(&progress, ctl); close(done) }() // ends with EIO when the child exits
	if err := cmd.Wait(); err != nil {
		t.Fatalf("%v\n%s", err, out.String())
	}
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("terminal output did not end")
	}
	got := progress.String()
	for _, want := range []string{"remediate: first sample of 2 rate/window checks taken; second in 5s (--sample 0 skips)",
		"remediate: sampling, ", "s left", "remediate: taking the second sample"} {
		if !strings.Contains(got, want) {
			t.Errorf("terminal lacks %q:\n%s", want, got)
		}
	}
	if !strings.Contains(out.String(), "Sampled: 2 rate/window checks twice, 5s apart (restore-failures, pending)") {
		t.Errorf("report:\n%s", out.String())
	}
}
