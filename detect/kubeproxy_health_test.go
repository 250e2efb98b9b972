package detect

import (
	"context"
	"net"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/remediate-dev/remediate/internal/finding"
	"github.com/remediate-dev/remediate/internal/kubeproxy"
	"github.com/remediate-dev/remediate/internal/node"
	"github.com/remediate-dev/remediate/internal/procs"
	"github.com/remediate-dev/remediate/policy"
)

func TestKubeProxyUnhealthyOnCaptures(t *testing.T) {
	for _, tc := range []struct {
		file   string
		status int
		want   []string
	}{
		{"healthz-v1.34-healthy.json", 200, nil},
		{"healthz-v1.34-stalled.json", 503, []string{"kube-proxy/IPv4"}},
		{"healthz-v1.32-healthy.json", 200, nil},
		{"healthz-v1.32-stalled.json", 503, []string{"kube-proxy"}},
		{"healthz-v1.32-ineligible.json", 503, nil}, // node being deleted: not a fault
	} {
		t.Run(tc.file, func(t *testing.T) {
			n, s, _ := newKPNode(t, 10*time.Second, captureStalled)
			s.set(func(s *kpServer) { s.hStatus, s.health = tc.status, kpFixture(t, tc.file) })
			fs, err := newDetector(t, "KubeProxyUnhealthy", n, nil).Detect(context.Background())
			wantTargets(t, tc.file, fs, err, tc.want...)
			if len(fs) == 1 && tc.status == 503 && strings.Contains(tc.file, "v1.34") {
				if fs[0].Evidence["familyLastUpdated"] != "2026-11-21T11:43:18.871032366Z" {
					t.Errorf("evidence %v", fs[0].Evidence)
				}
				if !strings.Contains(fs[0].Message, "IPv4 unhealthy") || !strings.Contains(fs[0].Message, "34s") {
					t.Errorf("message %q", fs[0].Message)
				}
			}
		})
	}
}

func TestKubeProxyUnreachable(t *testing.T) {
	ctx := context.Background()
	t.Run("healthy", func(t *testing.T) {
		n, s, _ := newKPNode(t, 10*time.Second, captureHealthy)
		s.set(func(s *kpServer) { s.metrics = kpFixture(t, "metrics-v1.34-healthy.txt") })
		fs, err := newDetector(t, "KubeProxyUnreachable", n, nil).Detect(ctx)
		wantTargets(t, "healthy", fs, err)
	})
	t.Run("malformed metrics and a 503 healthz", func(t *testing.T) {
		n, s, _ := newKPNode(t, 10*time.Second, captureHealthy)
		s.set(func(s *kpServer) {
			s.metrics = "kubeproxy_sync_proxy_rules_last_timestamp_seconds{ip_family=\n"
			s.hStatus, s.health = 503, kpFixture(t, "healthz-v1.34-stalled.json")
		})
		fs, err := newDetector(t, "KubeProxyUnreachable", n, nil).Detect(ctx)
		wantTargets(t, "malformed", fs, err, "kube-proxy/metrics")
		if fs[0].Evidence["kind"] != string(kubeproxy.KindBadResponse) || fs[0].Severity != finding.Warning {
			t.Errorf("finding %+v", fs[0])
		}
		// The other detectors cannot tell, and say so with a skip naming
		// the cause (the rule's state stays as it was).
		if _, err := newDetector(t, "KubeProxySyncStale", n, nil).Detect(ctx); err == nil {
			t.Error("KubeProxySyncStale on malformed metrics: no error")
		} else if r, ok := finding.IsSkip(err); !ok || !strings.Contains(r, "bad-response") {
			t.Errorf("KubeProxySyncStale on malformed metrics: %v, want a skip naming the bad response", err)
		}
	})
	t.Run("connection closed", func(t *testing.T) {
		n, s, _ := newKPNode(t, 10*time.Second, captureHealthy)
		s.set(func(s *kpServer) { s.down = true })
		fs, err := newDetector(t, "KubeProxyUnreachable", n, nil).Detect(ctx)
		wantTargets(t, "down", fs, err, "kube-proxy/healthz", "kube-proxy/metrics")
		for _, f := range fs {
			if f.Evidence["kind"] != string(kubeproxy.KindUnreachable) || f.Severity != finding.Critical {
				t.Errorf("finding %+v", f)
			}
		}
	})
	t.Run("connection refused", func(t *testing.T) {
		c, _ := refusingKubeProxy(t)
		n := &node.Node{Clock: clocktesting.NewFakeClock(captureHealthy), Log: zap.NewNop(), KubeProxy: c}
		fs, err := newDetector(t, "KubeProxyUnreachable", n, nil).Detect(ctx)
		wantTargets(t, "refused", fs, err, "kube-proxy/healthz", "kube-proxy/metrics")
		if !strings.Contains(fs[0].Message, "refused") {
			t.Errorf("message %q", fs[0].Message)
		}
	})
	t.Run("huge response", func(t *testing.T) {
		n, s, clk := newKPNode(t, 10*time.Second, captureHealthy)
		s.set(func(s *kpServer) { s.metrics = strings.Repeat("# padding padding padding padding padding\n", 300000) })
		fs, err := newDetector(t, "KubeProxyUnreachable", n, nil).Detect(ctx)
		wantTargets(t, "huge", fs, err, "kube-proxy/metrics")
		if !strings.Contains(fs[0].Message, "size limit") {
			t.Errorf("message %q", fs[0].Message)
		}
		clk.Step(time.Minute)
	})
}

func TestKubeProxyRuleBloat(t *testing.T) {
	m := parseKP(t, kpFixture(t, "metrics-v1.34-stalled.txt")) // nat: IPv4 29, IPv6 5
	fs, exported := ruleBloatFindings(m, KubeProxyRuleBloatParams{Table: "nat", MaxRules: 10})
	wantTargets(t, "bloat", fs, nil, "kube-proxy/IPv4")
	if !exported || fs[0].Evidence["rules"] != 29.0 {
		t.Errorf("finding %+v exported %v", fs, exported)
	}
	if fs, _ := ruleBloatFindings(m, KubeProxyRuleBloatParams{Table: "nat", MaxRules: 100000}); len(fs) != 0 {
		t.Errorf("findings under the limit: %+v", fs)
	}
	m32 := parseKP(t, kpFixture(t, "metrics-v1.32-stalled.txt"))
	fs, _ = ruleBloatFindings(m32, KubeProxyRuleBloatParams{Table: "nat", MaxRules: 10})
	wantTargets(t, "bloat 1.32", fs, nil, "kube-proxy")
	if _, exported := ruleBloatFindings(m, KubeProxyRuleBloatParams{Table: "mangle", MaxRules: 10}); exported {
		t.Error("mangle reported as exported")
	}

	n, s, _ := newKPNode(t, 10*time.Second, captureHealthy)
	s.set(func(s *kpServer) { s.metrics = kpFixture(t, "metrics-v1.34-healthy.txt") })
	_, err := newDetector(t, "KubeProxyRuleBloat", n, func(p any) { p.(*KubeProxyRuleBloatParams).Table = "mangle" }).Detect(context.Background())
	if _, ok := finding.IsSkip(err); !ok {
		t.Errorf("missing series: %v, want skip", err)
	}
}

func TestKubeProxyParamsValidate(t *testing.T) {
	cases := []struct {
		name  string
		errs  []string
		field string
	}{
		{"stale factor", fields((&KubeProxySyncStaleParams{Factor: 0.05, RequireQueued: true}).Validate()), "factor"},
		{"slow quantile", fields((&KubeProxySyncSlowParams{Quantile: 1, Fraction: 0.5, MinSyncs: 3}).Validate()), "quantile"},
		{"slow fraction", fields((&KubeProxySyncSlowParams{Quantile: 0.99, Fraction: 0, MinSyncs: 3}).Validate()), "fraction"},
		{"slow minSyncs", fields((&KubeProxySyncSlowParams{Quantile: 0.99, Fraction: 0.5}).Validate()), "minSyncs"},
		{"pending scrapes", fields((&KubeProxyEndpointChangesPendingParams{Scrapes: 1}).Validate()), "scrapes"},
		{"restore maxFailures", fields((&KubeProxyRestoreFailuresParams{MaxFailures: -1}).Validate()), "maxFailures"},
		{"restore maxPartialFailures", fields((&KubeProxyRestoreFailuresParams{MaxPartialFailures: -2}).Validate()), "maxPartialFailures"},
		{"bloat table", fields((&KubeProxyRuleBloatParams{Table: "nats", MaxRules: 1}).Validate()), "table"},
		{"bloat maxRules", fields((&KubeProxyRuleBloatParams{Table: "nat"}).Validate()), "maxRules"},
	}
	for _, tc := range cases {
		if len(tc.errs) != 1 || tc.errs[0] != tc.field {
			t.Errorf("%s: errors on %v, want exactly %q", tc.name, tc.errs, tc.field)
		}
	}
}

func fields(errs []policy.FieldError) []string {
	var out []string
	for _, e := range errs {
		out = append(out, e.Field)
	}
	return out
}

// TestKubeProxyAbsentIsASkip: both endpoints refusing and no process that
// is this node's kube-proxy is a node without kube-proxy (a skip with the
// reason); the same refusals with this node's kube-proxy running stay
// findings. One named kube-proxy in another network namespace, or whose
// executable is no kube-proxy, is not this node's (issue 27, item 9).
func TestKubeProxyAbsentIsASkip(t *testing.T) {
	c, addr := refusingKubeProxy(t)
	pf := procs.NewFake(999)
	pf.NetNS = testNetNS
	pf.Add(fakeProc(1, 0, "systemd", procT0.Add(-time.Hour), "S", "/sbin/init"))
	pf.Add(fakeProc(42, 1, "kubelet", procT0.Add(-time.Hour), "S", "kubelet"))
	n := &node.Node{Clock: clocktesting.NewFakeClock(captureHealthy), Log: zap.NewNop(), KubeProxy: c, ProcRoot: t.TempDir(), Procs: pf}
	absent := func(what, reason string) {
		t.Helper()
		_, err := newDetector(t, "KubeProxyUnreachable", n, nil).Detect(context.Background())
		if r, ok := finding.IsSkip(err); !ok || !strings.Contains(r, "kube-proxy is not running on this node") || !strings.Contains(r, addr) || !strings.Contains(r, reason) {
			t.Fatalf("%s: %v, want a skip saying %q", what, err, reason)
		}
	}
	absent("no kube-proxy", "no process named kube-proxy")
	other := fakeProc(77, 1, "kube-proxy", procT0.Add(-time.Hour), "S", "kube-proxy")
	other.NetNS = "net:[4026532999]"
	pf.Add(other)
	absent("kube-proxy of another network namespace", "pid 77 runs in another network namespace")
	impostor := fakeProc(78, 1, "kube-proxy", procT0.Add(-time.Hour), "S", "kube-proxy")
	impostor.Exe = "/usr/bin/bash"
	pf.Add(impostor)
	absent("and an impostor", "pid 78's executable is /usr/bin/bash")
	mine := fakeProc(79, 1, "kube-proxy", procT0.Add(-time.Hour), "S", "kube-proxy")
	pf.Add(mine)
	fs, err := newDetector(t, "KubeProxyUnreachable", n, nil).Detect(context.Background())
	wantTargets(t, "running, refusing", fs, err, "kube-proxy/healthz", "kube-proxy/metrics")
}

// refusingKubeProxy is a kube-proxy client whose endpoints refuse
// connections (nothing listens on addr).
func refusingKubeProxy(t *testing.T) (*kubeproxy.Client, string) {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	c, err := kubeproxy.New(kubeproxy.Options{MetricsURL: "http://" + addr + "/metrics", HealthzURL: "http://" + addr + "/healthz",
		ProxyModeURL: "http://" + addr + "/proxyMode", Timeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	return c, addr
}
