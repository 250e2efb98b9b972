package detect

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/remediate-dev/remediate/internal/finding"
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
		// A sync queued at 11:43:24.8 still pending 28 s later.
		{"1.34 stalled", "metrics-v1.34-stalled.txt", captureStalled, []string{"kube-proxy/IPv4"}},
		// Same values, 8 s after it was queued: within 1 x syncPeriod.
		{"1.34 stalled, not yet late", "metrics-v1.34-stalled.txt", time.Date(2026, 11, 21, 11, 43, 33, 0, time.UTC), nil},
		{"1.32 healthy", "metrics-v1.32-healthy.txt", captureHealthy, nil},
		{"1.32 stalled", "metrics-v1.32-stalled.txt", captureStalled, []string{"kube-proxy"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := staleSyncFindings(parseKP(t, kpFixture(t, tc.file)), nil, tc.now, sp, sp, true)
			wantTargets(t, tc.name, got, nil, tc.want...)
			for _, f := range got {
				if f.Severity != finding.Critical || !strings.Contains(f.Message, "has not completed") {
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
		since         float64 // pending since (0: unknown)
		requireQueued bool
		want          bool
	}{
		{"fresh", at(5), at(6), 0, true, false},
		// iptables mode resyncs hourly when idle: an old last sync alone
		// is healthy.
		{"idle: old sync, nothing queued", at(3600), at(3700), 0, true, false},
		{"idle: old sync, a change queued just now", at(3600), at(0.5), 0, true, false},
		{"old sync, nothing queued, requireQueued off", at(100), at(200), 0, false, true},
		{"a queued sync pending too long", at(3600), at(50), 0, true, true},
		{"churn: queued moves, but pending since long ago", at(3600), at(1), at(45), true, true},
		{"exactly at the limit", at(3600), at(30), 0, true, false},
		{"never synced, queued long ago", 0, at(100), 0, true, true},
		{"never synced, queued recently", 0, at(10), 0, true, false},
		{"no information", 0, 0, 0, false, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			since := map[kubeproxy.Family]float64{}
			if tc.since != 0 {
				since["IPv6"] = tc.since
			}
			got := staleSyncFindings(m(tc.last, tc.queued), since, now, 30*time.Second, 30*time.Second, tc.requireQueued)
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
// kube-proxy whose IPv4 syncs stop completing while changes keep being
// queued (each scrape shows a newer last_queued): the detector must measure
// from the first pending scrape, not from the moving last_queued.
func TestSyncStaleOverHTTP(t *testing.T) {
	const sp = 30 * time.Second
	start := time.Unix(1_800_000_000, 0)
	n, s, clk := newKPNode(t, sp, start)
	d := newDetector(t, "KubeProxySyncStale", n, nil)
	ctx := context.Background()
	now := func() float64 { return float64(clk.Now().UnixNano()) / 1e9 }
	lastSync := now() - 3600 // idle for an hour: healthy
	for i, want := range []bool{false, false, false, false, true, true} {
		q := now() - 1
		if i == 0 {
			q = lastSync - 1 // nothing pending yet
		}
		s.set(func(s *kpServer) {
			s.metrics = metricsText(true, 0, map[kubeproxy.Family]famSample{
				"IPv4": {lastSync: lastSync, lastQueued: q},
				"IPv6": {lastSync: now(), lastQueued: now() - 1},
			})
		})
		fs, err := d.Detect(ctx)
		// Pending since the scrape at i=1 (t=10s, queued at 9s): late once
		// more than 30 s have passed, i.e. from i=4 (t=40s).
		if want {
			wantTargets(t, fmt.Sprintf("scrape %d", i), fs, err, "kube-proxy/IPv4")
			if fs[0].Evidence["ipFamily"] != "IPv4" || fs[0].Evidence["pendingSince"] == nil {
				t.Errorf("evidence %v", fs[0].Evidence)
			}
		} else {
			wantTargets(t, fmt.Sprintf("scrape %d", i), fs, err)
		}
		clk.Step(10 * time.Second)
	}
	// The sync completes: the finding clears.
	s.set(func(s *kpServer) {
		s.metrics = metricsText(true, 0, map[kubeproxy.Family]famSample{"IPv4": {lastSync: now(), lastQueued: now() - 1}})
	})
	fs, err := d.Detect(ctx)
	wantTargets(t, "after the sync", fs, err)
}
