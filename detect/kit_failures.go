package detect

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/remediate-dev/remediate/internal/causes"
	"github.com/remediate-dev/remediate/internal/finding"
	"github.com/remediate-dev/remediate/internal/kubeproxy"
	"github.com/remediate-dev/remediate/internal/node"
	"github.com/remediate-dev/remediate/policy"
)

// This file holds the one body of the windowed failure-counter detectors,
// KubeProxyRestoreFailures (kubeproxy_restorefailures.go) and
// KubeProxyNFTablesFailures (kubeproxy_nftablesfailures.go). Each counts, per IP
// family, two of kube-proxy's failure counters over a window: a major one
// (the rules are not being updated: critical) and a minor one (a warning).
// What differs between them is a failureSpec and their parameter block.

// failureSpec is what one failure-counter detector says of itself.
type failureSpec struct {
	// name is the registered detector name, doc its one-line description.
	name, doc string
	// counters reads the two counters from kube-proxy's metrics.
	counters failureCounters
	// skip returns a Skip when kube-proxy's mode does not run what the
	// counters count (nil: judge).
	skip func(ctx context.Context, kp kubeproxy.Interface) error
	// majorParam and minorParam are the parameters' YAML names (maxFailures,
	// ...): the field of a validation error and the evidence key of the
	// limit.
	majorParam, minorParam string
	// majorKey and minorKey are the evidence keys of the two increases.
	majorKey, minorKey string
	// majorWhat and minorWhat name the counters in the message
	// ("iptables-restore failures").
	majorWhat, minorWhat string
	// majorWhy and minorWhy end the message of a critical and of a warning
	// finding ("" adds nothing).
	majorWhy, minorWhy string
	// judged is the figure of a run without a finding; %s is the window.
	judged string
	// logCauses: a finding's likely causes are read from kube-proxy's and
	// the CNI agents' logs (the lines that say why a restore failed).
	logCauses bool
}

// failureLimits are a failure-counter detector's parameters, whatever their
// YAML names.
type failureLimits struct {
	// window is the policy's window (0: 4 x syncPeriod).
	window time.Duration
	// major: critical above this many; minor: a warning above this many,
	// -1 ignores the minor counter.
	major, minor int
}

// validate checks l, naming the fields by s's parameter names.
func (s *failureSpec) validate(l failureLimits) []policy.FieldError {
	var errs []policy.FieldError
	if l.window < 0 {
		errs = append(errs, policy.FieldError{Field: "window", Msg: "must not be negative (0 means 4 x syncPeriod)"})
	}
	if l.major < 0 {
		errs = append(errs, policy.FieldError{Field: s.majorParam, Msg: "must not be negative"})
	}
	if l.minor < -1 {
		errs = append(errs, policy.FieldError{Field: s.minorParam, Msg: "must be -1 (ignore) or more"})
	}
	return errs
}

// limitsOf is a failure-counter detector's parameter block: a pointer to P
// that gives its limits.
type limitsOf[P any] interface {
	*P
	limits() failureLimits
}

// defineFailures registers the failure-counter detector s with parameter
// block P.
func defineFailures[P any, PP limitsOf[P]](s *failureSpec) {
	Define(s.name, s.doc, func(p *P, n *node.Node) (Detector, error) {
		return &failureDetector{s: s, l: PP(p).limits(), n: n}, nil
	}, Targets(finding.KindKubeProxy), Windowed())
}

// failureDetector is a failure-counter detector.
type failureDetector struct {
	s *failureSpec
	l failureLimits
	n *node.Node

	mu sync.Mutex
	w  counterWindows
	judgement
}

func (d *failureDetector) Detect(ctx context.Context) ([]finding.Finding, error) {
	kp, err := kubeProxyOf(d.n)
	if err != nil {
		return nil, err
	}
	if err := d.s.skip(ctx, kp); err != nil {
		return nil, err
	}
	_, sc, err := kubeProxyScrape(ctx, d.n)
	if err != nil {
		return nil, err
	}
	span := failureWindow(d.l.window, kp)
	d.mu.Lock()
	defer d.mu.Unlock()
	out, err := d.w.findings(sc, span, d.s.counters,
		func(f kubeproxy.Family, major, minor float64, covered time.Duration) *finding.Finding {
			return d.s.decide(f, major, minor, covered, d.l)
		})
	if err == nil {
		d.set(d.s.judged, span)
	}
	if d.s.logCauses && len(out) > 0 {
		lines, why := logCauses(ctx, d.n, span)
		r := causes.Rank(causes.Inputs{Logs: lines})
		for i := range out {
			r.Attach(out[i].Evidence, why)
		}
	}
	return out, err
}

// decide is the decision on the failures counted over a window.
func (s *failureSpec) decide(f kubeproxy.Family, major, minor float64, covered time.Duration, l failureLimits) *finding.Finding {
	majorBad := major > float64(l.major)
	minorBad := l.minor >= 0 && minor > float64(l.minor)
	if !majorBad && !minorBad {
		return nil
	}
	sev, why := finding.Warning, s.minorWhy
	if majorBad {
		sev, why = finding.Critical, s.majorWhy
	}
	msg := fmt.Sprintf("kube-proxy %s: %g %s and %g %s in the last %s (limits %d, %d)",
		f, major, s.majorWhat, minor, s.minorWhat, covered.Round(time.Second), l.major, l.minor)
	if why != "" {
		msg += ": " + why
	}
	return &finding.Finding{
		Detector: s.name,
		Target:   f.Target(),
		Severity: sev,
		Message:  msg,
		Evidence: map[string]any{
			"ipFamily":      string(f),
			s.majorKey:      major,
			s.minorKey:      minor,
			"windowSeconds": covered.Seconds(),
			s.majorParam:    l.major,
			s.minorParam:    l.minor,
		},
	}
}

// failureCounters is what a windowed failure-counter detector
// (KubeProxyRestoreFailures, KubeProxyNFTablesFailures) says about its two
// counters: how to read them from a family, whether a family exports them,
// and the skip reason when no family does.
type failureCounters struct {
	get      func(*kubeproxy.FamilyMetrics) (a, b *float64)
	exported func(*kubeproxy.FamilyMetrics) bool
	absent   string
}

// failureWindow is the window of a failure-counter detector: the policy's,
// else 4 x kube-proxy's syncPeriod.
func failureWindow(policyWindow time.Duration, kp kubeproxy.Interface) time.Duration {
	if policyWindow != 0 {
		return policyWindow
	}
	return 4 * kp.SyncPeriod()
}

// findings records the scrape in c and returns decide's findings for each
// family's increases over span. kube-proxy 1.29-1.32 export plain counters
// from the start, so none exported there means kube-proxy is in another
// mode (a Skip with fc.absent); from 1.33 the per-family vectors appear
// with their first increment (absent = zero). The caller serialises access.
func (c *counterWindows) findings(sc *kubeproxy.Scrape, span time.Duration, fc failureCounters,
	decide func(f kubeproxy.Family, a, b float64, covered time.Duration) *finding.Finding) ([]finding.Finding, error) {
	exported := false
	for _, fm := range sc.Metrics.Families {
		if fc.exported(fm) {
			exported = true
		}
	}
	if !exported && !sc.Metrics.Labelled {
		return nil, finding.Skip("%s", fc.absent)
	}
	var out []finding.Finding
	for _, inc := range c.add(sc, span, fc.get) {
		if fd := decide(inc.family, inc.a, inc.b, inc.covered); fd != nil {
			out = append(out, *fd)
		}
	}
	return out, nil
}
