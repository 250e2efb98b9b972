package prometheusexporter

import (
	"net/netip"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/remediate-dev/remediate/detect"
	"github.com/remediate-dev/remediate/internal/conntrack"
	"github.com/remediate-dev/remediate/internal/finding"
	"github.com/remediate-dev/remediate/policy"
	"github.com/remediate-dev/remediate/remediate"
)

// The conntrack gauges carry the cycle's breakdown, with a fixed label set
// (every class exported at 0 from the start), fall back to 0 when the
// ConntrackExhaustion rule ran and found no breakdown, and keep their value
// in a cycle that skipped it or in which it failed (as the findings do),
// for KeepUnrenewedFor at most.
func TestConntrackGauges(t *testing.T) {
	reg := prometheus.NewRegistry()
	m := newEngineMetrics(reg)
	pol := &policy.Policy{Rules: []policy.Rule{{Name: "ct", Detector: policy.Component{Type: detect.ConntrackExhaustionName}}}}
	m.exportPolicy(pol, nil)
	if n := seriesCount(t, reg, "remediate_conntrack_entries_by_class"); n != len(conntrack.AllClasses()) {
		t.Fatalf("%d class series at start, want %d", n, len(conntrack.AllClasses()))
	}
	comp := conntrack.NewComposer(5, 0)
	for i := 0; i < 30; i++ {
		f := conntrack.Flow{Proto: conntrack.ProtoUDP, OrigSrc: netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, 1, 0, byte(i % 3)}), 1),
			OrigDst: netip.MustParseAddrPort("10.96.0.10:53"), Status: conntrack.StatusSeenReply}
		if i >= 24 {
			f.Proto, f.TCPState, f.OrigDst = conntrack.ProtoTCP, conntrack.TCPStateTimeWait, netip.MustParseAddrPort("10.96.0.1:443")
		}
		comp.Add(&f)
	}
	ev := map[string]any{}
	res := comp.Result()
	res.PutEvidence(ev) // for people; the exporter reads the typed reference
	table := finding.Subject{Refs: []finding.Ref{conntrack.TableRef{Max: 100, Composition: &res}}}
	fs := []remediate.ReportFinding{
		{Rule: "ct", Finding: finding.Finding{Detector: detect.ConntrackExhaustionName, Target: conntrack.DriftTarget, Evidence: map[string]any{}}},
		{Rule: "ct", Finding: finding.Finding{Detector: detect.ConntrackExhaustionName, Target: conntrack.TableTarget, Evidence: ev, Subject: table}},
	}
	ran := map[string]bool{"ct": true}
	t0 := time.Date(2026, 11, 26, 4, 0, 0, 0, time.UTC)
	cycle := func(findings []remediate.ReportFinding, ran map[string]bool, now time.Time) {
		m.zeroGauges(pol, now, ran) // as exportCycle does, first
		m.observeConntrack(pol, findings, ran, now)
	}
	cycle(fs, ran, t0)
	for class, want := range map[string]float64{"udp/stream": 24, "tcp/TIME_WAIT": 6, "udp/unreplied": 0, "icmp": 0} {
		if got := gaugeValue(t, m.ConntrackEntries.WithLabelValues(class)); got != want {
			t.Errorf("%s = %v, want %v", class, got, want)
		}
	}
	if got := gaugeValue(t, m.ConntrackTopShare.WithLabelValues("destination")); got != 0.8 {
		t.Errorf("destination share %v", got)
	}
	if got := gaugeValue(t, m.ConntrackTopShare.WithLabelValues("source")); got < 0.33 || got > 0.34 {
		t.Errorf("source share %v", got)
	}
	// Skipped (or failed) from then on: the value is kept for
	// KeepUnrenewedFor, then let go (held for ever, a breakdown nobody
	// renews would keep its alert firing).
	for i := 1; time.Duration(i)*time.Minute <= KeepUnrenewedFor; i++ {
		cycle(nil, map[string]bool{}, t0.Add(time.Duration(i)*time.Minute))
		if got := gaugeValue(t, m.ConntrackEntries.WithLabelValues("udp/stream")); got != 24 {
			t.Fatalf("%d min after the last cycle that ran the rule: %v, want 24 (kept)", i, got)
		}
	}
	cycle(nil, map[string]bool{}, t0.Add(KeepUnrenewedFor+time.Minute))
	if got := gaugeValue(t, m.ConntrackEntries.WithLabelValues("udp/stream")); got != 0 {
		t.Errorf("skipped longer than KeepUnrenewedFor: %v, want 0", got)
	}
	if got := gaugeValue(t, m.ConntrackTopShare.WithLabelValues("destination")); got != 0 {
		t.Errorf("destination share skipped longer than KeepUnrenewedFor: %v, want 0", got)
	}
	cycle(fs, ran, t0.Add(KeepUnrenewedFor+2*time.Minute))
	if got := gaugeValue(t, m.ConntrackEntries.WithLabelValues("udp/stream")); got != 24 {
		t.Errorf("ran again: %v, want 24", got)
	}
	cycle(nil, ran, t0.Add(KeepUnrenewedFor+3*time.Minute))
	if got := gaugeValue(t, m.ConntrackEntries.WithLabelValues("udp/stream")); got != 0 {
		t.Errorf("after a cycle without breakdown: %v", got)
	}
	if n := seriesCount(t, reg, "remediate_conntrack_entries_by_class"); n != len(conntrack.AllClasses()) {
		t.Errorf("%d class series, want %d (bounded)", n, len(conntrack.AllClasses()))
	}
}
