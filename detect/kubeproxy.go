package detect

import (
	"context"
	"fmt"
	"sync/atomic"
	"time"

	"go.uber.org/zap"

	"github.com/remediate-dev/remediate/internal/finding"
	"github.com/remediate-dev/remediate/internal/kubeproxy"
	"github.com/remediate-dev/remediate/internal/node"
)

// This file holds what the kube-proxy detectors (kubeproxy_*.go) share:
// access to the adapter, its scrape, and a time window of samples.

// subsystemKubeProxy is the node.Unavailable key of the kube-proxy adapter.
const subsystemKubeProxy = "kube-proxy"

// kubeProxyOf returns the node's kube-proxy adapter or a Skip saying why
// there is none.
func kubeProxyOf(n *node.Node) (kubeproxy.Interface, error) {
	if n.KubeProxy == nil {
		return nil, finding.Skip("%s", n.Why(subsystemKubeProxy))
	}
	return n.KubeProxy, nil
}

// kubeProxyScrape reads kube-proxy's metrics. When kube-proxy cannot be
// read (unreachable, or an unusable answer) the detector cannot tell: that
// is a Skip naming the cause, not an error, because KubeProxyUnreachable
// reports it as its own finding and the engine keeps the rule's state as
// it was ("unknown is not absent").
func kubeProxyScrape(ctx context.Context, n *node.Node, kp kubeproxy.Interface) (*kubeproxy.Scrape, error) {
	sc, err := kp.Metrics(ctx)
	if err != nil {
		return nil, kubeProxyReadError("metrics", err)
	}
	if sc.Metrics != nil && sc.Metrics.IgnoredFamilies > 0 && ignoredFamiliesWarned.CompareAndSwap(false, true) && n != nil && n.Log != nil {
		n.Log.Warn("kube-proxy metrics carry ip_family values other than IPv4/IPv6; those series are ignored (warned once)",
			zap.Int("ignoredSamples", sc.Metrics.IgnoredFamilies))
	}
	return sc, nil
}

// ignoredFamiliesWarned makes the warning about unknown IP families once
// per process: a broken endpoint repeats it every scrape.
var ignoredFamiliesWarned atomic.Bool

// kubeProxyReadError turns a failed read into a Skip when it is kube-proxy's
// side (see kubeProxyScrape), else wraps it.
func kubeProxyReadError(what string, err error) error {
	if e, ok := kubeproxy.AsError(err); ok {
		return finding.Skip("cannot read kube-proxy %s (see KubeProxyUnreachable): %v", what, e)
	}
	return fmt.Errorf("reading kube-proxy %s: %w", what, err)
}

// skipUnlessMode returns a Skip when kube-proxy is known to run in a mode
// other than want. An unknown mode (the endpoint failed) does not skip: the
// metrics themselves then decide.
func skipUnlessMode(ctx context.Context, kp kubeproxy.Interface, want kubeproxy.Mode, what string) error {
	m, err := kp.ProxyMode(ctx)
	if err == nil && m != want {
		return finding.Skip("kube-proxy runs in %s mode; %s applies to %s mode only", m, what, want)
	}
	return nil
}

// seconds converts a kube-proxy timestamp gauge (Unix seconds) to a time.
func seconds(v float64) time.Time {
	sec := int64(v)
	return time.Unix(sec, int64((v-float64(sec))*1e9))
}

// rfc3339 formats a time for evidence.
func rfc3339(t time.Time) string { return t.UTC().Format(time.RFC3339Nano) }

// sample is one observation of a value at a scrape.
type sample[T any] struct {
	seq uint64
	at  time.Time
	v   T
}

// window keeps the samples of the last span, one per distinct scrape (a
// cached scrape seen again is not a new sample).
type window[T any] struct {
	samples []sample[T]
}

// add appends a sample unless its scrape was already recorded, then drops
// samples older than span before the newest, keeping the oldest sample at
// or before the window's start so deltas cover the whole span.
func (w *window[T]) add(seq uint64, at time.Time, v T, span time.Duration) {
	if n := len(w.samples); n > 0 && w.samples[n-1].seq == seq {
		return
	}
	w.samples = append(w.samples, sample[T]{seq: seq, at: at, v: v})
	start := at.Add(-span)
	drop := 0
	for drop+1 < len(w.samples) && !w.samples[drop+1].at.After(start) {
		drop++
	}
	w.samples = w.samples[drop:]
}

// reset keeps only the newest sample (after a counter reset).
func (w *window[T]) reset() {
	if n := len(w.samples); n > 0 {
		w.samples = w.samples[n-1:]
	}
}

// oldest and newest return the ends of the window; ok is false with fewer
// than two samples.
func (w *window[T]) ends() (oldest, newest sample[T], ok bool) {
	if len(w.samples) < 2 {
		return oldest, newest, false
	}
	return w.samples[0], w.samples[len(w.samples)-1], true
}

// windowState says what advance could judge.
type windowState int

const (
	// windowShort: the window holds one sample, nothing to compare yet.
	windowShort windowState = iota
	// windowRestarted: the value went backwards (the counter's process
	// restarted); the window starts again from the newest sample.
	windowRestarted
	// windowReady: the change over the window is known.
	windowReady
)

// advance records v (as add does) and returns the change between the
// window's ends, taken by sub (which says false when the newer value is
// below the older: a counter reset), and the time the two ends cover.
func (w *window[T]) advance(seq uint64, at time.Time, v T, span time.Duration, sub func(newer, older T) (T, bool)) (delta T, covered time.Duration, st windowState) {
	w.add(seq, at, v, span)
	oldest, newest, ok := w.ends()
	if !ok {
		return delta, 0, windowShort
	}
	d, ok := sub(newest.v, oldest.v)
	if !ok {
		w.reset()
		return delta, 0, windowRestarted
	}
	return d, newest.at.Sub(oldest.at), windowReady
}

// counterIncrease is advance's sub for one cumulative counter.
func counterIncrease(newer, older float64) (float64, bool) { return newer - older, newer >= older }

// counterPair is two cumulative counters of one family at one scrape.
type counterPair struct{ a, b float64 }

// familyIncrease is how much a family's two counters rose over the window.
type familyIncrease struct {
	family  kubeproxy.Family
	a, b    float64
	covered time.Duration
}

// counterWindows keeps, per IP family, a window of two failure counters
// (iptables-restore full and partial failures; nftables sync and cleanup
// failures) and turns scrapes into increases over the window. Its caller
// serialises access.
type counterWindows struct {
	w map[kubeproxy.Family]*window[counterPair]
}

// add records the scrape's counters (get returns them for a family; nil
// means absent, which from kube-proxy 1.33 means zero) and returns the
// increase of each over span, for the families with two samples. A counter
// that went down (kube-proxy restarted) restarts that family's window.
func (c *counterWindows) add(sc *kubeproxy.Scrape, span time.Duration, get func(*kubeproxy.FamilyMetrics) (a, b *float64)) []familyIncrease {
	if c.w == nil {
		c.w = map[kubeproxy.Family]*window[counterPair]{}
	}
	var out []familyIncrease
	for _, f := range sc.Metrics.FamilyNames() {
		var v counterPair
		a, b := get(sc.Metrics.Families[f])
		if a != nil {
			v.a = *a
		}
		if b != nil {
			v.b = *b
		}
		w := c.w[f]
		if w == nil {
			w = &window[counterPair]{}
			c.w[f] = w
		}
		d, covered, st := w.advance(sc.Seq, sc.At, v, span, func(newer, older counterPair) (counterPair, bool) {
			d := counterPair{newer.a - older.a, newer.b - older.b}
			return d, d.a >= 0 && d.b >= 0
		})
		if st != windowReady {
			continue
		}
		out = append(out, familyIncrease{family: f, a: d.a, b: d.b, covered: covered})
	}
	return out
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
