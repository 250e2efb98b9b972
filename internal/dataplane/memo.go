package dataplane

import (
	"sync"

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
	if len(m.keys) >= memoEntries {
		copy(m.keys, m.keys[1:])
		copy(m.vals, m.vals[1:])
		m.keys, m.vals = m.keys[:len(m.keys)-1], m.vals[:len(m.vals)-1]
	}
	m.keys = append(m.keys, k)
	m.vals = append(m.vals, v)
	return v
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
	desireMemo     memo[desireKey, *Desired]
	programmedMemo memo[programmedKey, *State]
	compareMemo    memo[compareKey, []Diff]
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
		return serviceMemo.desire(sv, f, nodeName)
	})
}

// serviceMemo keeps the per-Service derivations of the last few views,
// families and nodes (desireIncremental).
var serviceMemo = &perServiceMemo{}

type perServiceKey struct {
	v    cluster.View
	f    Family
	node string
}

type perServiceMemo struct {
	mu   sync.Mutex
	keys []perServiceKey
	vals []perService
	// computed and reused count Services derived and kept (tests,
	// benchmarks).
	computed, reused uint64
}

func (m *perServiceMemo) desire(v versionedView, f Family, node string) *Desired {
	k := perServiceKey{v, f, node}
	m.mu.Lock()
	defer m.mu.Unlock()
	at := -1
	var prev perService
	for i, kk := range m.keys {
		if kk == k {
			at, prev = i, m.vals[i]
		}
	}
	d, next, computed := desireIncremental(v, f, node, prev)
	m.computed += uint64(computed)
	m.reused += uint64(len(d.Ports) - computed)
	switch {
	case next == nil: // the view moved during the call: prev stays
	case at >= 0:
		m.vals[at] = next
	default:
		if len(m.keys) >= memoEntries {
			copy(m.keys, m.keys[1:])
			copy(m.vals, m.vals[1:])
			m.keys, m.vals = m.keys[:len(m.keys)-1], m.vals[:len(m.vals)-1]
		}
		m.keys = append(m.keys, k)
		m.vals = append(m.vals, next)
	}
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
