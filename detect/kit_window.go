package detect

import (
	"time"

	"github.com/remediate-dev/remediate/internal/kubeproxy"
)

// Windows of samples across cycles (the rates, deltas and counter
// increases of the windowed detectors), and how times and durations are
// written in evidence.

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

// lastOf returns the newest sample of a window.
func lastOf[T any](w window[T]) (sample[T], bool) {
	if len(w.samples) == 0 {
		return sample[T]{}, false
	}
	return w.samples[len(w.samples)-1], true
}

func durSeconds(d time.Duration) float64 {
	return float64(d.Round(time.Millisecond)) / float64(time.Second)
}

// rfc3339 formats a time for evidence.
func rfc3339(t time.Time) string { return t.UTC().Format(time.RFC3339Nano) }
