package kubeproxy

import (
	"testing"
)

// BenchmarkParseMetrics parses a full real /metrics capture (~100 KB, the
// whole kube-proxy exposition, of which the detectors use a few series) as
// the client does, from the body it read.
func BenchmarkParseMetrics(b *testing.B) {
	in := readFixture(b, "metrics-v1.34-stalled.txt")
	b.SetBytes(int64(len(in)))
	b.ReportAllocs()
	for i := 0; i < b.N; i++ {
		if _, err := parseMetrics(in); err != nil {
			b.Fatal(err)
		}
	}
}
