package detect

import (
	"context"
	"testing"
	"time"

	"github.com/remediate-dev/remediate/internal/finding"
	"github.com/remediate-dev/remediate/internal/kubeproxy"
)

// cum builds 15 cumulative bucket counts from per-bucket counts given as
// (bucket index, count) pairs.
func cum(pairs ...int) []uint64 {
	per := make([]uint64, 15)
	for i := 0; i+1 < len(pairs); i += 2 {
		per[pairs[i]] += uint64(pairs[i+1])
	}
	out := make([]uint64, 15)
	var c uint64
	for i, v := range per {
		c += v
		out[i] = c
	}
	return out
}

func add(a, b []uint64) []uint64 {
	out := make([]uint64, len(a))
	for i := range a {
		out[i] = a[i] + b[i]
	}
	return out
}

// TestSyncSlowUsesBucketDeltas: a kube-proxy with a long healthy history
// (5000 fast syncs) turns slow. The lifetime p99 stays fast; the window's
// p99 sees the slow syncs. When they age out of the window, the finding
// clears.
func TestSyncSlowUsesBucketDeltas(t *testing.T) {
	const sp = 10 * time.Second // limit: 0.5 x 10 s = 5 s
	n, s, clk := newKPNode(t, sp, time.Unix(1_800_000_000, 0))
	d := newDetector(t, "KubeProxySyncSlow", n, func(p any) {
		p.(*KubeProxySyncSlowParams).Window.Duration = 60 * time.Second
	})
	ctx := context.Background()
	buckets := cum(2, 5000) // 5000 syncs <= 4 ms
	count := uint64(5000)
	serve := func() {
		s.set(func(s *kpServer) {
			s.metrics = metricsText(true, 0, map[kubeproxy.Family]famSample{
				"IPv4": {lastSync: 1, lastQueued: 1, buckets: buckets, count: count},
				"IPv6": {lastSync: 1, lastQueued: 1, buckets: cum(2, 1000), count: 1000},
			})
		})
	}
	step := func(what string, want ...string) {
		t.Helper()
		serve()
		fs, err := d.Detect(ctx)
		wantTargets(t, what, fs, err, want...)
		clk.Step(10 * time.Second)
	}
	step("first scrape: no window yet")
	step("healthy")
	// Four slow syncs (8.192-16.384 s bucket) per scrape.
	for i := 0; i < 3; i++ {
		buckets = add(buckets, cum(14, 4))
		count += 4
		if i == 0 {
			step("slow syncs in the window", "kube-proxy/IPv4")
		} else {
			step("still slow", "kube-proxy/IPv4")
		}
	}
	lifetime := kubeproxy.Histogram{Count: count}
	for i, c := range buckets {
		lifetime.Buckets = append(lifetime.Buckets, kubeproxy.Bucket{UpperBound: 0.001 * float64(int(1)<<i), CumulativeCount: c})
	}
	if v, _, _ := lifetime.Quantile(0.99); v > 5 {
		t.Fatalf("test premise: lifetime p99 %v should look healthy", v)
	}
	// Fast syncs only, for longer than the window: the slow ones age out.
	for i := 0; i < 8; i++ {
		buckets = add(buckets, cum(1, 3))
		count += 3
		serve()
		fs, err := d.Detect(ctx)
		if err != nil {
			t.Fatal(err)
		}
		clk.Step(10 * time.Second)
		if i >= 6 && len(fs) != 0 {
			t.Fatalf("finding did not clear after the slow syncs left the window: %+v", fs)
		}
	}
	// kube-proxy restarts: counts reset. No finding, no error, new window.
	buckets, count = cum(2, 1), 1
	step("after a counter reset")
	buckets, count = add(buckets, cum(2, 5)), 6
	step("healthy after restart")
}

func TestSlowSyncFindingTable(t *testing.T) {
	h := func(cumCounts []uint64) kubeproxy.Histogram {
		out := kubeproxy.Histogram{Count: cumCounts[len(cumCounts)-1]}
		for i, c := range cumCounts {
			out.Buckets = append(out.Buckets, kubeproxy.Bucket{UpperBound: 0.001 * float64(int(1)<<i), CumulativeCount: c})
		}
		return out
	}
	limit := 5 * time.Second
	for _, tc := range []struct {
		name string
		h    kubeproxy.Histogram
		want bool
	}{
		{"too few syncs", h(cum(14, 2)), false},
		{"all fast", h(cum(3, 50)), false},
		{"p99 in the 8-16 s bucket", h(cum(3, 90, 14, 10)), true},
		{"above the largest bucket", func() kubeproxy.Histogram { x := h(cum(3, 10)); x.Count = 20; return x }(), true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := slowSyncFinding("IPv4", tc.h, time.Minute, 0.99, limit, 3)
			if (f != nil) != tc.want {
				t.Fatalf("finding %+v, want %v", f, tc.want)
			}
		})
	}
}

func TestPendingGrowing(t *testing.T) {
	for _, tc := range []struct {
		v    []float64
		n    int
		want bool
	}{
		{[]float64{1, 2, 3}, 3, true},
		{[]float64{0, 1, 2, 3}, 3, true},
		{[]float64{1, 2}, 3, false},
		{[]float64{2, 2, 2}, 3, false},
		{[]float64{1, 1, 2}, 3, true},
		{[]float64{0, 1, 2}, 3, false},
		{[]float64{3, 2, 4}, 3, false},
	} {
		if got := pendingGrowing(tc.v, tc.n); got != tc.want {
			t.Errorf("pendingGrowing(%v, %d) = %v, want %v", tc.v, tc.n, got, tc.want)
		}
	}
}

func TestEndpointChangesPendingOverScrapes(t *testing.T) {
	n, s, clk := newKPNode(t, 30*time.Second, time.Unix(1_800_000_000, 0))
	d := newDetector(t, "KubeProxyEndpointChangesPending", n, nil)
	ctx := context.Background()
	for i, tc := range []struct {
		pending float64
		want    bool
	}{{0, false}, {4, false}, {9, false}, {15, true}, {15, true}, {2, false}} {
		s.set(func(s *kpServer) {
			s.metrics = metricsText(true, tc.pending, map[kubeproxy.Family]famSample{"IPv4": {lastSync: 1, lastQueued: 1}})
		})
		fs, err := d.Detect(ctx)
		if tc.want {
			wantTargets(t, "growing", fs, err, "kube-proxy")
		} else {
			wantTargets(t, "not growing", fs, err)
		}
		// A second call within the cache TTL sees the same scrape and must
		// not count it again.
		if i == 2 {
			if fs, err := d.Detect(ctx); err != nil || len(fs) != 0 {
				t.Fatalf("re-read of a cached scrape counted as a new one: %+v %v", fs, err)
			}
		}
		clk.Step(10 * time.Second)
	}
}

func TestRestoreFailuresWindow(t *testing.T) {
	const sp = 10 * time.Second // window 40 s
	for _, labelled := range []bool{true, false} {
		fam := kubeproxy.Family("IPv4")
		target := "kube-proxy/IPv4"
		if !labelled {
			fam, target = kubeproxy.Unlabelled, "kube-proxy"
		}
		n, s, clk := newKPNode(t, sp, time.Unix(1_800_000_000, 0))
		d := newDetector(t, "KubeProxyRestoreFailures", n, nil)
		ctx := context.Background()
		for i, tc := range []struct {
			failures, partial float64
			want              bool
		}{
			{0, 0, false}, // baseline (1.33+: series absent)
			{0, 0, false},
			{1, 1, true}, // first failure
			{3, 1, true},
			{3, 1, true},
			{3, 1, true},
			{3, 1, true}, // 40 s window still holds the failures
			{3, 1, false},
			{3, 4, true},  // 3 partial failures in the window (> 2)
			{0, 0, false}, // restart: counters reset
			{0, 0, false},
		} {
			s.set(func(s *kpServer) {
				s.metrics = metricsText(labelled, 0, map[kubeproxy.Family]famSample{fam: {
					lastSync: 1, lastQueued: 1, failures: tc.failures, partial: tc.partial,
					noFailures: labelled && tc.failures == 0 && tc.partial == 0,
				}})
			})
			fs, err := d.Detect(ctx)
			if tc.want {
				wantTargets(t, "failures", fs, err, target)
			} else {
				wantTargets(t, "no failures", fs, err)
			}
			_ = i
			clk.Step(10 * time.Second)
		}
	}
}

func TestRestoreFailuresSkipsInNFTablesMode(t *testing.T) {
	n, s, _ := newKPNode(t, 30*time.Second, time.Unix(1_800_000_000, 0))
	s.set(func(s *kpServer) { s.mode = "nftables"; s.metrics = metricsText(true, 0, nil) })
	for _, name := range []string{"KubeProxyRestoreFailures", "KubeProxyRuleBloat"} {
		_, err := newDetector(t, name, n, nil).Detect(context.Background())
		if r, ok := finding.IsSkip(err); !ok || r == "" {
			t.Errorf("%s in nftables mode: %v, want skip", name, err)
		}
	}
}
