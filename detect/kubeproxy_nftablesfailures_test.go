package detect

import (
	"context"
	"os"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/remediate-dev/remediate/internal/finding"
	"github.com/remediate-dev/remediate/internal/kubeproxy"
	"github.com/remediate-dev/remediate/internal/node"
)

// readKubeProxyFixture reads a real kube-proxy capture of internal/kubeproxy.
func readKubeProxyFixture(t *testing.T, name string) string {
	t.Helper()
	b, err := os.ReadFile("../internal/kubeproxy/testdata/" + name)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func TestKubeProxyNFTablesFailures(t *testing.T) {
	clk := clocktesting.NewFakeClock(time.Unix(1_795_443_431, 0))
	kp := kubeproxy.NewFake(clk, 10*time.Second)
	kp.SetMode(kubeproxy.ModeNFTables, nil)
	n := &node.Node{Clock: clk, Log: zap.NewNop(), KubeProxy: kp}
	d := newDetector(t, "KubeProxyNFTablesFailures", n, nil)
	ctx := context.Background()
	step := func(metrics string) ([]finding.Finding, error) {
		kp.SetMetrics(metrics)
		clk.Step(10 * time.Second)
		return d.Detect(ctx)
	}
	healthy := readKubeProxyFixture(t, "metrics-v1.34-nftables-healthy.txt")
	failed := readKubeProxyFixture(t, "metrics-v1.34-nftables-syncfailure.txt")
	fs, err := step(healthy)
	wantTargets(t, "first scrape", fs, err)
	fs, err = step(healthy)
	wantTargets(t, "healthy", fs, err)
	if j := d.(Judged).Judged(); j != "no nftables sync or cleanup failure increase over the last 40s" {
		t.Errorf("judged %q", j)
	}
	// The real capture after the table was deleted and a sync failed.
	fs, err = step(failed)
	wantTargets(t, "sync failure", fs, err, "kube-proxy/IPv4")
	if f := fs[0]; f.Severity != finding.Critical || f.Evidence["syncFailures"] != 1.0 || !strings.Contains(f.Message, "not being updated") {
		t.Errorf("finding %+v", f)
	}
	// Out of the 4 x syncPeriod window: clears.
	for i := 0; i < 5; i++ {
		fs, err = step(failed)
	}
	wantTargets(t, "after the window", fs, err)
	// A kube-proxy restart (counters back to absent = 0) is not a failure.
	fs, err = step(healthy)
	wantTargets(t, "restart", fs, err)

	// Cleanup failures: a warning over the limit of 2.
	cleanup := strings.Replace(healthy, "# HELP kubeproxy_sync_proxy_rules_last_queued",
		"kubeproxy_sync_proxy_rules_nftables_cleanup_failures_total{ip_family=\"IPv6\"} 3\n# HELP kubeproxy_sync_proxy_rules_last_queued", 1)
	fs, err = step(cleanup)
	wantTargets(t, "cleanup failures", fs, err, "kube-proxy/IPv6")
	if fs[0].Severity != finding.Warning {
		t.Errorf("cleanup finding %+v", fs[0])
	}

	// iptables mode: skip with the reason.
	kp.SetMode(kubeproxy.ModeIPTables, nil)
	if _, err := d.Detect(ctx); err == nil {
		t.Error("iptables mode: no skip")
	} else if r, ok := finding.IsSkip(err); !ok || !strings.Contains(r, "iptables mode") {
		t.Errorf("iptables mode: %v", err)
	}
}

// In nftables mode the iptables-only detectors skip, naming the mode.
func TestIPTablesOnlyDetectorsSkipInNFTablesMode(t *testing.T) {
	clk := clocktesting.NewFakeClock(time.Unix(1_795_443_431, 0))
	kp := kubeproxy.NewFake(clk, 10*time.Second)
	kp.SetMode(kubeproxy.ModeNFTables, nil)
	kp.SetMetrics(readKubeProxyFixture(t, "metrics-v1.34-nftables-healthy.txt"))
	n := &node.Node{Clock: clk, Log: zap.NewNop(), KubeProxy: kp}
	for _, name := range []string{"KubeProxyRestoreFailures", "KubeProxyRuleBloat"} {
		_, err := newDetector(t, name, n, nil).Detect(context.Background())
		if r, ok := finding.IsSkip(err); !ok || !strings.Contains(r, "nftables mode") {
			t.Errorf("%s: %v, want a skip naming nftables mode", name, err)
		}
	}
}
