package main

import (
	"reflect"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

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
