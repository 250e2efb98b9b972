package prometheusexporter

import (
	"reflect"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/remediate-dev/remediate/internal/kubeproxy"
)

// Both families are exported from the start (0: not seen), then the last
// scrape's sync timestamps, without contacting kube-proxy.
func TestKubeProxySyncCollector(t *testing.T) {
	var sc *kubeproxy.Scrape
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(newKubeProxySyncCollector(func() *kubeproxy.Scrape { return sc }))
	gather := func() map[string]float64 {
		t.Helper()
		mfs, err := reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		got := map[string]float64{}
		for _, mf := range mfs {
			if mf.GetName() != "remediate_kube_proxy_last_sync_timestamp_seconds" {
				t.Errorf("unexpected family %s", mf.GetName())
			}
			for _, m := range mf.GetMetric() {
				got[m.GetLabel()[0].GetValue()] = m.GetGauge().GetValue()
			}
		}
		return got
	}
	if got, want := gather(), map[string]float64{"IPv4": 0, "IPv6": 0}; !reflect.DeepEqual(got, want) {
		t.Errorf("before a scrape: %v, want %v", got, want)
	}
	ts := 1.7639e9
	sc = &kubeproxy.Scrape{Metrics: &kubeproxy.Metrics{Families: map[kubeproxy.Family]*kubeproxy.FamilyMetrics{
		"IPv4": {LastSync: &ts}, "IPv6": {}}}}
	if got, want := gather(), map[string]float64{"IPv4": ts, "IPv6": 0}; !reflect.DeepEqual(got, want) {
		t.Errorf("after a scrape: %v, want %v", got, want)
	}
}

// kube-proxy's sync duration histogram is re-exported per family with its
// own buckets (both families always, empty until seen), and the syncPeriod
// only once known: the guides' sync alerts in deploy/alerts read them.
func TestKubeProxySyncDurationCollector(t *testing.T) {
	var sc *kubeproxy.Scrape
	var period time.Duration
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(newKubeProxySyncDurationCollector(func() *kubeproxy.Scrape { return sc }, func() time.Duration { return period }))
	gather := func() map[string]*dto.MetricFamily {
		t.Helper()
		mfs, err := reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		out := map[string]*dto.MetricFamily{}
		for _, mf := range mfs {
			out[mf.GetName()] = mf
		}
		return out
	}
	got := gather()
	if h := got["remediate_kube_proxy_sync_duration_seconds"]; h == nil || len(h.GetMetric()) != 2 || h.GetMetric()[0].GetHistogram().GetSampleCount() != 0 {
		t.Fatalf("before a scrape: %v", h)
	}
	if got["remediate_kube_proxy_sync_period_seconds"] != nil {
		t.Fatalf("period exported before it is known")
	}
	period = 30 * time.Second
	sc = &kubeproxy.Scrape{Metrics: &kubeproxy.Metrics{Families: map[kubeproxy.Family]*kubeproxy.FamilyMetrics{
		"IPv4": {SyncDuration: &kubeproxy.Histogram{Buckets: []kubeproxy.Bucket{{UpperBound: 1.024, CumulativeCount: 7}, {UpperBound: 8.192, CumulativeCount: 9}}, Count: 10, Sum: 30}}}}}
	got = gather()
	var v4 *dto.Histogram
	for _, m := range got["remediate_kube_proxy_sync_duration_seconds"].GetMetric() {
		if m.GetLabel()[0].GetValue() == "IPv4" {
			v4 = m.GetHistogram()
		}
	}
	if v4 == nil || v4.GetSampleCount() != 10 || v4.GetSampleSum() != 30 || len(v4.GetBucket()) != 2 ||
		v4.GetBucket()[0].GetUpperBound() != 1.024 || v4.GetBucket()[0].GetCumulativeCount() != 7 {
		t.Fatalf("IPv4 histogram %v", v4)
	}
	if p := got["remediate_kube_proxy_sync_period_seconds"]; p == nil || p.GetMetric()[0].GetGauge().GetValue() != 30 {
		t.Fatalf("period %v", p)
	}
}
