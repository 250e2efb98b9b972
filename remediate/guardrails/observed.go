package guardrails

import (
	"sync"
	"time"

	coordv1 "k8s.io/api/coordination/v1"
	"k8s.io/utils/clock"
)

// Observed judges other nodes' Leases by what this process saw, as
// client-go's leader election does: a Lease is live for its duration after
// this process first saw its current renewal (holder, renewTime and
// duration), measured on this process's own clock (the real clock's
// monotonic reading), never by comparing the Lease's renewTime with the
// local wall clock. So a node whose clock runs ahead cannot take a slot
// whose holder still renews, and a renewTime far in the future (a skewed
// or forged writer: 2099) holds a slot for one duration after it was seen,
// no longer.
//
// The price: a Lease first seen by this process counts as live for a full
// duration from then, also when its holder died long before (after a
// restart, a dead holder's slot waits one more TTL).
type Observed struct {
	clock clock.PassiveClock

	mu   sync.Mutex
	seen map[string]observation // by Lease namespace/name
}

type observation struct {
	renewal renewal
	at      time.Time // this process's clock when it first saw renewal
}

// renewal is what a holder changes each time it renews.
type renewal struct {
	holder   string
	renew    time.Time
	duration int32
}

// NewObserved returns an empty record on clk (nil: the real clock).
func NewObserved(clk clock.PassiveClock) *Observed {
	if clk == nil {
		clk = clock.RealClock{}
	}
	return &Observed{clock: clk, seen: map[string]observation{}}
}

func renewalOf(l *coordv1.Lease) (renewal, bool) {
	if l.Spec.HolderIdentity == nil || *l.Spec.HolderIdentity == "" || l.Spec.RenewTime == nil || l.Spec.LeaseDurationSeconds == nil {
		return renewal{}, false
	}
	return renewal{holder: *l.Spec.HolderIdentity, renew: l.Spec.RenewTime.Time, duration: *l.Spec.LeaseDurationSeconds}, true
}

// Free reports whether l is free: no holder, or its current renewal was
// first seen by this process at least its duration ago. A renewal not seen
// before is recorded as seen now (and is live).
func (o *Observed) Free(l *coordv1.Lease) bool {
	key := l.Namespace + "/" + l.Name
	r, held := renewalOf(l)
	now := o.clock.Now()
	o.mu.Lock()
	defer o.mu.Unlock()
	if !held {
		delete(o.seen, key)
		return true
	}
	s, ok := o.seen[key]
	if !ok || s.renewal != r {
		o.seen[key] = observation{renewal: r, at: now}
		return r.duration <= 0
	}
	return now.Sub(s.at) >= time.Duration(r.duration)*time.Second
}

// Wrote records l, as this process wrote it, as seen at before: a time
// taken before the write was sent, so that this process never counts its
// own Lease live longer than the others, who see the write after it
// happened.
func (o *Observed) Wrote(l *coordv1.Lease, before time.Time) {
	r, held := renewalOf(l)
	if !held {
		return
	}
	o.mu.Lock()
	o.seen[l.Namespace+"/"+l.Name] = observation{renewal: r, at: before}
	o.mu.Unlock()
}

// retain forgets the Leases not in items (deleted since).
func (o *Observed) retain(items []coordv1.Lease) {
	keep := make(map[string]bool, len(items))
	for i := range items {
		keep[items[i].Namespace+"/"+items[i].Name] = true
	}
	o.mu.Lock()
	for k := range o.seen {
		if !keep[k] {
			delete(o.seen, k)
		}
	}
	o.mu.Unlock()
}
