package detect

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/remediate-dev/remediate/internal/finding"
	"github.com/remediate-dev/remediate/internal/kubeproxy"
	"github.com/remediate-dev/remediate/internal/node"
)

// TestUnknownIPFamiliesIgnoredWithOneWarning: 20,000 ip_family values from
// a kube-proxy endpoint became 40k findings (issue 13). They are ignored,
// with one warning however many scrapes repeat them.
func TestUnknownIPFamiliesIgnoredWithOneWarning(t *testing.T) {
	ignoredFamiliesWarned.Store(false)
	clk := clocktesting.NewFakeClock(time.Date(2026, 11, 23, 12, 0, 0, 0, time.UTC))
	kp := kubeproxy.NewFake(clk, 30*time.Second)
	var b strings.Builder
	b.WriteString("# TYPE kubeproxy_sync_proxy_rules_last_timestamp_seconds gauge\n")
	b.WriteString("# TYPE kubeproxy_sync_proxy_rules_last_queued_timestamp_seconds gauge\n")
	for i := 0; i < 20000; i++ {
		fmt.Fprintf(&b, "kubeproxy_sync_proxy_rules_last_timestamp_seconds{ip_family=\"f%d\"} 1\n", i)
		fmt.Fprintf(&b, "kubeproxy_sync_proxy_rules_last_queued_timestamp_seconds{ip_family=\"f%d\"} 2\n", i)
	}
	kp.SetMetrics(b.String())
	core, logs := observer.New(zap.WarnLevel)
	n := &node.Node{Name: "n1", Clock: clk, Log: zap.New(core), KubeProxy: kp}
	d := newIssue3Detector(t, "KubeProxySyncStale", n, nil)
	for i := 0; i < 3; i++ {
		fs, err := d.Detect(context.Background())
		if err != nil {
			if _, skip := finding.IsSkip(err); !skip {
				t.Fatal(err)
			}
		}
		if len(fs) > 2 {
			t.Fatalf("%d findings from unknown families", len(fs))
		}
		clk.Step(time.Minute)
	}
	if n := logs.FilterMessageSnippet("other than IPv4/IPv6").Len(); n != 1 {
		t.Errorf("%d warnings, want 1", n)
	}
}
