package prometheusexporter

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
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

// scripted is what the test detector reports, by key: targets, or an
// error (a finding.Skip error: skipped).
var scripted = struct {
	sync.Mutex
	targets map[string][]string
	err     map[string]error
}{targets: map[string][]string{}, err: map[string]error{}}

func script(key string, err error, targets ...string) {
	scripted.Lock()
	defer scripted.Unlock()
	scripted.targets[key], scripted.err[key] = targets, err
}

type scriptParams struct {
	Key string `yaml:"key"`
}

type scriptDetector struct{ key string }

func (d scriptDetector) Detect(context.Context) ([]finding.Finding, error) {
	scripted.Lock()
	defer scripted.Unlock()
	if err := scripted.err[d.key]; err != nil {
		return nil, err
	}
	var out []finding.Finding
	for _, t := range scripted.targets[d.key] {
		out = append(out, finding.Finding{Target: t, Severity: finding.Critical, Message: "bad " + t})
	}
	return out, nil
}

func init() {
	detect.Define("ExporterTest", "test", func(p *scriptParams, _ *node.Node) (detect.Detector, error) { return scriptDetector{p.Key}, nil })
}

func mustPolicy(t *testing.T, src string) *policy.Policy {
	t.Helper()
	p, err := policy.Parse("test.yaml", []byte("apiVersion: remediate.dev/v1alpha1\nkind: RemediationPolicy\n"+src), remediate.Catalog{})
	if err != nil {
		t.Fatalf("policy: %v", err)
	}
	return p
}

const twoReportRules = `mode: audit
rules:
- name: watched
  detector: {type: ExporterTest, key: a}
- name: other
  detector: {type: ExporterTest, key: b}
`

// TestFindingsGaugeKeepsValueWhileSkippedOrFailed: a rule whose detector
// is skipped or fails in a cycle did not observe anything, so its findings
// gauge keeps the value of the last cycle it ran (unknown is not absent,
// as for the target states) and remediate_detector_skipped (or
// remediate_detector_errors_total) says why; a 1→0→1 flap would restart
// every alert's `for` (issue 29 bug; the promtool case in
// deploy/alerts/remediate.rules_test.yaml shows the alert). A rule that
// ran and found nothing goes to 0 at once. A real engine, this exporter,
// its registry gathered.
func TestFindingsGaugeKeepsValueWhileSkippedOrFailed(t *testing.T) {
	dir := t.TempDir()
	j, err := journal.Open(dir, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	clk := clocktesting.NewFakeClock(time.Date(2026, 11, 26, 0, 0, 0, 0, time.UTC))
	x := New(Sources{Node: "node1"})
	e, err := remediate.New(mustPolicy(t, twoReportRules), remediate.Options{Node: &node.Node{Name: "node1", Clock: clk},
		StateDir: dir, Journal: j, Clock: clk, LockTimeout: time.Second, Exporters: []remediate.Exporter{x}})
	if err != nil {
		t.Fatal(err)
	}
	cycle := func() *remediate.Report {
		t.Helper()
		clk.Step(time.Minute)
		rep, err := e.Cycle(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		return rep
	}
	gauge := func(name string, labels map[string]string) (float64, bool) {
		m, ok := sample(t, x.Gatherer(), name, labels)
		return m.GetGauge().GetValue(), ok
	}
	want := func(step, rule string, findings, skipped float64) {
		t.Helper()
		got, ok := gauge("remediate_findings", map[string]string{"rule": rule, "detector": "ExporterTest", "severity": "critical"})
		if !ok || got != findings {
			t.Errorf("%s: remediate_findings{rule=%q,severity=critical} = %v (exported %v), want %v", step, rule, got, ok, findings)
		}
		got, ok = gauge("remediate_detector_skipped", map[string]string{"rule": rule, "detector": "ExporterTest"})
		if !ok || got != skipped {
			t.Errorf("%s: remediate_detector_skipped{rule=%q} = %v (exported %v), want %v", step, rule, got, ok, skipped)
		}
	}
	want("before any cycle", "watched", 0, 0)
	script("a", nil, "process/1", "process/2")
	script("b", nil, "process/3")
	cycle()
	want("cycle 1 (both ran)", "watched", 2, 0)
	want("cycle 1 (both ran)", "other", 1, 0)

	script("a", finding.Skip("transient: source not readable this cycle"))
	script("b", nil)
	if rep := cycle(); len(rep.Skipped) != 1 || rep.Skipped[0].Rule != "watched" {
		t.Fatalf("cycle 2 skipped %+v, want watched", rep.Skipped)
	}
	want("cycle 2 (watched skipped)", "watched", 2, 1)
	want("cycle 2 (other ran, found nothing)", "other", 0, 0)

	script("a", errors.New("boom"))
	cycle()
	want("cycle 3 (watched failed)", "watched", 2, 0)
	if m, _ := sample(t, x.Gatherer(), "remediate_detector_errors_total", map[string]string{"rule": "watched"}); m.GetCounter().GetValue() != 1 {
		t.Errorf("remediate_detector_errors_total{rule=watched} = %v, want 1", m.GetCounter().GetValue())
	}

	script("a", nil, "process/1")
	cycle()
	want("cycle 4 (watched ran again)", "watched", 1, 0)

	// A reload keeps the values of the rules still there; the series set
	// stays the policy's: none for a rule no longer in it.
	if err := e.SetPolicy(mustPolicy(t, strings.Replace(twoReportRules, "name: other", "name: renamed", 1))); err != nil {
		t.Fatal(err)
	}
	want("after a reload", "watched", 1, 0)
	want("after a reload", "renamed", 0, 0)
	if _, ok := sample(t, x.Gatherer(), "remediate_findings", map[string]string{"rule": "other"}); ok {
		t.Error("remediate_findings of rule other, no longer in the policy, still exported")
	}

	// Kept, not for ever: a detector skipped cycle after cycle (a cycle a
	// minute here) holds its last value for KeepUnrenewedFor, then lets
	// it go, the skip gauge saying why.
	script("a", finding.Skip("permission lost"))
	for i := 1; time.Duration(i)*time.Minute <= KeepUnrenewedFor; i++ {
		cycle()
		want(fmt.Sprintf("skipped %d min after the last run", i), "watched", 1, 1)
	}
	cycle()
	want("skipped longer than KeepUnrenewedFor", "watched", 0, 1)
	script("a", nil, "process/1", "process/2")
	cycle()
	want("ran again", "watched", 2, 0)
}
