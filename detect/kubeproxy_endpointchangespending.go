package detect

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/remediate-dev/remediate/internal/finding"
	"github.com/remediate-dev/remediate/internal/kubeproxy"
	"github.com/remediate-dev/remediate/internal/node"
	"github.com/remediate-dev/remediate/policy"
)

// KubeProxyEndpointChangesPendingParams are the thresholds of
// KubeProxyEndpointChangesPending.
type KubeProxyEndpointChangesPendingParams struct {
	// Scrapes is how many consecutive scrapes the pending count must be
	// non-zero and growing (never decreasing, higher at the end) for
	// (default 3).
	Scrapes int `yaml:"scrapes"`
}

// SetDefaults sets the defaults of KubeProxyEndpointChangesPending (registry.Defaulter).
func (p *KubeProxyEndpointChangesPendingParams) SetDefaults() {
	*p = KubeProxyEndpointChangesPendingParams{Scrapes: 3}
}

// Validate implements policy.Validator.
func (p *KubeProxyEndpointChangesPendingParams) Validate() []policy.FieldError {
	if p.Scrapes < 2 || p.Scrapes > 100 {
		return []policy.FieldError{{Field: "scrapes", Msg: "must be between 2 and 100"}}
	}
	return nil
}

// CapSamples implements SampleCounted: a one-shot run with n samples
// judges growth over at most n scrapes (two: non-zero at both and higher
// at the second).
func (p *KubeProxyEndpointChangesPendingParams) CapSamples(n int) bool {
	if n >= 2 && p.Scrapes > n {
		p.Scrapes = n
		return true
	}
	return false
}

func init() {
	Define("KubeProxyEndpointChangesPending",
		"kube-proxy's pending endpoint changes are non-zero and growing over N consecutive scrapes",
		newKubeProxyEndpointChangesPending, Targets(finding.KindKubeProxy), Windowed())
}

type kubeProxyPending struct {
	p KubeProxyEndpointChangesPendingParams
	n *node.Node

	mu      sync.Mutex
	lastSeq uint64
	values  []float64 // last p.Scrapes values, oldest first
	judgement
	causes causeWatch
}

func newKubeProxyEndpointChangesPending(p *KubeProxyEndpointChangesPendingParams, n *node.Node) (Detector, error) {
	return &kubeProxyPending{p: *p, n: n}, nil
}

func (d *kubeProxyPending) Detect(ctx context.Context) ([]finding.Finding, error) {
	kp, sc, err := kubeProxyScrape(ctx, d.n)
	if err != nil {
		return nil, err
	}
	if sc.Metrics.EndpointChangesPending == nil {
		return nil, finding.Skip("kube-proxy does not export sync_proxy_rules_endpoint_changes_pending")
	}
	// Causes are judged over the scrapes the growth is seen in, at least
	// 2 x syncPeriod.
	span := max(time.Duration(d.p.Scrapes)*kp.SyncPeriod(), 2*kp.SyncPeriod())
	d.causes.observe(ctx, d.n, sc, span)
	out := d.findings(sc)
	d.causes.attach(ctx, d.n, sc, familyOfTarget, span, out)
	return out, nil
}

// findings records the pending gauge and decides.
func (d *kubeProxyPending) findings(sc *kubeproxy.Scrape) []finding.Finding {
	d.mu.Lock()
	defer d.mu.Unlock()
	if sc.Seq != d.lastSeq {
		d.lastSeq = sc.Seq
		d.values = append(d.values, *sc.Metrics.EndpointChangesPending)
		if len(d.values) > d.p.Scrapes {
			d.values = d.values[len(d.values)-d.p.Scrapes:]
		}
	}
	if !pendingGrowing(d.values, d.p.Scrapes) {
		d.set("%g endpoint changes pending, not growing over %d scrapes", *sc.Metrics.EndpointChangesPending, d.p.Scrapes)
		return nil
	}
	vals := append([]float64(nil), d.values...)
	return []finding.Finding{{
		Detector: "KubeProxyEndpointChangesPending",
		// The gauge is node-wide: kube-proxy exports it without ip_family.
		Target:   "kube-proxy",
		Severity: finding.Warning,
		Message: fmt.Sprintf("kube-proxy has %g endpoint changes pending, growing over the last %d scrapes (%v): it is not applying them",
			vals[len(vals)-1], len(vals), vals),
		Evidence: map[string]any{"pending": vals, "scrapes": len(vals)},
	}}
}

// pendingGrowing reports whether the last n values are all non-zero, never
// decrease, and end higher than they start.
func pendingGrowing(values []float64, n int) bool {
	if len(values) < n {
		return false
	}
	v := values[len(values)-n:]
	for i, x := range v {
		if x <= 0 || (i > 0 && x < v[i-1]) {
			return false
		}
	}
	return v[len(v)-1] > v[0]
}
