package detect

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	clocktesting "k8s.io/utils/clock/testing"

	"github.com/remediate-dev/remediate/internal/finding"
	"github.com/remediate-dev/remediate/internal/kubeproxy"
	"github.com/remediate-dev/remediate/internal/node"
)

func churnMetrics(changes float64) string {
	return fmt.Sprintf("# TYPE kubeproxy_sync_proxy_rules_endpoint_changes_total counter\nkubeproxy_sync_proxy_rules_endpoint_changes_total %g\n", changes)
}

// KubeProxyEndpointChurn judges the rate per second, as field guide 2's
// alert (rate(...[5m]) > 10) means it: 11 changes in 5 minutes is a quiet
// cluster, 3,300 (11/s) is churn. Not judged inside 30 s of scrapes; a
// counter that goes down (kube-proxy restarted) starts the window again.
func TestKubeProxyEndpointChurn(t *testing.T) {
	clk := clocktesting.NewFakeClock(time.Unix(1_800_000_000, 0))
	kp := kubeproxy.NewFake(clk, 30*time.Second)
	n := &node.Node{Name: "n1", Clock: clk, KubeProxy: kp}
	d := newDetector(t, "KubeProxyEndpointChurn", n, nil)
	ctx := context.Background()
	step := func(changes float64, after time.Duration) []finding.Finding {
		t.Helper()
		clk.Step(after)
		kp.SetMetrics(churnMetrics(changes))
		fs, err := d.Detect(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return fs
	}
	if fs := step(1000, 0); len(fs) != 0 {
		t.Fatalf("first scrape: %+v", fs)
	}
	if fs := step(1600, 20*time.Second); len(fs) != 0 { // 30/s, but only 20 s seen
		t.Fatalf("inside 30 s: %+v", fs)
	}
	fs := step(1600, 10*time.Second) // 600 in 30 s: 20/s
	if len(fs) != 1 || fs[0].Target != "kube-proxy" || fs[0].Evidence["changesPerSecond"] != 20.0 ||
		!strings.Contains(fs[0].Message, "20 endpoint changes per second over the last 30s (600 changes; limit 10/s)") {
		t.Fatalf("20/s: %+v", fs)
	}
	// kube-proxy restarted: the counter starts again, no rate from the drop.
	if fs := step(5, 30*time.Second); len(fs) != 0 {
		t.Fatalf("restart: %+v", fs)
	}
	// The guide's threshold read as 10 per 5 minutes would fire here.
	if fs := step(16, 5*time.Minute); len(fs) != 0 {
		t.Fatalf("11 changes in 5 min: %+v", fs)
	}
	if fs := step(16+3300, 5*time.Minute); len(fs) != 1 || fs[0].Evidence["changesPerSecond"] != 11.0 {
		t.Fatalf("3300 changes in 5 min (11/s): %+v", fs)
	}
	// No counter: skipped with the reason.
	kp.SetMetrics("# TYPE kubeproxy_sync_proxy_rules_last_timestamp_seconds gauge\nkubeproxy_sync_proxy_rules_last_timestamp_seconds 1\n")
	if _, err := d.Detect(ctx); func() bool { _, ok := finding.IsSkip(err); return !ok }() {
		t.Fatalf("no counter: %v", err)
	}
}

func restMetrics(codes map[string]float64) string {
	var b strings.Builder
	b.WriteString("# TYPE rest_client_requests_total counter\n")
	for c, v := range codes {
		fmt.Fprintf(&b, "rest_client_requests_total{code=%q,host=\"10.0.0.1:6443\",method=\"GET\"} %g\n", c, v)
	}
	return b.String()
}

// KubeProxyAPIErrors: 403, 429, 5xx and no-response requests within the
// window are a finding of their own (a 404 is not), critical when none
// succeeded; counted over the window, so old errors age out.
func TestKubeProxyAPIErrors(t *testing.T) {
	clk := clocktesting.NewFakeClock(time.Unix(1_800_000_000, 0))
	kp := kubeproxy.NewFake(clk, 30*time.Second)
	n := &node.Node{Name: "n1", Clock: clk, KubeProxy: kp}
	d := newDetector(t, "KubeProxyAPIErrors", n, nil)
	ctx := context.Background()
	step := func(codes map[string]float64, after time.Duration) []finding.Finding {
		t.Helper()
		clk.Step(after)
		kp.SetMetrics(restMetrics(codes))
		fs, err := d.Detect(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return fs
	}
	if fs := step(map[string]float64{"200": 10, "403": 5}, 0); len(fs) != 0 {
		t.Fatalf("first scrape (lifetime errors are not judged): %+v", fs)
	}
	if fs := step(map[string]float64{"200": 20, "403": 5, "404": 3}, 30*time.Second); len(fs) != 0 {
		t.Fatalf("404 only: %+v", fs)
	}
	// RBAC took kube-proxy's list/watch away: 403s, some requests still fine.
	fs := step(map[string]float64{"200": 25, "403": 9, "404": 3}, 30*time.Second)
	if len(fs) != 1 || fs[0].Target != "kube-proxy/api-requests" || fs[0].Severity != finding.Warning ||
		!strings.Contains(fs[0].Message, "4 of kube-proxy's 22 requests") || !strings.Contains(fs[0].Message, "403: 4") {
		t.Fatalf("403: %+v", fs)
	}
	// Throttled and failing: nothing succeeds in the window any more.
	d = newDetector(t, "KubeProxyAPIErrors", n, nil)
	step(map[string]float64{"200": 25, "403": 9}, time.Minute)
	fs = step(map[string]float64{"200": 25, "403": 9, "429": 2, "503": 3, "<error>": 1}, 30*time.Second)
	if len(fs) != 1 || fs[0].Severity != finding.Critical || fs[0].Evidence["errors"] != 6.0 {
		t.Fatalf("429/5xx only: %+v", fs)
	}
	// Past the window the old errors age out.
	step(map[string]float64{"200": 40, "403": 9, "429": 2, "503": 3, "<error>": 1}, 5*time.Minute)
	if fs := step(map[string]float64{"200": 50, "403": 9, "429": 2, "503": 3, "<error>": 1}, time.Minute); len(fs) != 0 {
		t.Fatalf("errors older than the window: %+v", fs)
	}
	// A counter going down (kube-proxy restarted) restarts the window.
	if fs := step(map[string]float64{"200": 1}, time.Minute); len(fs) != 0 {
		t.Fatalf("restart: %+v", fs)
	}
}
