package iptables

import (
	"context"
	"sort"
	"sync"
	"time"

	"github.com/remediate-dev/remediate/internal/sharedread"
)

// Shared wraps an Interface so that the detectors of one cycle share one
// save per family and backend (a sharedread.Slot each): a Save within
// MaxAge of the last completed one returns its snapshot, and concurrent
// callers wait for the one save in flight instead of starting another
// (each still bounded by its own ctx). Failed saves are not cached.
// Snapshots are read-only to callers.
type Shared struct {
	inner  Interface
	maxAge time.Duration
	now    func() time.Time

	mu    sync.Mutex
	slots map[sharedKey]*sharedread.Slot[*Snapshot]
	// last is the newest successful snapshot per family and backend
	// (guarded by mu), kept after its slot goes stale: for gauges and
	// cause figures that must not run a save of their own.
	last map[sharedKey]*Snapshot
}

type sharedKey struct {
	f Family
	b Backend
}

// NewShared wraps inner; maxAge is how long a snapshot is reused (keep it
// under the detection interval, so every cycle sees a fresh one).
func NewShared(inner Interface, maxAge time.Duration) *Shared {
	return &Shared{inner: inner, maxAge: maxAge, now: time.Now, slots: map[sharedKey]*sharedread.Slot[*Snapshot]{}}
}

// Save implements Interface.
func (s *Shared) Save(ctx context.Context, f Family, b Backend) (*Snapshot, error) {
	k := sharedKey{f, b}
	s.mu.Lock()
	sl := s.slots[k]
	if sl == nil {
		sl = &sharedread.Slot[*Snapshot]{}
		s.slots[k] = sl
	}
	s.mu.Unlock()
	return sl.Get(ctx, s.now, s.maxAge, func(ctx context.Context) (*Snapshot, error) {
		snap, err := s.inner.Save(ctx, f, b)
		if err == nil && snap != nil {
			s.mu.Lock()
			if s.last == nil {
				s.last = map[sharedKey]*Snapshot{}
			}
			s.last[k] = snap
			s.mu.Unlock()
		}
		return snap, err
	})
}

// LastSnapshots returns the newest successful snapshot of every family and
// backend saved so far, without running a save (read-only to callers).
func (s *Shared) LastSnapshots() []*Snapshot {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]*Snapshot, 0, len(s.last))
	for _, sn := range s.last {
		out = append(out, sn)
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Family != out[j].Family {
			return out[i].Family < out[j].Family
		}
		return out[i].Backend < out[j].Backend
	})
	return out
}

// LastSnapshotter is implemented by adapters that remember their last
// saves (Shared).
type LastSnapshotter interface {
	LastSnapshots() []*Snapshot
}

var _ LastSnapshotter = (*Shared)(nil)

// RuleCount returns the number of rules in a table of the snapshot's rule
// set (0 when the table is absent).
func (s *Snapshot) RuleCount(table string) int {
	if s == nil || s.Rules == nil {
		return 0
	}
	t := s.Rules.Table(table)
	if t == nil {
		return 0
	}
	n := 0
	for _, c := range t.Chains {
		n += len(c.Rules)
	}
	return n
}

// Reads returns the inner adapter's read counts (see Real.Reads), or nil
// when it does not count them.
func (s *Shared) Reads() []Reads {
	if r, ok := s.inner.(interface{ Reads() []Reads }); ok {
		return r.Reads()
	}
	return nil
}
