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

// KubeProxySyncSlowParams are the thresholds of KubeProxySyncSlow.
type KubeProxySyncSlowParams struct {
	// Quantile of the sync duration to judge (default 0.99).
	Quantile float64 `yaml:"quantile"`
	// Fraction: slow when the quantile exceeds Fraction x syncPeriod
	// (default 0.33: 9.9 s at the default 30 s syncPeriod, the field
	// guides' "p99 above 10 seconds is concerning"; RUNBOOK section 7).
	Fraction float64 `yaml:"fraction"`
	// Window over which the quantile is computed, from the histogram's
	// bucket deltas between the scrapes at its ends (not the lifetime
	// histogram). Default 0: 10 x syncPeriod.
	Window policy.Duration `yaml:"window"`
	// MinSyncs is the fewest syncs in the window for a verdict (default 3).
	MinSyncs int `yaml:"minSyncs"`
}

// SetDefaults sets the defaults of KubeProxySyncSlow (registry.Defaulter).
func (p *KubeProxySyncSlowParams) SetDefaults() {
	*p = KubeProxySyncSlowParams{Quantile: 0.99, Fraction: 0.33, MinSyncs: 3}
}

// Validate implements policy.Validator.
func (p *KubeProxySyncSlowParams) Validate() []policy.FieldError {
	var errs []policy.FieldError
	if p.Quantile <= 0 || p.Quantile >= 1 {
		errs = append(errs, policy.FieldError{Field: "quantile", Msg: "must be between 0 and 1 (exclusive), e.g. 0.99"})
	}
	if p.Fraction <= 0 || p.Fraction > 10 {
		errs = append(errs, policy.FieldError{Field: "fraction", Msg: "must be in (0, 10] (times syncPeriod)"})
	}
	if p.Window.Duration < 0 {
		errs = append(errs, policy.FieldError{Field: "window", Msg: "must not be negative (0 means 10 x syncPeriod)"})
	}
	if p.MinSyncs < 1 {
		errs = append(errs, policy.FieldError{Field: "minSyncs", Msg: "must be at least 1"})
	}
	return errs
}

func init() {
	Define("KubeProxySyncSlow",
		"kube-proxy's recent sync duration quantile (from histogram deltas over a window) exceeds a fraction of syncPeriod (per IP family)",
		newKubeProxySyncSlow, Targets(finding.KindKubeProxy), Windowed())
}

type kubeProxySyncSlow struct {
	p KubeProxySyncSlowParams
	n *node.Node

	mu   sync.Mutex
	hist map[kubeproxy.Family]*window[kubeproxy.Histogram]
	judgement
	causes causeWatch
}

func newKubeProxySyncSlow(p *KubeProxySyncSlowParams, n *node.Node) (Detector, error) {
	return &kubeProxySyncSlow{p: *p, n: n,
		hist: map[kubeproxy.Family]*window[kubeproxy.Histogram]{}}, nil
}

func (d *kubeProxySyncSlow) Detect(ctx context.Context) ([]finding.Finding, error) {
	kp, sc, err := kubeProxyScrape(ctx, d.n)
	if err != nil {
		return nil, err
	}
	span := d.p.Window.Duration
	if span == 0 {
		span = 10 * kp.SyncPeriod()
	}
	limit := time.Duration(d.p.Fraction * float64(kp.SyncPeriod()))
	d.set("sync p%g under %s over the last %s (or too few syncs to judge)", d.p.Quantile*100, limit, span)
	d.causes.observe(ctx, d.n, sc, span)
	out := d.findings(sc, span, limit)
	d.causes.attach(ctx, d.n, sc, familyOfTarget, span, out)
	return out, nil
}

// findings records the scrape's histograms and decides per family.
func (d *kubeProxySyncSlow) findings(sc *kubeproxy.Scrape, span, limit time.Duration) []finding.Finding {
	d.mu.Lock()
	defer d.mu.Unlock()
	var out []finding.Finding
	for _, f := range sc.Metrics.FamilyNames() {
		h := sc.Metrics.Families[f].SyncDuration
		if h == nil {
			continue
		}
		w := d.hist[f]
		if w == nil {
			w = &window[kubeproxy.Histogram]{}
			d.hist[f] = w
		}
		delta, covered, st := w.advance(sc.Seq, sc.At, *h, span, kubeproxy.Histogram.Sub)
		if st != windowReady {
			continue // one scrape so far, or kube-proxy restarted
		}
		if fd := slowSyncFinding(f, delta, covered, d.p.Quantile, limit, d.p.MinSyncs); fd != nil {
			out = append(out, *fd)
		}
	}
	return out
}

// slowSyncFinding is the decision on the syncs observed in a window (delta
// is the histogram of those syncs only).
func slowSyncFinding(f kubeproxy.Family, delta kubeproxy.Histogram, covered time.Duration, q float64, limit time.Duration, minSyncs int) *finding.Finding {
	if delta.Count < uint64(minSyncs) {
		return nil
	}
	v, above, ok := delta.Quantile(q)
	if !ok {
		return nil
	}
	d := time.Duration(v * float64(time.Second))
	if !above && d <= limit {
		return nil
	}
	if above && d < limit {
		// Above the largest bucket, but that bucket is below the limit:
		// the true value is unknown, somewhere above d.
		d = limit + 1
	}
	val := d.Round(time.Millisecond).String()
	if above {
		val = fmt.Sprintf("above %s (the largest bucket)", time.Duration(v*float64(time.Second)))
	}
	return &finding.Finding{
		Detector: "KubeProxySyncSlow",
		Target:   f.Target(),
		Severity: finding.Warning,
		Message: fmt.Sprintf("kube-proxy %s sync p%g over the last %s (%d syncs) is %s, limit %s",
			f, q*100, covered.Round(time.Second), delta.Count, val, limit),
		Evidence: map[string]any{
			"ipFamily":           string(f),
			"quantile":           q,
			"seconds":            v,
			"aboveLargestBucket": above,
			"limitSeconds":       limit.Seconds(),
			"syncs":              delta.Count,
			"windowSeconds":      covered.Seconds(),
			"meanSeconds":        delta.Sum / float64(delta.Count),
		},
	}
}
