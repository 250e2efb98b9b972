package remediate

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/remediate-dev/remediate/detect"
	"github.com/remediate-dev/remediate/internal/causes"
	"github.com/remediate-dev/remediate/internal/finding"
	"github.com/remediate-dev/remediate/internal/node"
)

type judgedDetector struct{ fakeDetector }

func (judgedDetector) Judged() string { return "conntrack 12% of max" }

type skippingDetector struct{}

func (skippingDetector) Detect(context.Context) ([]finding.Finding, error) {
	return nil, finding.Skip("IPVS unavailable: no ip_vs module")
}

func init() {
	detect.Define("FakeJudged", "test", func(p *fakeParams, _ *node.Node) (detect.Detector, error) {
		return judgedDetector{fakeDetector{p.Key}}, nil
	})
	detect.Define("FakeSkip", "test", func(*fakeParams, *node.Node) (detect.Detector, error) { return skippingDetector{}, nil })
}

// TestReportAccountsForEveryCheck: each rule appears exactly once, as
// finding(s), ok (with the figure judged, or "no finding"), or skipped; a
// detector that failed is a finding, not ok.
func TestReportAccountsForEveryCheck(t *testing.T) {
	h := newHarness(t)
	p := mustPolicy(t, `rules:
- name: finds
  detector: {type: Fake, key: a}
- name: clean
  detector: {type: Fake, key: b}
- name: judged
  detector: {type: FakeJudged, key: c}
- name: judged-but-finds
  detector: {type: FakeJudged, key: d}
- name: fails
  detector: {type: Fake, key: e}
- name: skipped
  detector: {type: FakeSkip}
`)
	setPresent("a", "process/1", "process/2")
	setPresent("d", "conntrack/table")
	w.mu.Lock()
	w.fail["e"] = errors.New("boom")
	w.mu.Unlock()
	rep := h.cycle(h.engine(p))

	seen := map[string][]string{}
	for _, f := range rep.Findings {
		if len(seen[f.Rule]) == 0 || seen[f.Rule][len(seen[f.Rule])-1] != "finding" {
			seen[f.Rule] = append(seen[f.Rule], "finding")
		}
	}
	for _, c := range rep.OK {
		seen[c.Rule] = append(seen[c.Rule], "ok: "+c.Judged)
	}
	for _, s := range rep.Skipped {
		seen[s.Rule] = append(seen[s.Rule], "skipped")
	}
	want := map[string]string{"finds": "finding", "clean": "ok: no finding", "judged": "ok: conntrack 12% of max",
		"judged-but-finds": "finding", "fails": "finding", "skipped": "skipped"}
	for rule, w := range want {
		if got := seen[rule]; len(got) != 1 || got[0] != w {
			t.Errorf("rule %s: %q, want exactly [%q]", rule, got, w)
		}
	}
	var b bytes.Buffer
	if err := rep.WriteText(&b); err != nil {
		t.Fatal(err)
	}
	for _, s := range []string{"CHECKS OK:", "judged  FakeJudged  conntrack 12% of max", "6 checks: 3 with findings, 2 ok, 1 skipped. Evidence and full detail: -o json."} {
		if !strings.Contains(b.String(), s) {
			t.Errorf("text report lacks %q:\n%s", s, b.String())
		}
	}
}

// TestTextReportKeepsWholeCauses: a long message keeps its cause (the end)
// in the text report; only a runaway one is cut, saying where the rest is.
func TestTextReportKeepsWholeCauses(t *testing.T) {
	cause := `Get "http://127.0.0.1:10249/metrics": dial tcp 127.0.0.1:10249: connect: connection refused`
	long := strings.Repeat("kube-proxy metrics endpoint is unreachable: ", 4) + cause
	rep := &Report{Node: "n", Mode: "audit", Findings: []ReportFinding{{Rule: "r", Finding: finding.Finding{Detector: "D", Target: "t", Severity: finding.Critical, Message: long}}}}
	var b bytes.Buffer
	rep.WriteText(&b)
	if !strings.Contains(b.String(), cause) {
		t.Errorf("cause cut:\n%s", b.String())
	}
	rep.Findings[0].Message = strings.Repeat("x", 10000)
	b.Reset()
	rep.WriteText(&b)
	if !strings.Contains(b.String(), "(cut; see -o json)") || len(b.String()) > 3000 {
		t.Errorf("runaway message: %d bytes", len(b.String()))
	}
}

// TestTextReportTopCause: a finding that carries likely causes shows its
// top one in one line under the findings; one without shows none.
func TestTextReportTopCause(t *testing.T) {
	ev := map[string]any{}
	causes.Rank(causes.Inputs{Throttling: &causes.Throttling{Periods: 100, Throttled: 70, ThrottledTime: 2 * time.Second, Window: time.Minute, Cgroup: "/kp"}}).Attach(ev, nil)
	rep := &Report{Node: "n", Mode: "audit", Findings: []ReportFinding{
		{Rule: "slow", Finding: finding.Finding{Detector: "KubeProxySyncSlow", Target: "kube-proxy/IPv4", Severity: finding.Warning, Message: "slow", Evidence: ev}},
		{Rule: "other", Finding: finding.Finding{Detector: "D", Target: "t", Severity: finding.Warning, Message: "m"}},
	}}
	var b bytes.Buffer
	rep.WriteText(&b)
	want := "LIKELY CAUSE (top of each finding's ranked list; all with figures: -o json):\n  slow kube-proxy/IPv4: kube-proxy CPU-throttled in 70% of periods over the last 1m0s (70 of 100, 2s throttled, summed over CPUs; cgroup /kp; threshold 25%)\n"
	if !strings.Contains(b.String(), want) {
		t.Errorf("report:\n%s\nwant:\n%s", b.String(), want)
	}
	if strings.Contains(b.String(), "  other t:") {
		t.Errorf("a finding without causes got a line:\n%s", b.String())
	}
}
