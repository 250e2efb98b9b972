package podlogs

import (
	"context"
	"sync"
	"time"
)

// Shared serves the detectors of one cycle from one read: a source's Tail
// read less than MaxAge ago is returned again (an error too), so the four
// kube-proxy symptom detectors, KubeProxyRestoreFailures and
// XtablesLockMessages read each log once a cycle, not once each.
type Shared struct {
	// R is the reader behind it.
	R Reader
	// MaxAge is how long a read serves (well under a detection interval).
	MaxAge time.Duration
	// Now is the clock (nil: time.Now).
	Now func() time.Time

	mu   sync.Mutex
	seen map[Source]sharedRead
}

type sharedRead struct {
	at   time.Time
	tail Tail
	err  error
}

var _ Reader = (*Shared)(nil)

// Tail implements Reader.
func (s *Shared) Tail(ctx context.Context, src Source) (Tail, error) {
	now := time.Now
	if s.Now != nil {
		now = s.Now
	}
	s.mu.Lock()
	defer s.mu.Unlock() // one read at a time: the reads are bounded and short
	t := now()
	for k, r := range s.seen { // forget what is too old (bounds the map)
		if t.Sub(r.at) >= s.MaxAge {
			delete(s.seen, k)
		}
	}
	if r, ok := s.seen[src]; ok {
		return r.tail, r.err
	}
	tail, err := s.R.Tail(ctx, src)
	if ctx.Err() != nil {
		return tail, err // a cancelled read is not kept
	}
	if s.seen == nil {
		s.seen = map[Source]sharedRead{}
	}
	s.seen[src] = sharedRead{at: t, tail: tail, err: err}
	return tail, err
}
