package ipvs

import (
	"sync"
	"time"
)

// Counts is what the adapter last listed: the number of virtual servers,
// and the real servers of those whose destinations were listed since.
type Counts struct {
	Virtual int
	Real    int
	// At is when the virtual servers were last listed.
	At time.Time
}

// countTracker records listings for Counts. Its size is bounded by the
// last virtual-server listing: real-server counts are kept only for
// virtual servers in it.
type countTracker struct {
	mu      sync.Mutex
	listed  bool
	at      time.Time
	virtual int
	real    map[string]int // VirtualServer.Key() -> real servers
}

// virtuals records a listing of every virtual server.
func (c *countTracker) virtuals(vss []VirtualServer, now time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	next := make(map[string]int, len(vss))
	for _, vs := range vss {
		k := vs.Key()
		next[k] = c.real[k]
	}
	c.listed, c.at, c.virtual, c.real = true, now, len(vss), next
}

// reals records a listing of one virtual server's real servers.
func (c *countTracker) reals(vs VirtualServer, n int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, ok := c.real[vs.Key()]; ok {
		c.real[vs.Key()] = n
	}
}

// counts returns the totals; ok is false before the first listing.
func (c *countTracker) counts() (Counts, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.listed {
		return Counts{}, false
	}
	out := Counts{Virtual: c.virtual, At: c.at}
	for _, n := range c.real {
		out.Real += n
	}
	return out, true
}
