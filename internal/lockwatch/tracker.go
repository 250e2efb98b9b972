package lockwatch

import (
	"slices"
	"time"
)

// Sample is one read of /proc/locks, restricted to the lock file.
type Sample struct {
	// At is when it was read.
	At time.Time
	// LockPIDs are the pids of the granted locks (empty: free).
	LockPIDs []int32
	// WaiterPIDs are the pids of the "->" lines.
	WaiterPIDs []int32
	// Continuous is true when nothing can have been missed since the
	// previous sample (the watcher was on inotify the whole time, or
	// polling at burst rate): a hold first seen now began after the
	// previous sample.
	Continuous bool
}

// Held reports whether the sample saw the lock held.
func (s Sample) Held() bool { return len(s.LockPIDs) > 0 }

// tracker turns samples into holds. It is a pure state machine: the
// watcher feeds it samples and the processes it resolved, in order; it
// keeps at most ringSize completed holds and the histogram. Not
// goroutine-safe (the watcher guards it).
type tracker struct {
	ringSize int
	ring     []Hold // completed holds, oldest first once full (circular at next)
	next     int
	cur      *Hold
	last     *Sample // the previous sample
	// prevWaiters are the waiters of the sample before last, when last
	// was continuous with it (nil otherwise: a waiter's start unseen).
	prevWaiters []int32
	prevOK      bool
	hist        map[HistKey]*Histogram
	// An open of the lock file not yet followed by a close, since when,
	// and whether a hold was seen meanwhile (else the use becomes an
	// Unsampled hold).
	openPending bool
	openSince   time.Time
	openSaw     bool
}

func newTracker(ringSize int) *tracker {
	if ringSize < 1 {
		ringSize = 1
	}
	return &tracker{ringSize: ringSize, hist: map[HistKey]*Histogram{}}
}

// step is what one sample changed.
type step struct {
	// newHold: a hold began; resolve its holders and pass them to
	// setHolders.
	newHold bool
	// newWaiters are waiters not seen before in the current hold;
	// resolve them and pass them to addWaiter.
	newWaiters []int32
	// ended is the hold that ended at this sample, if any.
	ended *Hold
}

// observe feeds one sample.
func (t *tracker) observe(s Sample) (st step) {
	if t.cur != nil && (!s.Held() || !slices.Equal(t.cur.LockPIDs, s.LockPIDs)) {
		h := t.end(s.At)
		st.ended = &h
	}
	if s.Held() {
		t.openSaw = true
	}
	if s.Held() && t.cur == nil {
		exact := s.Continuous && t.last != nil
		if exact && t.last.Held() && slices.Equal(t.last.LockPIDs, s.LockPIDs) {
			exact = false // cannot happen after end; defensive
		}
		t.cur = &Hold{Start: s.At, Exact: exact, LockPIDs: slices.Clone(s.LockPIDs)}
		st.newHold = true
	}
	if t.cur != nil {
		if n := len(s.WaiterPIDs); n > t.cur.MaxWaiting {
			t.cur.MaxWaiting = n
		}
	next:
		for _, pid := range s.WaiterPIDs {
			for i := range t.cur.Waiters {
				if t.cur.Waiters[i].Pid == pid {
					t.cur.Waiters[i].Until = s.At
					continue next
				}
			}
			if len(t.cur.Waiters)+len(st.newWaiters) < MaxWaitersPerHold && !slices.Contains(st.newWaiters, pid) {
				st.newWaiters = append(st.newWaiters, pid)
			}
		}
		for i := range t.cur.Holders {
			t.cur.Holders[i].Until = s.At
		}
	}
	t.prevOK = s.Continuous && t.last != nil
	t.prevWaiters = nil
	if t.prevOK {
		t.prevWaiters = t.last.WaiterPIDs
	}
	cp := s
	cp.LockPIDs, cp.WaiterPIDs = slices.Clone(s.LockPIDs), slices.Clone(s.WaiterPIDs)
	t.last = &cp
	return st
}

// opened records an open of the lock file (inotify IN_OPEN).
func (t *tracker) opened(at time.Time) {
	if !t.openPending {
		t.openPending, t.openSince, t.openSaw = true, at, t.cur != nil
	}
}

// closed records a close (IN_CLOSE). When no sample saw the lock held
// since the first open not yet matched, that use is recorded as an
// Unsampled hold. inotify merges identical events that queue up and a
// process may have opened the file before the watcher started, so opens
// and closes are not counted one for one: overlapping uses count once
// (an undercount, never a use that did not happen).
func (t *tracker) closed(at time.Time) {
	if !t.openPending {
		return
	}
	t.openPending = false
	if !t.openSaw {
		t.cur = &Hold{Start: t.openSince, Unsampled: true}
		t.end(at)
	}
}

// lostEvents forgets the pending open (inotify queue overflow).
func (t *tracker) lostEvents() { t.openPending = false }

// setHolders records the resolved holders of the current hold.
func (t *tracker) setHolders(hs []Proc) {
	if t.cur == nil {
		return
	}
	if len(hs) > maxHoldersPerHold {
		hs = hs[:maxHoldersPerHold]
	}
	for i := range hs {
		hs[i].Since, hs[i].Until = t.cur.Start, t.cur.Start
		if t.last != nil {
			hs[i].Until = t.last.At
		}
	}
	t.cur.Holders = slices.Clone(hs)
}

// addWaiter records a resolved waiter of the current hold, first seen at
// the last sample.
func (t *tracker) addWaiter(p Proc) {
	if t.cur == nil || len(t.cur.Waiters) >= MaxWaitersPerHold {
		return
	}
	for _, w := range t.cur.Waiters {
		if w.Pid == p.Pid {
			return
		}
	}
	if t.last != nil {
		p.Since, p.Until = t.last.At, t.last.At
	}
	p.SeenStart = t.prevOK && !slices.Contains(t.prevWaiters, p.Pid)
	t.cur.Waiters = append(t.cur.Waiters, p)
}

// end closes the current hold at 'at', records it and returns it.
func (t *tracker) end(at time.Time) Hold {
	h := *t.cur
	t.cur = nil
	h.End = at
	k := HistKey{Program: Label(h.Program()), KubeProxy: h.KubeProxy()}
	hg := t.hist[k]
	if hg == nil {
		hg = &Histogram{}
		t.hist[k] = hg
	}
	hg.observe(h.Duration(at).Seconds())
	if len(t.ring) < t.ringSize {
		t.ring = append(t.ring, h)
	} else {
		t.ring[t.next] = h
		t.next = (t.next + 1) % t.ringSize
	}
	return cloneHold(h)
}

// holds returns the completed holds that ended at or after since, oldest
// first, then the current hold, each a copy.
func (t *tracker) holds(since time.Time) []Hold {
	var out []Hold
	n := len(t.ring)
	for i := 0; i < n; i++ {
		h := t.ring[(t.next+i)%n]
		if !h.End.Before(since) {
			out = append(out, cloneHold(h))
		}
	}
	if t.cur != nil {
		out = append(out, cloneHold(*t.cur))
	}
	return out
}

// histogram returns a copy of the histogram.
func (t *tracker) histogram() map[HistKey]Histogram {
	out := make(map[HistKey]Histogram, len(t.hist))
	for k, h := range t.hist {
		out[k] = Histogram{Counts: slices.Clone(h.Counts), Count: h.Count, Sum: h.Sum}
	}
	return out
}

func cloneHold(h Hold) Hold {
	h.LockPIDs = slices.Clone(h.LockPIDs)
	h.Holders = slices.Clone(h.Holders)
	h.Waiters = slices.Clone(h.Waiters)
	return h
}
