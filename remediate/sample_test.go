package remediate

import (
	"context"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"

	"github.com/remediate-dev/remediate/detect"
	"github.com/remediate-dev/remediate/internal/finding"
	"github.com/remediate-dev/remediate/internal/node"
)

// rateDetector judges across samples: nothing on its first run, a finding
// from its second (like a failure counter that rose between them).
type rateDetector struct{ runs *atomic.Int32 }

func (d rateDetector) Detect(context.Context) ([]finding.Finding, error) {
	if d.runs.Add(1) < 2 {
		return nil, nil
	}
	return []finding.Finding{{Target: "kube-proxy/IPv4", Severity: finding.Critical, Message: "rose"}}, nil
}

var rateRuns atomic.Int32

func init() {
	detect.Define("FakeRate", "test", func(*struct{}, *node.Node) (detect.Detector, error) { return rateDetector{&rateRuns}, nil },
		detect.Windowed(), detect.Targets(finding.KindKubeProxy))
}

// Sample runs only the windowed detectors, decides nothing and writes
// nothing; the Cycle after it judges with their second sample.
func TestSampleThenCycle(t *testing.T) {
	h := newHarness(t)
	h.opts.Once = true
	rateRuns.Store(0)
	e := h.engine(mustPolicy(t, `mode: enforce
rules:
- name: rate
  detector: {type: FakeRate}
  for: 0s
  action: {type: FakeFix, key: r}
- name: plain
  detector: {type: Fake, key: a}
  for: 0s
  action: {type: FakeFix, key: a}
`))
	setPresent("a", "process/1")
	if got := e.Sample(context.Background()); len(got) != 1 || got[0] != "rate" {
		t.Fatalf("sampled %v, want [rate]", got)
	}
	if rateRuns.Load() != 1 || len(executed()) != 0 {
		t.Fatalf("after the sample: %d runs, executed %v", rateRuns.Load(), executed())
	}
	for _, f := range []string{"state.json", "journal.jsonl"} {
		if _, err := os.Stat(filepath.Join(h.dir, f)); err == nil {
			t.Errorf("the sample wrote %s", f)
		}
	}
	rep := h.cycle(e)
	if rateRuns.Load() != 2 || len(rep.Findings) != 2 {
		t.Fatalf("cycle: %d runs, findings %+v", rateRuns.Load(), rep.Findings)
	}
	if d := decisionFor(rep, "kube-proxy/IPv4"); d.Outcome != OutcomeExecuted {
		t.Errorf("the second sample's finding was not decided: %+v", d)
	}

	// Without windowed detectors there is nothing to sample.
	e2 := h.engine(mustPolicy(t, "rules:\n- name: plain\n  detector: {type: Fake, key: a}\n"))
	if got := e2.Sample(context.Background()); len(got) != 0 {
		t.Errorf("sampled %v without windowed detectors", got)
	}
}
