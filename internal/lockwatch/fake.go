package lockwatch

import (
	"sync"
	"time"
)

// Fake is a Reader for tests: holds are set with SetHolds, Start is
// counted and can fail with StartErr.
type Fake struct {
	mu     sync.Mutex
	holds  []Hold
	starts int
	// StartErr is what Start returns.
	StartErr error
	// Mode is the Status mode once started ("inotify" when empty).
	Mode string
}

var _ Reader = (*Fake)(nil)

// SetHolds sets the holds (oldest first; an ongoing one has a zero End).
func (f *Fake) SetHolds(hs ...Hold) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.holds = make([]Hold, 0, len(hs))
	for _, h := range hs {
		f.holds = append(f.holds, cloneHold(h))
	}
}

// Starts is how many times Start was called.
func (f *Fake) Starts() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.starts
}

// Start implements Reader.
func (f *Fake) Start() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.starts++
	return f.StartErr
}

// Holds implements Reader.
func (f *Fake) Holds(since time.Time) []Hold {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []Hold
	for _, h := range f.holds {
		if h.End.IsZero() || !h.End.Before(since) {
			out = append(out, cloneHold(h))
		}
	}
	return out
}

// Status implements Reader.
func (f *Fake) Status() Status {
	f.mu.Lock()
	defer f.mu.Unlock()
	m := f.Mode
	if m == "" {
		m = "inotify"
	}
	return Status{Running: f.starts > 0 && f.StartErr == nil, Mode: m}
}
