// Package sharedread shares one read among the detectors of a cycle: a
// read of the node (an iptables save, the CNI configuration directory)
// that several detectors need is made once, concurrent callers wait for
// the one in flight instead of starting another, and its result serves
// every caller within a maximum age. The adapters that share a read
// (iptables.Shared, cni.Shared) hold a Slot per thing read.
package sharedread

import (
	"context"
	"sync"
	"time"
)

// Slot is one shared read of a value. The zero Slot is ready to use.
type Slot[V any] struct {
	mu   sync.Mutex
	cur  *flight[V]
	runs int
}

// flight is one read: in flight until done is closed.
type flight[V any] struct {
	done chan struct{}
	v    V
	err  error
	at   time.Time // when the read completed
}

// Get returns the last read's value if it succeeded at most maxAge before
// now(), waits for the read in flight if there is one, or starts a read.
// The read runs in a goroutine of its own, under a context detached from
// the starting caller's cancellation (other callers may be waiting for it)
// but bounded by that caller's deadline; read itself must be bounded. A
// caller whose ctx ends while waiting gets ctx.Err() at once. A failed
// read is not reused: the next Get reads again.
func (s *Slot[V]) Get(ctx context.Context, now func() time.Time, maxAge time.Duration, read func(context.Context) (V, error)) (V, error) {
	s.mu.Lock()
	f := s.cur
	if f != nil {
		select {
		case <-f.done:
			if f.err == nil && now().Sub(f.at) <= maxAge {
				s.mu.Unlock()
				return f.v, nil
			}
			f = nil // stale or failed: read again
		default: // in flight: wait below
		}
	}
	if f == nil {
		f = &flight[V]{done: make(chan struct{})}
		s.cur = f
		s.runs++
		rctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
		if dl, ok := ctx.Deadline(); ok {
			rctx, cancel = context.WithDeadline(context.WithoutCancel(ctx), dl)
		}
		go func() {
			defer cancel()
			v, err := read(rctx)
			s.mu.Lock()
			f.v, f.err, f.at = v, err, now()
			s.mu.Unlock()
			close(f.done)
		}()
	}
	s.mu.Unlock()
	select {
	case <-f.done:
		s.mu.Lock()
		defer s.mu.Unlock()
		return f.v, f.err
	case <-ctx.Done():
		var zero V
		return zero, ctx.Err()
	}
}

// Runs counts the reads started so far.
func (s *Slot[V]) Runs() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.runs
}
