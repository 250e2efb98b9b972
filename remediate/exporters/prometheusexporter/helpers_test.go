package prometheusexporter

import (
	"strconv"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

// The package's tests read metrics back through these: one way to gather.

func gaugeValue(t *testing.T, g prometheus.Gauge) float64 {
	t.Helper()
	var m dto.Metric
	if err := g.Write(&m); err != nil {
		t.Fatal(err)
	}
	return m.GetGauge().GetValue()
}

func seriesCount(t *testing.T, g prometheus.Gatherer, name string) int {
	t.Helper()
	mfs, err := g.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name {
			return len(mf.GetMetric())
		}
	}
	return 0
}

// sample is the gathered series of family name whose labels include
// labels, and whether it is exported.
func sample(t *testing.T, g prometheus.Gatherer, name string, labels map[string]string) (*dto.Metric, bool) {
	t.Helper()
	mfs, err := g.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	next:
		for _, m := range mf.GetMetric() {
			got := map[string]string{}
			for _, l := range m.GetLabel() {
				got[l.GetName()] = l.GetValue()
			}
			for k, v := range labels {
				if got[k] != v {
					continue next
				}
			}
			return m, true
		}
	}
	return nil, false
}

// gatherText is g's series as `name{labels} value` lines (labels sorted
// by name, as gathered).
func gatherText(t *testing.T, g prometheus.Gatherer) string {
	t.Helper()
	mfs, err := g.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			b.WriteString(mf.GetName())
			if len(m.GetLabel()) > 0 {
				b.WriteString("{")
				for i, l := range m.GetLabel() {
					if i > 0 {
						b.WriteString(",")
					}
					b.WriteString(l.GetName() + "=\"" + l.GetValue() + "\"")
				}
				b.WriteString("}")
			}
			b.WriteString(" " + strings.TrimSuffix(strings.TrimSuffix(formatFloat(m.GetGauge().GetValue()+m.GetCounter().GetValue()), ".0"), ".") + "\n")
		}
	}
	return b.String()
}

func formatFloat(v float64) string { return strconv.FormatFloat(v, 'g', -1, 64) }
