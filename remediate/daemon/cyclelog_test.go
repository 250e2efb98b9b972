package daemon

import (
	"context"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/remediate-dev/remediate/detect"
	"github.com/remediate-dev/remediate/internal/finding"
	"github.com/remediate-dev/remediate/internal/node"
	"github.com/remediate-dev/remediate/remediate"
	"github.com/remediate-dev/remediate/remediate/journal"
)

// flipFindings is how many findings DaemonTestFlip returns.
var flipFindings atomic.Int32

type flip struct{}

func (flip) Detect(context.Context) ([]finding.Finding, error) {
	var out []finding.Finding
	for i := range int(flipFindings.Load()) {
		out = append(out, finding.Finding{Target: "t" + string(rune('a'+i)), Severity: finding.Warning, Message: "flip"})
	}
	return out, nil
}

func init() {
	detect.Define("DaemonTestFlip", "test", func(*struct{}, *node.Node) (detect.Detector, error) { return flip{}, nil })
}

// The daemon says each cycle in one info line (rules, run, ok, skipped,
// findings, decisions, took); an unchanged cycle is said at debug, and at
// info again after cycleLogEvery; a change is said at once.
func TestCycleLineRateLimited(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "p.yaml")
	os.WriteFile(p, []byte("apiVersion: remediate.dev/v1alpha1\nkind: RemediationPolicy\nmode: audit\ninterval: 1s\ndetectorTimeout: 1s\nrules:\n"+
		"- name: q\n  detector: {type: DaemonTestQuiet}\n- name: f\n  detector: {type: DaemonTestFlip}\n"), 0o644)
	pl, err := load(p)
	if err != nil {
		t.Fatal(err)
	}
	j, _ := journal.Open(dir, 0, 0)
	eng, err := remediate.New(pl, remediate.Options{Node: &node.Node{Name: "n"}, StateDir: dir, Journal: j})
	if err != nil {
		t.Fatal(err)
	}
	core, logs := observer.New(zapcore.DebugLevel)
	clk := clocktesting.NewFakeClock(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	d := New(Config{Engine: eng, Clock: clk, Log: zap.New(core)})
	ctx := context.Background()
	flipFindings.Store(0)

	cycleLines := func() []observer.LoggedEntry {
		var out []observer.LoggedEntry
		for _, e := range logs.TakeAll() {
			if e.Message == "cycle done" {
				out = append(out, e)
			}
		}
		return out
	}
	step := func(what string, wantLevel zapcore.Level, wantFields map[string]int64) {
		t.Helper()
		d.cycle(ctx)
		lines := cycleLines()
		if len(lines) != 1 {
			t.Fatalf("%s: %d cycle lines, want 1", what, len(lines))
		}
		e := lines[0]
		if e.Level != wantLevel {
			t.Errorf("%s: level %s, want %s", what, e.Level, wantLevel)
		}
		f := e.ContextMap()
		for k, v := range wantFields {
			if got, ok := f[k].(int64); !ok || got != v {
				t.Errorf("%s: %s = %v, want %d (fields %v)", what, k, f[k], v, f)
			}
		}
		if _, ok := f["took"]; !ok {
			t.Errorf("%s: no duration: %v", what, f)
		}
	}
	quietFields := map[string]int64{"rules": 2, "run": 2, "ok": 2, "skipped": 0, "findings": 0, "decisions": 0}
	step("first cycle", zapcore.InfoLevel, quietFields)
	clk.Step(30 * time.Second)
	step("same again", zapcore.DebugLevel, quietFields)
	clk.Step(cycleLogEvery - 30*time.Second - time.Second)
	step("same, just under the repeat", zapcore.DebugLevel, quietFields)
	clk.Step(time.Second)
	step("same, repeat due", zapcore.InfoLevel, quietFields)
	flipFindings.Store(2)
	clk.Step(30 * time.Second)
	step("findings appear", zapcore.InfoLevel, map[string]int64{"rules": 2, "run": 2, "ok": 1, "findings": 2})
	clk.Step(30 * time.Second)
	step("findings unchanged", zapcore.DebugLevel, map[string]int64{"findings": 2})
	flipFindings.Store(0)
	clk.Step(30 * time.Second)
	step("findings resolved", zapcore.InfoLevel, quietFields)
}
