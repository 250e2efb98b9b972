package kubelet

import (
	"context"
	"sync"
	"time"
)

// Fake is a stateful Interface for unit tests: each Metrics returns the
// metrics last set (a new Seq each time, at the time Now gives), or the
// error set.
type Fake struct {
	mu  sync.Mutex
	m   Metrics
	err error
	seq uint64
	// Now gives the scrape time (default time.Now).
	Now func() time.Time
}

var _ Interface = (*Fake)(nil)

// Set makes the next scrapes return m.
func (f *Fake) Set(m Metrics) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.m, f.err = m, nil
}

// Fail makes the next scrapes fail with err.
func (f *Fake) Fail(err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.err = err
}

// Metrics implements Interface.
func (f *Fake) Metrics(context.Context) (*Scrape, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.err != nil {
		return nil, f.err
	}
	f.seq++
	now := time.Now
	if f.Now != nil {
		now = f.Now
	}
	return &Scrape{Metrics: f.m, At: now(), Seq: f.seq, URL: "fake"}, nil
}
