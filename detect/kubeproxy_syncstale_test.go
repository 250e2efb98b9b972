package detect

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/remediate-dev/remediate/internal/kubeproxy"
)

func parseKP(t *testing.T, text string) *kubeproxy.Metrics {
	t.Helper()
	m, err := kubeproxy.ParseMetrics(strings.NewReader(text))
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func TestStaleSyncFindingsOnCaptures(t *testing.T) {
	const sp = 10 * time.Second // the captures' syncPeriod
	for _, tc := range []struct {
		name string
		file string
		now  time.Time
		want []string
	}{
		{"1.34 healthy", "metrics-v1.34-healthy.txt", captureHealthy, nil},
		// 34 s after the last IPv4 sync with a sync queued at 11:43:24.8.
		{"1.34 stalled", "metrics-v1.34-stalled.txt", captureStalled, []string{"kube-proxy/IPv4"}},
		// Same values, but only 15 s later: within 2 x syncPeriod.
		{"1.34 stalled, not yet late", "metrics-v1.34-stalled.txt", time.Date(2026, 11, 21, 11, 43, 33, 0, time.UTC), nil},
		{"1.32 healthy", "metrics-v1.32-healthy.txt", captureHealthy, nil},
		{"1.32 stalled", "metrics-v1.32-stalled.txt", captureStalled, []string{"kube-proxy"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := staleSyncFindings(parseKP(t, kpFixture(t, tc.file)), tc.now, 2*sp, sp, true)
			wantTargets(t, tc.name, got, nil, tc.want...)
			for _, f := range got {
				if f.Severity != Critical || !strings.Contains(f.Message, "has not completed") {
					t.Errorf("finding %+v", f)
				}
			}
		})
	}
}

func TestStaleSyncFindingsTable(t *testing.T) {
	now := time.Unix(1_800_000_000, 0)
	at := func(agoSec float64) float64 { return float64(now.Unix()) - agoSec }
	m := func(last, queued float64) *kubeproxy.Metrics {
		return &kubeproxy.Metrics{Labelled: true, Families: map[kubeproxy.Family]*kubeproxy.FamilyMetrics{
			"IPv6": {Family: "IPv6", LastSync: &last, LastQueued: &queued},
		}}
	}
	for _, tc := range []struct {
		name          string
		last, queued  float64
		requireQueued bool
		want          bool
	}{
		{"fresh", at(5), at(6), true, false},
		{"old but nothing queued", at(100), at(200), true, false},
		{"old and nothing queued, requireQueued off", at(100), at(200), false, true},
		{"old with a queued sync", at(100), at(50), true, true},
		{"exactly at the limit", at(60), at(10), true, false},
		{"never synced, queued long ago", 0, at(100), true, true},
		{"never synced, queued recently", 0, at(10), true, false},
		{"no information", 0, 0, false, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := staleSyncFindings(m(tc.last, tc.queued), now, 60*time.Second, 30*time.Second, tc.requireQueued)
			if (len(got) == 1) != tc.want || len(got) > 1 {
				t.Fatalf("findings %+v, want finding: %v", got, tc.want)
			}
			if tc.want && got[0].Target != "kube-proxy/IPv6" {
				t.Errorf("target %q", got[0].Target)
			}
		})
	}
}

// TestSyncStaleOverHTTP runs the registered detector against a served
// kube-proxy whose timestamps stop moving for IPv4 only.
func TestSyncStaleOverHTTP(t *testing.T) {
	const sp = 30 * time.Second
	start := time.Unix(1_800_000_000, 0)
	n, s, clk := newKPNode(t, sp, start)
	d := newDetector(t, "KubeProxySyncStale", n, nil)
	ctx := context.Background()
	now := func() float64 { return float64(clk.Now().UnixNano()) / 1e9 }
	frozen := now()
	for i := 0; i < 5; i++ {
		s.set(func(s *kpServer) {
			s.metrics = metricsText(true, 0, map[kubeproxy.Family]famSample{
				"IPv4": {lastSync: frozen, lastQueued: frozen + 1},
				"IPv6": {lastSync: now(), lastQueued: now() - 1},
			})
		})
		fs, err := d.Detect(ctx)
		late := clk.Since(time.Unix(0, int64(frozen*1e9))) > 2*sp
		if late {
			wantTargets(t, "late", fs, err, "kube-proxy/IPv4")
			if fs[0].Evidence["ipFamily"] != "IPv4" {
				t.Errorf("evidence %v", fs[0].Evidence)
			}
		} else {
			wantTargets(t, "not late", fs, err)
		}
		clk.Step(20 * time.Second)
	}
}
