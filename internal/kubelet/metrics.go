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
	"sort"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"

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
	if len(b) > MaxBody {
		return Metrics{}, fmt.Errorf("kubelet metrics larger than %d bytes", MaxBody)
	}
	fams, err := parseText(bytes.NewReader(b))
	if err != nil {
		return Metrics{}, err
	}
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
	return m, nil
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
		var bs []kubeproxy.Bucket
		for _, b := range h.GetBucket() {
			if math.IsInf(b.GetUpperBound(), 1) || math.IsNaN(b.GetUpperBound()) {
				continue
			}
			bs = append(bs, kubeproxy.Bucket{UpperBound: b.GetUpperBound(), CumulativeCount: b.GetCumulativeCount()})
		}
		sort.Slice(bs, func(i, j int) bool { return bs[i].UpperBound < bs[j].UpperBound })
		if out == nil {
			out = &kubeproxy.Histogram{Buckets: bs, Count: h.GetSampleCount(), Sum: h.GetSampleSum()}
			continue
		}
		if len(bs) != len(out.Buckets) {
			continue
		}
		same := true
		for i := range bs {
			if bs[i].UpperBound != out.Buckets[i].UpperBound {
				same = false
				break
			}
		}
		if !same {
			continue
		}
		for i := range bs {
			out.Buckets[i].CumulativeCount += bs[i].CumulativeCount
		}
		out.Count += h.GetSampleCount()
		out.Sum += h.GetSampleSum()
	}
	return out
}

// parseText runs expfmt's text parser, turning its panics into errors (see
// internal/kubeproxy: the v0.62.0 parser can dereference nil on malformed
// input).
func parseText(r io.Reader) (fams map[string]*dto.MetricFamily, err error) {
	defer func() {
		if p := recover(); p != nil {
			fams, err = nil, fmt.Errorf("parse kubelet metrics: parser panicked on malformed input: %v", p)
		}
	}()
	var p expfmt.TextParser
	fams, err = p.TextToMetricFamilies(r)
	if err != nil {
		return nil, fmt.Errorf("parse kubelet metrics: %w", err)
	}
	return fams, nil
}
