// Package kubelet reads the kubelet's own view of pod sandboxes and pod
// start-up from its authenticated /metrics (issue 28 item 3): the parser
// (metrics.go) and the scrape (client.go).
//
// The daemon reads its own node's kubelet directly,
// https://<Node InternalIP>:<kubelet port>/metrics, with its ServiceAccount
// token, which the kubelet checks by webhook (TokenReview, then a
// SubjectAccessReview for get nodes/metrics, both cached by the kubelet:
// allowed decisions 5 min, tokens 2 min). Not through the API server's
// proxy (nodes/NODE/proxy/metrics): that path needs nodes/proxy, which
// also reaches the kubelet's exec, attach and port-forward (as good as
// cluster-admin), and it would carry every node's scrape through the API
// server (a fleet of N nodes: N bodies of ~100 KiB per cycle relayed by
// the API server, against about N/300 cached authorization reviews per
// second direct).
//
// TLS: the kubelet's serving certificate is checked against --kubelet-ca,
// else the cluster's CA (the ServiceAccount's ca.crt), which signs it only
// when the kubelet runs with serverTLSBootstrap and its CSRs are approved.
// Most clusters (kubeadm's default) have self-signed kubelet certificates:
// there the scrape is skipped with a TLS reason until the operator passes
// --kubelet-ca or --kubelet-insecure-tls (the chart's
// kubelet.insecureTLS). Unverified TLS is used only to an address of this
// host (the daemon runs with hostNetwork), so the token never leaves the
// node: whoever could answer there in the kubelet's place is root on the
// node already, and can read the token from the pod's volume anyway.
package kubelet

import (
	"bytes"
	"fmt"
	"io"
	"math"

	dto "github.com/prometheus/client_model/go"

	"github.com/remediate-dev/remediate/internal/clip"
	"github.com/remediate-dev/remediate/internal/kubeproxy"
)

// The series read, as kubelet v1.34 names them
// (k8s.io/kubernetes pkg/kubelet/metrics/metrics.go).
const (
	MetricSandboxErrors   = "kubelet_run_podsandbox_errors_total"
	MetricSandboxDuration = "kubelet_run_podsandbox_duration_seconds"
	MetricPodStartSLI     = "kubelet_pod_start_sli_duration_seconds"
)

// MaxBody bounds a /metrics body read (a busy kubelet's is a few hundred
// KiB; a larger one is refused, not truncated into a wrong figure).
const MaxBody = 8 << 20

// Metrics are the kubelet's sandbox and pod-start series of one scrape,
// summed over their labels (runtime_handler). A nil field means the series
// was absent: a kubelet that has run no sandbox has no error series.
type Metrics struct {
	// SandboxErrors is kubelet_run_podsandbox_errors_total.
	SandboxErrors *float64
	// SandboxDuration is kubelet_run_podsandbox_duration_seconds.
	SandboxDuration *kubeproxy.Histogram
	// PodStartSLI is kubelet_pod_start_sli_duration_seconds (pod start
	// excluding image pulls and init containers).
	PodStartSLI *kubeproxy.Histogram
}

// ParseMetrics parses a Prometheus text exposition, at most MaxBody bytes
// of it (more is an error).
func ParseMetrics(r io.Reader) (Metrics, error) {
	b, err := io.ReadAll(io.LimitReader(r, MaxBody+1))
	if err != nil {
		return Metrics{}, fmt.Errorf("reading kubelet metrics: %w", err)
	}
	return parseMetrics(b)
}

// parseMetrics is ParseMetrics of a body read. Only the families read here
// are parsed (familyLines): the kubelet's whole /metrics is ~200 kB, and
// parsing all of it every cycle cost ~7 ms and 45k allocations for three
// families (BenchmarkParseMetrics).
func parseMetrics(b []byte) (Metrics, error) {
	if len(b) > MaxBody {
		return Metrics{}, fmt.Errorf("kubelet metrics larger than %d bytes", MaxBody)
	}
	lines, ok := familyLines(b, MetricSandboxErrors, MetricSandboxDuration, MetricPodStartSLI)
	if !ok {
		return Metrics{}, fmt.Errorf("parse kubelet metrics: not a Prometheus text exposition (no # HELP or # TYPE line): %s", clip.Excerpt(b, 80))
	}
	fams, err := kubeproxy.ParseText(bytes.NewReader(lines))
	if err != nil {
		return Metrics{}, fmt.Errorf("parse kubelet metrics: %w", err)
	}
	return metricsOf(fams), nil
}

// metricsOf extracts the series read from parsed families.
func metricsOf(fams map[string]*dto.MetricFamily) Metrics {
	var m Metrics
	if mf := fams[MetricSandboxErrors]; mf != nil {
		var sum float64
		for _, s := range mf.GetMetric() {
			v := s.GetCounter().GetValue()
			if mf.GetType() == dto.MetricType_UNTYPED {
				v = s.GetUntyped().GetValue()
			}
			if v > 0 && !math.IsInf(v, 0) {
				sum += v
			}
		}
		m.SandboxErrors = &sum
	}
	if mf := fams[MetricSandboxDuration]; mf != nil && mf.GetType() == dto.MetricType_HISTOGRAM {
		m.SandboxDuration = sumHistograms(mf)
	}
	if mf := fams[MetricPodStartSLI]; mf != nil && mf.GetType() == dto.MetricType_HISTOGRAM {
		m.PodStartSLI = sumHistograms(mf)
	}
	return m
}

// familyLines keeps, of a text exposition, the lines of the families
// named (kubeproxy.FamilyLines: a histogram's _bucket, _sum and _count
// included); ok is false when b has no # HELP or # TYPE line at all.
func familyLines(b []byte, names ...string) (out []byte, ok bool) {
	return kubeproxy.FamilyLines(b, func(name []byte) bool {
		for _, n := range names {
			if string(name) == n {
				return true
			}
		}
		return false
	})
}

// sumHistograms adds the family's histograms bucket by bucket; series with
// other bucket bounds than the first are left out (the kubelet gives all
// the same bounds).
func sumHistograms(mf *dto.MetricFamily) *kubeproxy.Histogram {
	var out *kubeproxy.Histogram
	for _, s := range mf.GetMetric() {
		h := s.GetHistogram()
		if h == nil {
			continue
		}
		hs := kubeproxy.HistogramOf(h)
		if out == nil {
			out = hs
			continue
		}
		if len(hs.Buckets) != len(out.Buckets) {
			continue
		}
		same := true
		for i := range hs.Buckets {
			if hs.Buckets[i].UpperBound != out.Buckets[i].UpperBound {
				same = false
				break
			}
		}
		if !same {
			continue
		}
		for i := range hs.Buckets {
			out.Buckets[i].CumulativeCount += hs.Buckets[i].CumulativeCount
		}
		out.Count += hs.Count
		out.Sum += hs.Sum
	}
	return out
}
