package dataplane

import (
	"sync"
	"sync/atomic"

	"github.com/remediate-dev/remediate/internal/cluster"
	"github.com/remediate-dev/remediate/internal/iptables"
)

// The derivations below are pure functions of their inputs, and their
// inputs repeat from cycle to cycle on a quiet node: the iptables save is
// the same *Ruleset while the kernel's rules are unchanged (iptables.Real
// reuses it), and the cluster view's contents are the same while its
// generation (cluster.Generational) has not moved. The *Cached variants
// keep the last few results so that the detectors of a cycle (and the next
// cycles) share one computation; a result is returned only for the very
// same inputs, never for similar ones. Results are shared: read-only.

const memoEntries = 4 // families × a reload's overlap

type memo[K comparable, V any] struct {
	mu      sync.Mutex
	keys    []K
	vals    []V
	hits    uint64
	compute uint64
	// slot, when set, names what a key is the latest of (a family's save,
	// a view's family): a new key takes the place of the kept one of its
	// slot instead of being added, so an input that was replaced (an older
	// save, an older generation) is not kept alive by the memo. Under
	// churn at 5,000 Services every cycle has a new ~28 MB save; keeping
	// the last memoEntries of them held ~80 MB more heap (issue #31).
	slot func(K) any
}

func (m *memo[K, V]) get(k K, f func() V) V {
	m.mu.Lock()
	defer m.mu.Unlock()
	for i, kk := range m.keys {
		if kk == k {
			m.hits++
			return m.vals[i]
		}
	}
	m.compute++
	v := f()
	m.put(k, v)
	return v
}

// update computes k's value from the one kept for k (found false when
// none is) and keeps the result in its place, unless keep is false (the
// previous value stays).
func (m *memo[K, V]) update(k K, f func(prev V, found bool) (v V, keep bool)) V {
	m.mu.Lock()
	defer m.mu.Unlock()
	var prev V
	found := false
	for i, kk := range m.keys {
		if kk == k {
			prev, found = m.vals[i], true
		}
	}
	m.compute++
	v, keep := f(prev, found)
	if keep {
		m.put(k, v)
	}
	return v
}

// put keeps v for k: in k's place if it is kept, else as the newest,
// evicting the oldest past memoEntries; m.mu is held.
func (m *memo[K, V]) put(k K, v V) {
	for i, kk := range m.keys {
		if kk == k || (m.slot != nil && m.slot(kk) == m.slot(k)) {
			m.keys[i], m.vals[i] = k, v
			return
		}
	}
	if len(m.keys) >= memoEntries {
		copy(m.keys, m.keys[1:])
		copy(m.vals, m.vals[1:])
		m.keys, m.vals = m.keys[:len(m.keys)-1], m.vals[:len(m.vals)-1]
	}
	m.keys = append(m.keys, k)
	m.vals = append(m.vals, v)
}

type desireKey struct {
	v    cluster.View
	gen  uint64
	f    Family
	node string
}

type programmedKey struct {
	rs     *iptables.Ruleset
	f      Family
	source string
}

type compareKey struct {
	got    *State
	want   *Desired
	subset bool
}

var (
	desireMemo = memo[desireKey, *Desired]{slot: func(k desireKey) any {
		return struct {
			v    cluster.View
			f    Family
			node string
		}{k.v, k.f, k.node}
	}}
	programmedMemo = memo[programmedKey, *State]{slot: func(k programmedKey) any {
		return struct {
			f      Family
			source string
		}{k.f, k.source}
	}}
	compareMemo = memo[compareKey, []Diff]{slot: func(k compareKey) any {
		type slot struct {
			f      Family
			source string
			subset bool
		}
		if k.got == nil {
			return slot{subset: k.subset}
		}
		return slot{k.got.Family, k.got.Source, k.subset}
	}}
)

// DesireCached is Desire, shared while the view's generation is unchanged
// (views that do not count generations are computed every time). When the
// generation moved and the view counts Service versions, only the
// Services whose version moved are derived again (desireIncremental).
func DesireCached(v cluster.View, f Family, nodeName string) *Desired {
	g, ok := v.(cluster.Generational)
	if !ok {
		return Desire(v, f, nodeName)
	}
	return desireMemo.get(desireKey{v, g.Generation(), f, nodeName}, func() *Desired {
		sv, ok := v.(versionedView)
		if !ok {
			return Desire(v, f, nodeName)
		}
		return desireServices(sv, f, nodeName)
	})
}

// serviceMemo keeps the per-Service derivations of the last few views,
// families and nodes (desireIncremental); servicesDerived counts the
// Services derived again (tests, benchmarks).
var (
	serviceMemo     memo[perServiceKey, perService]
	servicesDerived atomic.Uint64
)

type perServiceKey struct {
	v    cluster.View
	f    Family
	node string
}

// desireServices is Desire over a view counting Service versions,
// deriving again only the Services whose version moved since the kept
// derivation of the same view, family and node.
func desireServices(v versionedView, f Family, node string) *Desired {
	var d *Desired
	serviceMemo.update(perServiceKey{v, f, node}, func(prev perService, _ bool) (perService, bool) {
		var next perService
		var computed int
		d, next, computed = desireIncremental(v, f, node, prev)
		servicesDerived.Add(uint64(computed))
		return next, next != nil // the view moved during the call: prev stays
	})
	return d
}

// FromIPTablesCached is FromIPTables, shared for the same parsed save.
func FromIPTablesCached(rs *iptables.Ruleset, f Family, source string) *State {
	if rs == nil {
		return FromIPTables(rs, f, source)
	}
	return programmedMemo.get(programmedKey{rs, f, source}, func() *State { return FromIPTables(rs, f, source) })
}

// CompareCached is Compare, shared for the same two states.
func CompareCached(got *State, want *Desired, subset bool) []Diff {
	return compareMemo.get(compareKey{got, want, subset}, func() []Diff { return Compare(got, want, subset) })
}
