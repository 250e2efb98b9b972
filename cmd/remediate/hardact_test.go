package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/remediate-dev/remediate/detect"
	"github.com/remediate-dev/remediate/internal/finding"
	"github.com/remediate-dev/remediate/internal/netnstest"
	"github.com/remediate-dev/remediate/internal/node"
	"github.com/remediate-dev/remediate/internal/procs"
	"github.com/remediate-dev/remediate/remediate"
	"github.com/remediate-dev/remediate/remediate/journal"
)

// pidFileParams point CLITestProcessFile at a file holding a PID.
type pidFileParams struct {
	File string `yaml:"file"`
}

// pidFileDetector reports the live process whose PID is in a file, as a
// process target: a real process for the real KillProcess.
type pidFileDetector struct {
	file string
	n    *node.Node
}

func (d pidFileDetector) Detect(ctx context.Context) ([]finding.Finding, error) {
	b, err := os.ReadFile(d.file)
	if err != nil {
		return nil, nil
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		return nil, err
	}
	p, err := d.n.Procs.Get(ctx, int32(pid))
	if err != nil {
		return nil, nil // gone
	}
	// A sleeping process: judged making no progress (KillProcess
	// re-reads its CPU time before each signal).
	return []finding.Finding{{Target: p.Target(), Severity: finding.Critical, Message: fmt.Sprintf("pid %d is stuck", pid),
		Evidence: map[string]any{"pid": p.Pid, "createTimeMs": p.CreateTimeMs},
		Subject:  finding.Subject{Process: &finding.Process{ProgressChecked: true, CPUTicks: p.CPUTicks}}}}, nil
}

func init() {
	detect.Define("CLITestProcessFile", "test detector: the process whose PID is in a file",
		// No declared targets: a test type must not show among the real
		// feeders of KillProcess (pairs_test.go); undeclared pairs pass.
		func(p *pidFileParams, n *node.Node) (detect.Detector, error) { return pidFileDetector{p.File, n}, nil })
}

// daemonProc is a remediate daemon (this test binary as main) and its logs.
type daemonProc struct {
	cmd  *exec.Cmd
	logs *logBuf
	done chan error
}

func startDaemon(t *testing.T, args ...string) *daemonProc {
	t.Helper()
	if !strings.Contains(strings.Join(args, " "), "--metrics-addr") {
		args = append(args, "--metrics-addr", freeAddr(t)) // never the default port
	}
	cmd := mainCmd(os.Args[0], args...)
	stderr, _ := cmd.StderrPipe()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	d := &daemonProc{cmd: cmd, logs: &logBuf{}, done: make(chan error, 1)}
	go func() {
		sc := bufio.NewScanner(stderr)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		for sc.Scan() {
			d.logs.add(sc.Text())
		}
		d.done <- cmd.Wait()
	}()
	t.Cleanup(func() {
		if cmd.ProcessState == nil {
			_ = cmd.Process.Kill()
			<-d.done
		}
	})
	return d
}

func (d *daemonProc) wait(t *testing.T, within time.Duration) error {
	t.Helper()
	select {
	case err := <-d.done:
		return err
	case <-time.After(within):
		t.Fatalf("daemon still running after %s:\n%s", within, d.logs.String())
		return nil
	}
}

// TestSecondDaemonRefused (issue 27 item 15): a second daemon on a state
// dir a daemon holds refuses to start with a clear error naming the
// holder; a --once run alongside works as before; once the first daemon is
// gone (even killed -9: the kernel drops the flock) a daemon starts.
func TestSecondDaemonRefused(t *testing.T) {
	dir := t.TempDir()
	pol := writePolicy(t, dir, "audit", 1)
	state := filepath.Join(dir, "state")
	first := startDaemon(t, "--policy", pol, "--state-dir", state, "--node-name", "node1")
	waitFor(t, "the first daemon to start", func() bool { return first.logs.has(`"msg":"daemon started"`) })

	second := startDaemon(t, "--policy", pol, "--state-dir", state, "--node-name", "node1")
	err := second.wait(t, 20*time.Second)
	want := fmt.Sprintf("state dir is in use by another remediate daemon: pid %d holds %s", first.cmd.Process.Pid, filepath.Join(state, remediate.DaemonLockFile))
	if err == nil || !second.logs.has(want) {
		t.Fatalf("second daemon: exit %v, want an error saying %q:\n%s", err, want, second.logs.String())
	}

	code, out, errOut := run(t, "--once", "--policy", pol, "--state-dir", state)
	if code != 2 || !strings.Contains(out, "hung-restore") {
		t.Fatalf("--once alongside the daemon: exit %d\n%s\n%s", code, out, errOut)
	}

	_ = first.cmd.Process.Kill()
	first.wait(t, 10*time.Second)
	third := startDaemon(t, "--policy", pol, "--state-dir", state, "--node-name", "node1")
	waitFor(t, "a daemon to start after the first was killed", func() bool { return third.logs.has(`"msg":"daemon started"`) })

	// A planted symlink is not followed.
	other := filepath.Join(dir, "state2")
	os.MkdirAll(other, 0o700)
	os.Symlink(filepath.Join(dir, "elsewhere"), filepath.Join(other, remediate.DaemonLockFile))
	fourth := startDaemon(t, "--policy", pol, "--state-dir", other, "--node-name", "node1")
	if err := fourth.wait(t, 20*time.Second); err == nil || !fourth.logs.has("opening the daemon lock") {
		t.Fatalf("symlinked daemon.lock: exit %v\n%s", err, fourth.logs.String())
	}
	if _, err := os.Lstat(filepath.Join(dir, "elsewhere")); err == nil {
		t.Fatal("the symlink's target was created")
	}
}

const killPolicy = `apiVersion: remediate.dev/v1alpha1
kind: RemediationPolicy
mode: enforce
interval: 1s
detectorTimeout: 1s
actionTimeout: 60s
rules:
- name: kill-sleeper
  detector: {type: CLITestProcessFile, file: %q}
  for: 0s
  action: {type: KillProcess, names: [sleep], programs: [sleep], gracePeriod: %s, killWait: 5s}
  cooldown: 0s
  rateLimit: {max: 10, per: 1h}
  maxAttempts: 3
  verifyAfter: 1s
`

// TestDaemonKilledMidActionSettles (issue 27 item 2): the real daemon
// sends SIGTERM to a real process that ignores it (20 s grace) and is
// killed -9 during the grace. Restarted, it settles the attempt: the
// journal gets an "interrupted" outcome for it, the state history no
// longer says pending, the log and remediate_actions_interrupted_total
// say so; the target is verified at once (still there), so the rule acts
// again and the process is killed (SIGTERM, then SIGKILL).
func TestDaemonKilledMidActionSettles(t *testing.T) {
	netnstest.NeedRoot(t, "signals a real process")
	dir := t.TempDir()
	state := filepath.Join(dir, "state")
	// sleep with SIGTERM ignored (inherited across exec).
	sleeper := exec.Command("sh", "-c", `trap "" TERM; exec sleep 300`)
	netnstest.StartGroup(t, sleeper)
	pidFile := filepath.Join(dir, "pid")
	os.WriteFile(pidFile, []byte(strconv.Itoa(sleeper.Process.Pid)), 0o644)
	pol := filepath.Join(dir, "policy.yaml")
	os.WriteFile(pol, []byte(fmt.Sprintf(killPolicy, pidFile, "20s")), 0o644)

	first := startDaemon(t, "--policy", pol, "--state-dir", state, "--node-name", "node1")
	waitForLogs(t, "the SIGTERM", first.logs, func() bool { return first.logs.has(`"msg":"signalled process","signal":"SIGTERM"`) })
	time.Sleep(time.Second) // mid-grace, as an OOM kill or node drain would
	if err := first.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	first.wait(t, 10*time.Second)
	st, _ := (&remediate.Store{Dir: state}).Load(time.Now())
	if len(st.History) != 1 || st.History[0].Outcome != "pending" {
		t.Fatalf("after kill -9: history %+v, want one pending attempt", st.History)
	}
	if p, err := procs.New("/proc").Get(context.Background(), int32(sleeper.Process.Pid)); err != nil || p.Name() != "sleep" {
		t.Fatalf("the target is gone already (%v): the kill did not land mid-action", err)
	}

	os.WriteFile(pol, []byte(fmt.Sprintf(killPolicy, pidFile, "1s")), 0o644)
	addr := freeAddr(t)
	second := startDaemon(t, "--policy", pol, "--state-dir", state, "--node-name", "node1", "--metrics-addr", addr)
	waitForLogs(t, "the process to be killed after the restart", second.logs, func() bool {
		p, err := procs.New("/proc").Get(context.Background(), int32(sleeper.Process.Pid))
		return err != nil || p.State == "Z"
	})
	waitFor(t, "the outcome in the journal", func() bool {
		recs, _ := journal.ReadAll(state)
		return len(recs) > 0 && recs[len(recs)-1].Kind == journal.KindOutcome
	})
	recs, err := journal.ReadAll(state)
	if err != nil {
		t.Fatal(err)
	}
	var kinds []string
	for _, r := range recs {
		if r.Kind == journal.KindIntent || r.Kind == journal.KindOutcome {
			kinds = append(kinds, r.Kind+"/"+r.Outcome)
		}
	}
	if strings.Join(kinds, ",") != "intent/,outcome/interrupted,intent/,outcome/executed" || recs[0].ID != recs[1].ID {
		t.Fatalf("journal %v:\n%v", kinds, recs)
	}
	if sig := fmt.Sprint(recs[len(recs)-1].Details["signals"]); sig != "[SIGTERM SIGKILL]" {
		t.Errorf("second attempt sent %s", sig)
	}
	if !second.logs.has(`"msg":"action interrupted by a daemon stop; settling it"`) {
		t.Errorf("no log line:\n%s", second.logs.String())
	}
	// The engine hands its exporters the cycle at its end: the journal's
	// outcome comes first, the metric when the cycle ends.
	var body []byte
	metric := func() bool {
		resp, err := http.Get("http://" + addr + "/metrics")
		if err != nil {
			return false
		}
		body, _ = io.ReadAll(resp.Body)
		resp.Body.Close()
		return strings.Contains(string(body), `remediate_actions_interrupted_total{action="KillProcess",rule="kill-sleeper"} 1`)
	}
	deadline := time.Now().Add(20 * time.Second)
	for !metric() && time.Now().Before(deadline) {
		time.Sleep(100 * time.Millisecond)
	}
	if !metric() {
		t.Errorf("metric missing at the end of the cycle:\n%s", body)
	}
	second.cmd.Process.Signal(syscall.SIGTERM)
	second.wait(t, 20*time.Second)
	st, _ = (&remediate.Store{Dir: state}).Load(time.Now())
	var outs []string
	for _, h := range st.History {
		outs = append(outs, h.Outcome)
	}
	if strings.Join(outs, ",") != "interrupted,executed" {
		t.Fatalf("history %v", outs)
	}
}

// waitForLogs is waitFor, with the daemon's logs when it times out.
func waitForLogs(t *testing.T, what string, logs *logBuf, ok func() bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		if ok() {
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Fatalf("timed out waiting for %s; daemon logs:\n%s", what, logs.String())
}
