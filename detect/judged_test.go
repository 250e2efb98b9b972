package detect

import (
	"context"
	"strings"
	"testing"
	"time"

	clocktesting "k8s.io/utils/clock/testing"

	"github.com/remediate-dev/remediate/internal/conntrack"
)

// TestJudgedFigures: a clean run of the real detectors says the one figure
// it judged, for the report's ok list.
func TestJudgedFigures(t *testing.T) {
	ctx := context.Background()
	judged := func(d Detector) string {
		t.Helper()
		fs, err := d.Detect(ctx)
		if err != nil || len(fs) != 0 {
			t.Fatalf("not clean: %v %v", fs, err)
		}
		j, ok := d.(Judged)
		if !ok {
			t.Fatalf("%T does not implement Judged", d)
		}
		return j.Judged()
	}

	f := conntrack.NewFake(1000, 250)
	f.ExtraCount = 120
	got := judged(newCTDetector(t, f, clocktesting.NewFakePassiveClock(time.Unix(1_800_000_000, 0))))
	if !strings.HasPrefix(got, "conntrack 12% of max (120 of 1000 entries, threshold 80%)") {
		t.Errorf("conntrack: %q", got)
	}

	captured := captureHealthy // the healthy fixture's scrape time
	n, s, _ := newKPNode(t, 10*time.Second, captured.Add(4*time.Second))
	s.set(func(s *kpServer) { s.metrics = kpFixture(t, "metrics-v1.34-healthy.txt") })
	if got := judged(newDetector(t, "KubeProxySyncStale", n, nil)); !strings.Contains(got, "last sync") || !strings.Contains(got, "s ago") {
		t.Errorf("sync stale: %q", got)
	}
	if got := judged(newDetector(t, "KubeProxyUnreachable", n, nil)); got != "metrics and /healthz answered" {
		t.Errorf("unreachable: %q", got)
	}
	if got := judged(newDetector(t, "KubeProxyUnhealthy", n, nil)); !strings.HasPrefix(got, "/healthz healthy") {
		t.Errorf("unhealthy: %q", got)
	}
	if got := judged(newDetector(t, "KubeProxyRuleBloat", n, nil)); !strings.Contains(got, "rules in the nat table (limit") {
		t.Errorf("rule bloat: %q", got)
	}
}
