package kubeproxy

import (
	"context"
	"errors"
	"testing"
	"time"

	clocktesting "k8s.io/utils/clock/testing"
)

func TestFake(t *testing.T) {
	ctx := context.Background()
	clk := clocktesting.NewFakeClock(time.Unix(1795261432, 0))
	f := NewFake(clk, 10*time.Second)
	if _, err := f.Metrics(ctx); err == nil {
		t.Fatal("Metrics before SetMetrics succeeded")
	} else if e, ok := AsError(err); !ok || e.Kind != KindUnreachable {
		t.Fatalf("unset metrics: %v, want an unreachable *Error", err)
	}
	f.SetMetrics(string(readFixture(t, "metrics-v1.34-stalled.txt")))
	s1, err := f.Metrics(ctx)
	if err != nil || *s1.Metrics.Families["IPv4"].RestoreFailures != 1 {
		t.Fatalf("Metrics = %+v, %v", s1, err)
	}
	clk.Step(time.Second)
	s2, _ := f.Metrics(ctx)
	if s2.Seq != s1.Seq+1 || !s2.At.Equal(clk.Now()) {
		t.Errorf("second scrape seq %d at %v, want %d at %v", s2.Seq, s2.At, s1.Seq+1, clk.Now())
	}
	f.SetMetrics("kubeproxy_x{ 1\n")
	if _, err := f.Metrics(ctx); err == nil {
		t.Error("malformed text accepted")
	} else if e, ok := AsError(err); !ok || e.Kind != KindBadResponse {
		t.Errorf("malformed: %v, want a bad-response *Error", err)
	}
	boom := errors.New("boom")
	f.SetMetricsError(boom)
	if _, err := f.Metrics(ctx); !errors.Is(err, boom) {
		t.Errorf("injected error: %v", err)
	}

	f.SetHealthz(503, string(readFixture(t, "healthz-v1.34-stalled.json")))
	h, err := f.Healthz(ctx)
	if err != nil || h.Healthy || len(h.UnhealthyFamilies()) != 1 {
		t.Errorf("Healthz = %+v, %v", h, err)
	}
	f.SetMode(ModeIPVS, nil)
	if m, _ := f.ProxyMode(ctx); m != ModeIPVS || f.SyncPeriod() != 10*time.Second {
		t.Errorf("mode %q, syncPeriod %v", m, f.SyncPeriod())
	}
	if f.MetricsCalls != 5 || f.HealthzCalls != 1 || f.ProxyModeCalls != 1 {
		t.Errorf("calls %d %d %d", f.MetricsCalls, f.HealthzCalls, f.ProxyModeCalls)
	}
}

func TestFamilyTarget(t *testing.T) {
	for _, f := range []Family{"IPv4", "IPv6", Unlabelled} {
		if got, err := FamilyFromTarget(f.Target()); err != nil || got != f {
			t.Errorf("FamilyFromTarget(%q) = %q, %v", f.Target(), got, err)
		}
	}
	if _, err := FamilyFromTarget("kube-proxy/IPv5"); err == nil {
		t.Error("accepted IPv5")
	}
}
