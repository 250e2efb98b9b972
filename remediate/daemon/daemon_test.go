package daemon

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	clocktesting "k8s.io/utils/clock/testing"

	"github.com/remediate-dev/remediate/detect"
	"github.com/remediate-dev/remediate/internal/finding"
	"github.com/remediate-dev/remediate/internal/node"
	"github.com/remediate-dev/remediate/policy"
	"github.com/remediate-dev/remediate/remediate"
	"github.com/remediate-dev/remediate/remediate/journal"
)

type quiet struct{}

func (quiet) Detect(context.Context) ([]finding.Finding, error) { return nil, nil }

func init() {
	detect.Define("DaemonTestQuiet", "test", func(*struct{}, *node.Node) (detect.Detector, error) { return quiet{}, nil })
}

const pol = "apiVersion: remediate.dev/v1alpha1\nkind: RemediationPolicy\nmode: %s\ninterval: 1s\ndetectorTimeout: 1s\nrules:\n- name: q\n  detector: {type: DaemonTestQuiet}\n"

func load(p string) (*policy.Policy, error) { return policy.Load(p, remediate.Catalog{}) }

func TestNextIntervalStaysWithinJitter(t *testing.T) {
	p := policy.Default()
	p.Interval, p.Jitter = policy.D(30*time.Second), 0.2
	for _, r := range []float64{0, 0.25, 0.5, 0.999} {
		got := nextInterval(p, r)
		if got < 27*time.Second || got > 33*time.Second {
			t.Errorf("r=%v: %v outside 30s±10%%", r, got)
		}
	}
	if nextInterval(p, 0) == nextInterval(p, 0.999) {
		t.Error("no jitter applied")
	}
}

// writeConfigMap lays out a policy the way the kubelet projects a ConfigMap:
// dir/policy.yaml -> ..data/policy.yaml, ..data -> ..<ts> (a directory),
// and an update swaps the ..data symlink atomically.
func writeConfigMap(t *testing.T, dir, version, content string) {
	t.Helper()
	ts := filepath.Join(dir, "..v"+version)
	if err := os.MkdirAll(ts, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(ts, "policy.yaml"), []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	tmp := filepath.Join(dir, "..data_tmp")
	os.Remove(tmp)
	if err := os.Symlink("..v"+version, tmp); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, filepath.Join(dir, "..data")); err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(dir, "policy.yaml")
	if _, err := os.Lstat(link); errors.Is(err, os.ErrNotExist) {
		if err := os.Symlink("..data/policy.yaml", link); err != nil {
			t.Fatal(err)
		}
	}
}

func TestConfigMapSymlinkSwapReloads(t *testing.T) {
	dir := t.TempDir()
	writeConfigMap(t, dir, "1", strings.Replace(pol, "%s", "audit", 1))
	path := filepath.Join(dir, "policy.yaml")
	p, err := load(path)
	if err != nil {
		t.Fatal(err)
	}
	state := t.TempDir()
	j, _ := journal.Open(state, 0, 0)
	reloads := &reloadRecorder{}
	eng, err := remediate.New(p, remediate.Options{Node: &node.Node{Name: "n"}, StateDir: state, Journal: j, Exporters: []remediate.Exporter{reloads}})
	if err != nil {
		t.Fatal(err)
	}
	var rejected atomic.Int32
	d := New(Config{PolicyPath: path, Load: load, Engine: eng, PollInterval: 20 * time.Millisecond,
		OnReloadError: func(context.Context, error) { rejected.Add(1) }})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- d.Run(ctx) }()

	writeConfigMap(t, dir, "2", strings.Replace(pol, "%s", "enforce", 1))
	waitUntil(t, "reload after ..data swap", func() bool { return eng.Policy().Mode == policy.Enforce })

	writeConfigMap(t, dir, "3", "apiVersion: remediate.dev/v1alpha1\nkind: RemediationPolicy\nmode: loud\n")
	waitUntil(t, "rejection of an invalid update", func() bool { return rejected.Load() == 1 })
	if eng.Policy().Mode != policy.Enforce {
		t.Fatal("an invalid update replaced the policy in force")
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	// remediate_policy_reloads_total{result} counts what the exporters got.
	if ok, bad := reloads.ok.Load(), reloads.rejected.Load(); ok != 1 || bad != 1 {
		t.Errorf("exporters told of %d successful and %d rejected reloads, want 1 and 1", ok, bad)
	}
}

// reloadRecorder is an exporter that counts reload results.
type reloadRecorder struct{ ok, rejected atomic.Int32 }

func (r *reloadRecorder) ExportPolicy(*policy.Policy, []string) {}
func (r *reloadRecorder) ExportCycle(*remediate.CycleExport)    {}
func (r *reloadRecorder) ExportReload(ok bool) {
	if ok {
		r.ok.Add(1)
	} else {
		r.rejected.Add(1)
	}
}

func TestHealthyReportsAStalledLoop(t *testing.T) {
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, "p.yaml"), []byte(strings.Replace(pol, "%s", "audit", 1)), 0o644)
	p, _ := load(filepath.Join(dir, "p.yaml"))
	j, _ := journal.Open(dir, 0, 0)
	eng, _ := remediate.New(p, remediate.Options{Node: &node.Node{Name: "n"}, StateDir: dir, Journal: j})
	clk := clocktesting.NewFakeClock(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	d := New(Config{Engine: eng, Clock: clk})
	d.started = clk.Now()
	if err := d.Healthy(); err != nil {
		t.Fatalf("fresh daemon unhealthy: %v", err)
	}
	// limit = 3 x 1s interval + 1s detector timeout + 3 targets x 60s actions
	clk.Step(3*time.Minute + 5*time.Second)
	if err := d.Healthy(); err == nil || !strings.Contains(err.Error(), "loop stalled") {
		t.Fatalf("stalled loop reported healthy: %v", err)
	}
	d.lastCycle = clk.Now()
	if err := d.Healthy(); err != nil {
		t.Fatalf("after a cycle: %v", err)
	}
}

// TestHealthyWhenCyclesStop (issue 27, item 6): with the loop stuck
// between cycles (on main: blocked opening a policy swapped for a FIFO),
// /healthz turns unhealthy after 3 intervals and the detector timeout, not
// after every action's timeout too (3m04s at a 1s interval here, 4m40s
// with the defaults); a cycle that runs is given its own bound.
func TestHealthyWhenCyclesStop(t *testing.T) {
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, "p.yaml"), []byte(strings.Replace(pol, "%s", "audit", 1)), 0o644)
	p, _ := load(filepath.Join(dir, "p.yaml"))
	j, _ := journal.Open(dir, 0, 0)
	eng, _ := remediate.New(p, remediate.Options{Node: &node.Node{Name: "n"}, StateDir: dir, Journal: j})
	clk := clocktesting.NewFakeClock(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	d := New(Config{Engine: eng, Clock: clk})
	d.started = clk.Now()
	d.lastCycle = clk.Now()
	// 3 x 1s interval + 1s detector timeout
	clk.Step(4 * time.Second)
	if err := d.Healthy(); err != nil {
		t.Fatalf("at the limit: %v", err)
	}
	clk.Step(time.Second)
	if err := d.Healthy(); err == nil || !strings.Contains(err.Error(), "cycles stopped") {
		t.Fatalf("no cycle for 5s at a 1s interval reported healthy: %v", err)
	}
	// A cycle running (its actions may take 3 x 60s) is healthy for as
	// long as it may take, then not.
	d.inCycle = clk.Now()
	clk.Step(3 * time.Minute)
	if err := d.Healthy(); err != nil {
		t.Fatalf("a cycle running within its bound: %v", err)
	}
	clk.Step(3 * time.Second)
	if err := d.Healthy(); err == nil || !strings.Contains(err.Error(), "has not finished") {
		t.Fatalf("a cycle past its bound reported healthy: %v", err)
	}
}

func waitUntil(t *testing.T, what string, ok func() bool) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		if ok() {
			return
		}
	}
	t.Fatalf("timed out waiting for %s", what)
}
