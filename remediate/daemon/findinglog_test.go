package daemon

import (
	"fmt"
	"strings"
	"testing"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/remediate-dev/remediate/internal/finding"
	"github.com/remediate-dev/remediate/remediate"
)

// TestFindingLogTransitionsOnly: a finding is logged when it appears (at
// its severity's level), when its severity changes, and when it resolves;
// not again while it stays; not resolved while its rule is skipped.
func TestFindingLogTransitionsOnly(t *testing.T) {
	core, logs := observer.New(zap.DebugLevel)
	log := zap.New(core)
	var l findingLog
	f := func(rule, target string, sev finding.Severity) remediate.ReportFinding {
		return remediate.ReportFinding{Rule: rule, Finding: finding.Finding{Detector: "D", Target: target, Severity: sev, Message: "m"}}
	}
	rep := func(skipped []string, fs ...remediate.ReportFinding) *remediate.Report {
		r := &remediate.Report{Findings: fs}
		for _, s := range skipped {
			r.Skipped = append(r.Skipped, remediate.SkippedCheck{Rule: s})
		}
		return r
	}
	steps := []struct {
		rep  *remediate.Report
		want []string
	}{
		{rep(nil, f("a", "t1", finding.Critical), f("b", "t2", finding.Warning)), []string{"error finding appeared a/t1", "warn finding appeared b/t2"}},
		{rep(nil, f("a", "t1", finding.Critical), f("b", "t2", finding.Warning)), nil},
		{rep(nil, f("a", "t1", finding.Warning), f("b", "t2", finding.Warning)), []string{"warn finding changed severity a/t1"}},
		{rep([]string{"b"}, f("a", "t1", finding.Warning)), nil}, // b skipped: unknown, not resolved
		{rep(nil, f("a", "t1", finding.Warning)), []string{"info finding resolved b/t2"}},
		{rep(nil, f("a", "t1", finding.Info)), []string{"info finding changed severity a/t1"}},
		{rep(nil), []string{"info finding resolved a/t1"}},
		{rep(nil), nil},
	}
	for i, s := range steps {
		l.observe(log, s.rep)
		var got []string
		for _, e := range logs.TakeAll() {
			m := e.ContextMap()
			got = append(got, fmt.Sprintf("%s %s %s/%s", e.Level, e.Message, m["rule"], m["target"]))
		}
		if strings.Join(got, "; ") != strings.Join(s.want, "; ") {
			t.Errorf("step %d: logged %q, want %q", i, got, s.want)
		}
	}
}
