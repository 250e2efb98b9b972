package main

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/remediate-dev/remediate/detect"
	"github.com/remediate-dev/remediate/internal/finding"
	"github.com/remediate-dev/remediate/internal/node"
	"github.com/remediate-dev/remediate/remediate/action"
)

var update = flag.Bool("update", false, "rewrite golden files")

// Test-only detector and action types, so the CLI's output does not depend
// on this machine. The daemon test runs this test binary as the remediate
// binary (TestMain), so they exist there too.
type cliParams struct {
	Findings int `yaml:"findings"`
}

type cliDetector struct{ n int }

func (d cliDetector) Detect(context.Context) ([]finding.Finding, error) {
	var out []finding.Finding
	for i := 0; i < d.n; i++ {
		out = append(out, finding.Finding{Target: fmt.Sprintf("process/%d@1700000000000", 100+i), Severity: finding.Critical,
			Message: fmt.Sprintf("iptables-restore pid %d hung for 5m0s", 100+i), Evidence: map[string]any{"pid": 100 + i, "ageSeconds": 300}})
	}
	return out, nil
}

// Judged implements detect.Judged: the figure a clean run looked at.
func (d cliDetector) Judged() string {
	return "no iptables-restore running longer than 1m0s (3 running)"
}

type cliSkipper struct{}

func (cliSkipper) Detect(context.Context) ([]finding.Finding, error) {
	return nil, finding.Skip("no cluster access: not running in a pod and --kubeconfig not given")
}

type cliAction struct{}

func (cliAction) Plan(_ context.Context, f finding.Finding) (action.Plan, error) {
	return action.Plan{Summary: "kill " + f.Target + " (SIGTERM, then SIGKILL after 5s)"}, nil
}
func (cliAction) Execute(context.Context, finding.Finding) (action.Result, error) {
	return action.Result{Summary: "killed"}, nil
}

func init() {
	detect.Define("CLITestHung", "test detector",
		func(p *cliParams, _ *node.Node) (detect.Detector, error) { return cliDetector{p.Findings}, nil })
	detect.Define("CLITestNeedsAPI", "test detector",
		func(*struct{}, *node.Node) (detect.Detector, error) { return cliSkipper{}, nil })
	action.Define("CLITestKill", "test action",
		func(*struct{}, *node.Node) (action.Action, error) { return cliAction{}, nil }, action.ActsOnAnyFinding())
}

// SetDefaults implements registry.Defaulter.
func (p *cliParams) SetDefaults() { p.Findings = 1 }

func TestMain(m *testing.M) {
	if os.Getenv("REMEDIATE_TEST_AS_MAIN") == "1" {
		main()
		return
	}
	if in := os.Getenv("REMEDIATE_TEST_ROUTES"); in != "" { // the routes to host files, probed by the confined daemon (hostroutes_test.go)
		os.Exit(probeRoutes(in, os.Args[1:]))
	}
	if os.Getenv("REMEDIATE_TEST_SLEEP") == "1" { // a stand-in process (bundle_test.go)
		time.Sleep(10 * time.Minute)
		return
	}
	if addrs := os.Getenv("REMEDIATE_TEST_HANG_LISTEN"); addrs != "" { // a kube-proxy that answers nothing (frozen_process_test.go)
		hangListen(strings.Split(addrs, ","))
		return
	}
	os.Exit(m.Run())
}

const testPolicy = `apiVersion: remediate.dev/v1alpha1
kind: RemediationPolicy
mode: %s
interval: 1s
detectorTimeout: 1s
rules:
- name: hung-restore
  detector: {type: CLITestHung, findings: %d}
  for: 10m
  action: {type: CLITestKill}
  cooldown: 10m
- name: api-check
  detector: {type: CLITestNeedsAPI}
- name: clean-check
  detector: {type: CLITestHung, findings: 0}
`

func writePolicy(t *testing.T, dir, mode string, findings int) string {
	t.Helper()
	p := filepath.Join(dir, "policy.yaml")
	if err := os.WriteFile(p, []byte(fmt.Sprintf(testPolicy, mode, findings)), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

func run(t *testing.T, args ...string) (int, string, string) {
	t.Helper()
	var out, errb bytes.Buffer
	code := Run(context.Background(), args, &out, &errb)
	return code, out.String(), errb.String()
}

var timeRE = regexp.MustCompile(`\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?(Z|[+-]\d\d:\d\d)`)

func golden(t *testing.T, name, got string) {
	t.Helper()
	got = timeRE.ReplaceAllString(got, "<TIME>")
	path := filepath.Join("testdata", name)
	if *update {
		if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run with -update to create)", err)
	}
	if got != string(want) {
		t.Errorf("%s differs from golden:\n--- got\n%s\n--- want\n%s", name, got, want)
	}
}

func TestOnceTextAndJSONGolden(t *testing.T) {
	dir := t.TempDir()
	pol := writePolicy(t, dir, "enforce", 2)
	code, out, _ := run(t, "--once", "--dry-run", "--policy", pol, "--state-dir", filepath.Join(dir, "s1"), "--node-name", "node1")
	if code != exitFindings {
		t.Fatalf("exit %d, want 2", code)
	}
	golden(t, "once.txt", out)

	code, out, _ = run(t, "--once", "--dry-run", "-o", "json", "--policy", pol, "--state-dir", filepath.Join(dir, "s2"), "--node-name", "node1")
	if code != exitFindings {
		t.Fatalf("json exit %d", code)
	}
	golden(t, "once.json", out)
	// Stable keys scripts depend on.
	var rep map[string]any
	if err := json.Unmarshal([]byte(out), &rep); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"node", "mode", "findings", "decisions", "skipped", "ok"} {
		if _, ok := rep[k]; !ok {
			t.Errorf("report lacks key %q", k)
		}
	}
	f := rep["findings"].([]any)[0].(map[string]any)
	for _, k := range []string{"rule", "detector", "target", "severity", "message", "evidence"} {
		if _, ok := f[k]; !ok {
			t.Errorf("finding lacks key %q", k)
		}
	}
	d := rep["decisions"].([]any)[0].(map[string]any)
	for _, k := range []string{"rule", "action", "target", "outcome", "reason"} {
		if _, ok := d[k]; !ok {
			t.Errorf("decision lacks key %q", k)
		}
	}
	if d["outcome"] != "dry-run" {
		t.Errorf("--dry-run over an enforce policy gave %v", d["outcome"])
	}
}

func TestOnceExitCodes(t *testing.T) {
	dir := t.TempDir()
	clean := writePolicy(t, dir, "audit", 0)
	if code, out, _ := run(t, "--once", "--policy", clean, "--state-dir", dir); code != exitOK || !strings.Contains(out, "FINDINGS: none") {
		t.Fatalf("no findings: exit %d\n%s", code, out)
	}
	bad := filepath.Join(dir, "bad.yaml")
	os.WriteFile(bad, []byte("apiVersion: remediate.dev/v1alpha1\nkind: RemediationPolicy\nmode: yes-please\nrules: []\n"), 0o644)
	code, _, errOut := run(t, "--once", "--policy", bad, "--state-dir", dir)
	if code != exitError || !strings.Contains(errOut, "bad.yaml:3:7: mode: must be audit or enforce") || !strings.Contains(errOut, "bad.yaml:4:8: rules: at least one rule") {
		t.Fatalf("invalid policy: exit %d\n%s", code, errOut)
	}
	if code, _, _ := run(t, "--once", "--policy", filepath.Join(dir, "missing.yaml")); code != exitError {
		t.Fatalf("missing policy: exit %d", code)
	}
	if code, _, _ := run(t, "--no-such-flag"); code != exitError {
		t.Fatalf("bad flag: exit %d", code)
	}
	if code, _, _ := run(t, "--once", "-o", "yaml", "--policy", clean); code != exitError {
		t.Fatalf("bad output: exit %d", code)
	}
}

// TestOnceSharesDaemonGuardrails: a one-shot run in enforce mode acts, a
// second one pointed at the same state dir is held back by the cooldown.
func TestOnceSharesDaemonGuardrails(t *testing.T) {
	dir := t.TempDir()
	pol := writePolicy(t, dir, "enforce", 1)
	state := filepath.Join(dir, "state")
	_, out, _ := run(t, "--once", "-o", "json", "--policy", pol, "--state-dir", state)
	if !strings.Contains(out, `"outcome": "executed"`) {
		t.Fatalf("first run did not act:\n%s", out)
	}
	_, out, _ = run(t, "--once", "-o", "json", "--policy", pol, "--state-dir", state)
	if !strings.Contains(out, `"phase": "Verifying"`) {
		t.Fatalf("second run did not see the first's action:\n%s", out)
	}
	// With verification due at once, the finding still present is a failed
	// attempt; the retry is held back by the first run's cooldown.
	src, _ := os.ReadFile(pol)
	os.WriteFile(pol, []byte(strings.Replace(string(src), "cooldown: 10m", "cooldown: 10m\n  verifyAfter: 0s", 1)), 0o644)
	if _, out, _ = run(t, "--once", "-o", "json", "--policy", pol, "--state-dir", filepath.Join(dir, "state2")); !strings.Contains(out, `"outcome": "executed"`) {
		t.Fatalf("fresh state dir did not act:\n%s", out)
	}
	_, out, _ = run(t, "--once", "-o", "json", "--policy", pol, "--state-dir", filepath.Join(dir, "state2"))
	if !strings.Contains(out, "verification failed") || !strings.Contains(out, `"guardrail": "cooldown"`) {
		t.Fatalf("second run ignored the first's history:\n%s", out)
	}
	code, jout, _ := run(t, "journal", "--state-dir", state)
	if code != 0 || !strings.Contains(jout, "intent") || !strings.Contains(jout, "outcome=executed") {
		t.Fatalf("journal: %d\n%s", code, jout)
	}
}

func TestPolicyCommands(t *testing.T) {
	dir := t.TempDir()
	good := writePolicy(t, dir, "audit", 1)
	bad := filepath.Join(dir, "bad.yaml")
	os.WriteFile(bad, []byte("apiVersion: remediate.dev/v1alpha1\nkind: RemediationPolicy\nrules:\n- name: x\n  detector: {type: CLITestHung, findings: many, extra: 1}\n"), 0o644)
	code, out, errOut := run(t, "policy", "check", good, bad)
	if code != exitError || !strings.Contains(out, good+": ok") {
		t.Fatalf("check: %d %s %s", code, out, errOut)
	}
	for _, want := range []string{"bad.yaml:5:43: rules[0].detector.findings: must be an integer", `bad.yaml:5:49: rules[0].detector.extra: unknown parameter for detector CLITestHung "extra"`} {
		if !strings.Contains(errOut, want) {
			t.Errorf("check output lacks %q:\n%s", want, errOut)
		}
	}
	if code, _, _ := run(t, "policy", "check", good); code != exitOK {
		t.Fatalf("valid policy: exit %d", code)
	}
	code, out, _ = run(t, "policy", "show", good)
	if code != exitOK || !strings.Contains(out, "maxActionsPerHour: 6") || !strings.Contains(out, "findings: 1") || !strings.Contains(out, "verifyAfter: 1m0s") {
		t.Fatalf("show: %d\n%s", code, out)
	}
	if code, out, _ := run(t, "policy", "types"); code != exitOK || !strings.Contains(out, "CLITestHung") || !strings.Contains(out, "CLITestKill") {
		t.Fatalf("types: %d\n%s", code, out)
	}
	if code, out, _ := run(t, "version"); code != exitOK || !strings.HasPrefix(out, "remediate ") {
		t.Fatalf("version: %d %q", code, out)
	}
}

func TestExamplePoliciesAreValid(t *testing.T) {
	files, _ := filepath.Glob("../../examples/*.yaml")
	if len(files) < 2 {
		t.Fatalf("examples missing: %v", files)
	}
	code, out, errOut := run(t, append([]string{"policy", "check"}, files...)...)
	if code != exitOK {
		t.Fatalf("examples invalid:\n%s%s", out, errOut)
	}
}

// TestDaemonLifecycle runs the real binary (this test binary acting as
// main): it starts and serves its endpoints, rejects an invalid policy on
// SIGHUP and keeps running, reloads a valid one when the file changes, and
// stops cleanly on SIGTERM.
func TestDaemonLifecycle(t *testing.T) {
	dir := t.TempDir()
	pol := writePolicy(t, dir, "audit", 1)
	addr := freeAddr(t)
	cmd := mainCmd(os.Args[0], "--policy", pol, "--state-dir", filepath.Join(dir, "state"), "--metrics-addr", addr, "--node-name", "node1")
	logs, _ := startLogged(t, cmd)
	get := func(path string) (int, string) { return httpGet(addr, path) }
	waitFor(t, "readyz", func() bool { c, _ := get("/readyz"); return c == 200 })
	if c, _ := get("/healthz"); c != 200 {
		t.Fatalf("healthz %d", c)
	}
	_, metrics := get("/metrics")
	for _, m := range []string{"remediate_cycle_duration_seconds", `remediate_decisions_total{action="CLITestKill",outcome="skipped",rule="hung-restore"}`, `remediate_findings{detector="CLITestHung",rule="hung-restore",severity="critical"} 1`, `remediate_detector_skipped{detector="CLITestNeedsAPI",rule="api-check"} 1`} {
		if !strings.Contains(metrics, m) {
			t.Errorf("metrics lack %s", m)
		}
	}
	if !logs.has(`"msg":"daemon started"`) || !logs.has(`"level":"info"`) {
		t.Errorf("daemon logs are not JSON: %s", logs.String())
	}

	// Invalid policy + SIGHUP: rejected, old one kept, still serving.
	os.WriteFile(pol, []byte("apiVersion: remediate.dev/v1alpha1\nkind: RemediationPolicy\nmode: sometimes\n"), 0o644)
	cmd.Process.Signal(syscall.SIGHUP)
	waitFor(t, "rejected reload", func() bool { return logs.has("policy reload rejected") })
	waitFor(t, "invalid reload metric", func() bool {
		_, m := get("/metrics")
		return strings.Contains(m, `remediate_policy_reloads_total{result="invalid"} 1`)
	})
	if c, _ := get("/healthz"); c != 200 {
		t.Fatal("daemon unhealthy after a rejected reload")
	}
	// A valid change is picked up from the file alone (as a ConfigMap update is).
	os.WriteFile(pol, []byte(fmt.Sprintf(testPolicy, "audit", 3)), 0o644)
	waitFor(t, "file reload", func() bool { return logs.has(`"msg":"policy reloaded"`) })
	waitFor(t, "new policy in effect", func() bool {
		_, m := get("/metrics")
		return strings.Contains(m, `remediate_findings{detector="CLITestHung",rule="hung-restore",severity="critical"} 3`)
	})

	cmd.Process.Signal(syscall.SIGTERM)
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("exit after SIGTERM: %v\n%s", err, logs.String())
		}
	case <-time.After(15 * time.Second):
		t.Fatal("daemon did not stop within 15s of SIGTERM")
	}
	if !logs.has(`"msg":"stopping"`) || !logs.has(`"msg":"stopped"`) {
		t.Errorf("no graceful stop log")
	}
	// The finding is logged when it appears (critical: error level) and
	// when it changes, not every cycle.
	if n := logs.count(`{"level":"error","ts":"`); n < 1 || logs.count(`"msg":"finding appeared","rule":"hung-restore","detector":"CLITestHung","target":"process/100@`) != 1 {
		t.Errorf("finding not logged exactly once at appearance, at error level (%d error lines):\n%s", n, logs.String())
	}
}

// mainCmd runs bin, this test binary or a copy, as the remediate binary
// (see TestMain).
func mainCmd(bin string, args ...string) *exec.Cmd {
	cmd := exec.Command(bin, args...)
	cmd.Env = append(os.Environ(), "REMEDIATE_TEST_AS_MAIN=1")
	return cmd
}

// freeAddr returns a loopback address nothing listens on (for
// --metrics-addr).
func freeAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

type logBuf struct {
	mu    sync.Mutex
	lines []string
}

func (l *logBuf) add(s string) { l.mu.Lock(); l.lines = append(l.lines, s); l.mu.Unlock() }
func (l *logBuf) has(s string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, x := range l.lines {
		if strings.Contains(x, s) {
			return true
		}
	}
	return false
}
func (l *logBuf) count(s string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for _, x := range l.lines {
		if strings.Contains(x, s) {
			n++
		}
	}
	return n
}
func (l *logBuf) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return strings.Join(l.lines, "\n")
}

func waitFor(t *testing.T, what string, ok func() bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) {
		if ok() {
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Fatalf("timed out waiting for %s", what)
}

// TestOnceExitsOneWhenStateIsNotSaved: a --once run whose guardrail state
// cannot be written reports what it saw but exits 1 (error), not 0.
func TestOnceExitsOneWhenStateIsNotSaved(t *testing.T) {
	dir := t.TempDir()
	pol := writePolicy(t, dir, "audit", 0)
	state := filepath.Join(dir, "state")
	// state.json is a directory: unreadable (quarantined, but the move aside
	// fails as its targets exist and are not empty) and not replaceable.
	if err := os.MkdirAll(filepath.Join(state, "state.json", "x"), 0o700); err != nil {
		t.Fatal(err)
	}
	now := time.Now().Unix()
	for s := now - 1; s <= now+30; s++ {
		if err := os.MkdirAll(filepath.Join(state, fmt.Sprintf("state.json.corrupt-%d", s), "x"), 0o700); err != nil {
			t.Fatal(err)
		}
	}
	code, out, errOut := run(t, "--once", "--policy", pol, "--state-dir", state, "--node-name", "node1")
	if code != exitError || !strings.Contains(out, "persisting guardrail state") {
		t.Fatalf("exit %d\n%s%s", code, out, errOut)
	}
}

// httpGet is a GET of http://addr+path: the status and body, or 0 and the
// error's text.
func httpGet(addr, path string) (int, string) {
	resp, err := http.Get("http://" + addr + path)
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}
