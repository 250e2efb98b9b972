package detect

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/zap"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/remediate-dev/remediate/internal/finding"
	"github.com/remediate-dev/remediate/internal/kubeproxy"
	"github.com/remediate-dev/remediate/internal/node"
	"github.com/remediate-dev/remediate/policy"
)

// Real captures of kube-proxy v1.34.4 and the hand-built 1.32 formats live
// in internal/kubeproxy/testdata.
func kpFixture(t testing.TB, name string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("..", "internal", "kubeproxy", "testdata", name))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// Times of the captures: the stalled scrape and the 503 were taken at
// 11:43:52.84Z; the last successful IPv4 sync was 11:43:18.87Z.
var (
	captureHealthy = time.Date(2026, 11, 21, 11, 43, 24, 0, time.UTC)
	captureStalled = time.Date(2026, 11, 21, 11, 43, 52, 840000000, time.UTC)
)

// famSample is one family's state in a synthetic scrape.
type famSample struct {
	lastSync, lastQueued float64
	buckets              []uint64 // cumulative counts for le 0.001 * 2^i, 15 buckets
	count                uint64
	failures, partial    float64
	noFailures           bool // omit the failure series (1.33+ before the first failure)
	nat                  float64
}

// metricsText renders a scrape in the 1.33+ schema (labelled) or the
// 1.30-1.32 one (one unlabelled family).
func metricsText(labelled bool, pending float64, fams map[kubeproxy.Family]famSample) string {
	var b strings.Builder
	names := make([]string, 0, len(fams))
	for f := range fams {
		names = append(names, string(f))
	}
	sort.Strings(names)
	lbl := func(f string, extra string) string {
		var parts []string
		if labelled {
			parts = append(parts, fmt.Sprintf("ip_family=%q", f))
		}
		if extra != "" {
			parts = append(parts, extra)
		}
		if len(parts) == 0 {
			return ""
		}
		return "{" + strings.Join(parts, ",") + "}"
	}
	fmt.Fprintf(&b, "# TYPE kubeproxy_sync_proxy_rules_endpoint_changes_pending gauge\nkubeproxy_sync_proxy_rules_endpoint_changes_pending %g\n", pending)
	b.WriteString("# TYPE kubeproxy_sync_proxy_rules_last_timestamp_seconds gauge\n")
	for _, f := range names {
		fmt.Fprintf(&b, "kubeproxy_sync_proxy_rules_last_timestamp_seconds%s %.9e\n", lbl(f, ""), fams[kubeproxy.Family(f)].lastSync)
	}
	b.WriteString("# TYPE kubeproxy_sync_proxy_rules_last_queued_timestamp_seconds gauge\n")
	for _, f := range names {
		fmt.Fprintf(&b, "kubeproxy_sync_proxy_rules_last_queued_timestamp_seconds%s %.9e\n", lbl(f, ""), fams[kubeproxy.Family(f)].lastQueued)
	}
	b.WriteString("# TYPE kubeproxy_sync_proxy_rules_duration_seconds histogram\n")
	for _, f := range names {
		s := fams[kubeproxy.Family(f)]
		for i := 0; i < 15; i++ {
			var c uint64
			if i < len(s.buckets) {
				c = s.buckets[i]
			} else if len(s.buckets) > 0 {
				c = s.buckets[len(s.buckets)-1]
			}
			fmt.Fprintf(&b, "kubeproxy_sync_proxy_rules_duration_seconds_bucket%s %d\n", lbl(f, fmt.Sprintf("le=%q", fmt.Sprint(0.001*float64(int(1)<<i)))), c)
		}
		fmt.Fprintf(&b, "kubeproxy_sync_proxy_rules_duration_seconds_bucket%s %d\n", lbl(f, `le="+Inf"`), s.count)
		fmt.Fprintf(&b, "kubeproxy_sync_proxy_rules_duration_seconds_sum%s 1\n", lbl(f, ""))
		fmt.Fprintf(&b, "kubeproxy_sync_proxy_rules_duration_seconds_count%s %d\n", lbl(f, ""), s.count)
	}
	b.WriteString("# TYPE kubeproxy_sync_proxy_rules_iptables_restore_failures_total counter\n")
	for _, f := range names {
		if s := fams[kubeproxy.Family(f)]; !s.noFailures {
			fmt.Fprintf(&b, "kubeproxy_sync_proxy_rules_iptables_restore_failures_total%s %g\n", lbl(f, ""), s.failures)
		}
	}
	b.WriteString("# TYPE kubeproxy_sync_proxy_rules_iptables_partial_restore_failures_total counter\n")
	for _, f := range names {
		if s := fams[kubeproxy.Family(f)]; !s.noFailures {
			fmt.Fprintf(&b, "kubeproxy_sync_proxy_rules_iptables_partial_restore_failures_total%s %g\n", lbl(f, ""), s.partial)
		}
	}
	b.WriteString("# TYPE kubeproxy_sync_proxy_rules_iptables_total gauge\n")
	for _, f := range names {
		fmt.Fprintf(&b, "kubeproxy_sync_proxy_rules_iptables_total%s %g\n", lbl(f, `table="nat"`), fams[kubeproxy.Family(f)].nat)
	}
	return b.String()
}

// kpServer is kube-proxy served over HTTP by a test server whose answers
// the test changes between scrapes.
type kpServer struct {
	mu      sync.Mutex
	metrics string
	hStatus int
	health  string
	mode    string
	down    bool
}

func (s *kpServer) set(f func(s *kpServer)) {
	s.mu.Lock()
	defer s.mu.Unlock()
	f(s)
}

func (s *kpServer) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.down {
		// Looks like a dead endpoint: close without an answer.
		if hj, ok := w.(http.Hijacker); ok {
			c, _, _ := hj.Hijack()
			c.Close()
			return
		}
	}
	switch r.URL.Path {
	case "/metrics":
		fmt.Fprint(w, s.metrics)
	case "/healthz":
		w.WriteHeader(s.hStatus)
		fmt.Fprint(w, s.health)
	case "/proxyMode":
		fmt.Fprint(w, s.mode)
	}
}

// newKPNode returns a node whose kube-proxy adapter is the real Client
// talking to a test server, with a fake clock.
func newKPNode(t *testing.T, syncPeriod time.Duration, start time.Time) (*node.Node, *kpServer, *clocktesting.FakeClock) {
	t.Helper()
	s := &kpServer{hStatus: 200, health: kpFixture(t, "healthz-v1.34-healthy.json"), mode: "iptables"}
	ts := httptest.NewServer(s)
	t.Cleanup(ts.Close)
	clk := clocktesting.NewFakeClock(start)
	c, err := kubeproxy.New(kubeproxy.Options{
		MetricsURL: ts.URL + "/metrics", HealthzURL: ts.URL + "/healthz", ProxyModeURL: ts.URL + "/proxyMode",
		SyncPeriod: syncPeriod, Timeout: 2 * time.Second, Clock: clk, CacheTTL: time.Second,
	})
	if err != nil {
		t.Fatal(err)
	}
	return &node.Node{Name: "node1", Clock: clk, Log: zap.NewNop(), KubeProxy: c}, s, clk
}

func newDetector(t *testing.T, name string, n *node.Node, tweak func(p any)) Detector {
	t.Helper()
	typ, ok := Lookup(name)
	if !ok {
		t.Fatalf("detector %s not registered", name)
	}
	p := typ.NewParams()
	if tweak != nil {
		tweak(p)
	}
	if v, ok := p.(policy.Validator); ok {
		if errs := v.Validate(); len(errs) > 0 {
			t.Fatalf("%s params %+v invalid: %v", name, p, errs)
		}
	}
	d, err := typ.New(p, n)
	if err != nil {
		t.Fatal(err)
	}
	if w, ok := d.(interface{ Unwrap() Detector }); ok {
		return w.Unwrap() // tests reach the detector's own type
	}
	return d
}

func targets(fs []finding.Finding) []string {
	out := make([]string, 0, len(fs))
	for _, f := range fs {
		out = append(out, f.Target)
	}
	sort.Strings(out)
	return out
}

func wantTargets(t *testing.T, what string, fs []finding.Finding, err error, want ...string) {
	t.Helper()
	if err != nil {
		t.Fatalf("%s: %v", what, err)
	}
	got := targets(fs)
	if strings.Join(got, ",") != strings.Join(want, ",") {
		t.Fatalf("%s: targets %v, want %v; findings %+v", what, got, want, fs)
	}
}

func TestKubeProxyDetectorsSkipWithoutAdapter(t *testing.T) {
	n := &node.Node{Clock: clocktesting.NewFakeClock(time.Now()), Unavailable: map[string]string{"kube-proxy": "no kube-proxy URL configured"}}
	for _, name := range []string{"KubeProxySyncStale", "KubeProxySyncSlow", "KubeProxyEndpointChangesPending",
		"KubeProxyRestoreFailures", "KubeProxyUnhealthy", "KubeProxyUnreachable", "KubeProxyRuleBloat"} {
		_, err := newDetector(t, name, n, nil).Detect(context.Background())
		if r, ok := finding.IsSkip(err); !ok || r != "no kube-proxy URL configured" {
			t.Errorf("%s: err %v, want skip with the recorded reason", name, err)
		}
	}
}
