package conntrack

import (
	"context"
	"errors"
	"sync"
	"time"
)

// Fake is a stateful in-memory Interface for tests of detectors and
// actions. Fields may be set directly before use (or under Do); methods are
// goroutine-safe.
type Fake struct {
	mu sync.Mutex

	// Flows is the table. Deletions remove entries from it.
	Flows []Flow
	// ExtraCount adds simulated entries (not in Flows) to Usage.Count, to
	// model big tables cheaply.
	ExtraCount uint64
	// MaxValue is nf_conntrack_max; HashSizeValue the hashsize.
	MaxValue      uint64
	HashSizeValue uint64
	// StatsValue is returned by Stats.
	StatsValue Stats
	// TimeoutsValue are the timeouts (TimeoutTuner); IgnoreSetTimeouts
	// makes SetTimeouts succeed without changing them.
	TimeoutsValue     Timeouts
	IgnoreSetTimeouts bool
	// ScanHook, when set, runs before each entry a scan hands out (n
	// counts from 0), unlocked: a test can make a dump slow. It must not
	// change Flows.
	ScanHook func(n int)
	// Record is what SetMax last recorded (HasRecord says whether any).
	Record    MaxRecord
	HasRecord bool
	// Now stamps records; time.Now when nil.
	Now func() time.Time
	// Errs injects an error per method name ("Usage", "SetMax", ...).
	Errs map[string]error
	// Calls counts calls per method name.
	Calls map[string]int
}

var _ Interface = (*Fake)(nil)

// NewFake returns a Fake with the given max and hashsize.
// The timeouts are the kernel's defaults (30 s, 120 s, 120 s).
func NewFake(max, hashSize uint64) *Fake {
	return &Fake{MaxValue: max, HashSizeValue: hashSize, Errs: map[string]error{}, Calls: map[string]int{},
		TimeoutsValue: Timeouts{UDP: 30 * time.Second, UDPStream: 120 * time.Second, TCPTimeWait: 120 * time.Second}}
}

// Do runs fn with the fake locked, to change its state from another
// goroutine (a kube-proxy restart resetting the max, say).
func (f *Fake) Do(fn func(f *Fake)) {
	f.mu.Lock()
	defer f.mu.Unlock()
	fn(f)
}

// InjectError makes method fail with err (nil clears it).
func (f *Fake) InjectError(method string, err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.Errs == nil {
		f.Errs = map[string]error{}
	}
	f.Errs[method] = err
}

// call counts a call and returns the injected error, if any. f.mu held.
func (f *Fake) call(method string) error {
	if f.Calls == nil {
		f.Calls = map[string]int{}
	}
	f.Calls[method]++
	return f.Errs[method]
}

func (f *Fake) now() time.Time {
	if f.Now != nil {
		return f.Now()
	}
	return time.Now()
}

// Usage implements Interface.
func (f *Fake) Usage(ctx context.Context) (Usage, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.call("Usage"); err != nil {
		return Usage{}, err
	}
	return Usage{Count: f.ExtraCount + uint64(len(f.Flows)), Max: f.MaxValue}, nil
}

// Stats implements Interface.
func (f *Fake) Stats(ctx context.Context) (Stats, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.call("Stats"); err != nil {
		return Stats{}, err
	}
	return f.StatsValue, nil
}

// Max implements Interface.
func (f *Fake) Max(ctx context.Context) (uint64, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.MaxValue, f.call("Max")
}

// SetMax implements Interface.
func (f *Fake) SetMax(ctx context.Context, n uint64) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.call("SetMax"); err != nil {
		return err
	}
	f.MaxValue = n
	f.Record.Max, f.Record.SetAt, f.HasRecord = n, f.now(), true
	return nil
}

// HashSize implements Interface.
func (f *Fake) HashSize(ctx context.Context) (uint64, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.HashSizeValue, f.call("HashSize")
}

// SetHashSize implements Interface.
func (f *Fake) SetHashSize(ctx context.Context, n uint64) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.call("SetHashSize"); err != nil {
		return err
	}
	f.HashSizeValue = n
	f.Record.HashSize = n
	return nil
}

// LastSetMax implements Interface.
func (f *Fake) LastSetMax(ctx context.Context) (MaxRecord, bool, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.call("LastSetMax"); err != nil {
		return MaxRecord{}, false, err
	}
	return f.Record, f.HasRecord, nil
}

// CountUDPByReplySource implements Interface.
func (f *Fake) CountUDPByReplySource(ctx context.Context, b Backend, limit int) (int, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.call("CountUDPByReplySource"); err != nil {
		return 0, err
	}
	if err := b.Validate(); err != nil {
		return 0, err
	}
	n := 0
	f.each(b.Matches, func(*Flow) (del, stop bool) {
		n++
		return false, limit > 0 && n > limit
	})
	return n, nil
}

// DeleteUDPByReplySource implements Interface.
func (f *Fake) DeleteUDPByReplySource(ctx context.Context, b Backend, limit int) (DeleteResult, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	var res DeleteResult
	if err := f.call("DeleteUDPByReplySource"); err != nil {
		return res, err
	}
	if err := b.Validate(); err != nil {
		return res, err
	}
	if limit <= 0 {
		return res, errors.New("delete needs a positive limit")
	}
	res.KernelFiltered = true
	f.each(b.Matches, func(*Flow) (del, stop bool) {
		res.Scanned++
		if res.Matched < limit {
			res.Matched++
			res.Deleted++
			return true, false
		}
		res.Truncated = true
		return false, false
	})
	return res, nil
}

var _ Scanner = (*Fake)(nil)

// ScanProtocol implements Scanner over Flows.
func (f *Fake) ScanProtocol(ctx context.Context, v6 bool, proto uint8, limit int, fn func(fl *Flow) error) (ScanResult, error) {
	res, err := f.scan(ctx, "ScanProtocol", limit, func(fl *Flow) bool { return fl.Proto == proto && fl.OrigDst.Addr().Is4() != v6 }, fn)
	res.KernelFiltered = true
	return res, err
}

var _ TableScanner = (*Fake)(nil)

// ScanTable implements TableScanner over Flows (every family and protocol).
func (f *Fake) ScanTable(ctx context.Context, limit int, fn func(fl *Flow) error) (ScanResult, error) {
	return f.scan(ctx, "ScanTable", limit, func(*Flow) bool { return true }, fn)
}

// scan calls fn with a copy of each flow keep accepts, at most limit.
func (f *Fake) scan(ctx context.Context, method string, limit int, keep func(*Flow) bool, fn func(fl *Flow) error) (ScanResult, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	var res ScanResult
	if err := f.call(method); err != nil {
		return res, err
	}
	if limit <= 0 {
		return res, errors.New("scan needs a positive limit")
	}
	var err error
	f.each(keep, func(fl *Flow) (del, stop bool) {
		if res.Scanned == limit {
			res.Truncated = true
			return false, true
		}
		if f.ScanHook != nil {
			f.mu.Unlock()
			f.ScanHook(res.Scanned)
			f.mu.Lock()
		}
		if err = ctx.Err(); err != nil {
			return false, true
		}
		res.Scanned++
		err = fn(fl)
		return false, err != nil
	})
	return res, err
}

// each is the fake's one pass over the table: it calls visit with a copy
// of each flow match accepts, in table order, until visit says stop, and
// removes the flows visit says to delete (the rest keep their order). The
// table is written only when something is deleted, so a visit that
// deletes nothing may release f.mu (the scan hook). f.mu held.
func (f *Fake) each(match func(*Flow) bool, visit func(fl *Flow) (del, stop bool)) {
	kept, i := 0, 0
	for ; i < len(f.Flows); i++ {
		fl := f.Flows[i]
		del, stop := false, false
		if match(&fl) {
			del, stop = visit(&fl)
		}
		if !del {
			if kept != i {
				f.Flows[kept] = f.Flows[i]
			}
			kept++
		}
		if stop {
			i++
			break
		}
	}
	if kept != i { // something was deleted: close the gaps
		f.Flows = append(f.Flows[:kept], f.Flows[i:]...)
	}
}

var _ TimeoutTuner = (*Fake)(nil)

// Timeouts implements TimeoutTuner (TimeoutsValue).
func (f *Fake) Timeouts(ctx context.Context) (Timeouts, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.TimeoutsValue, f.call("Timeouts")
}

// SetTimeouts implements TimeoutTuner: the non-zero fields are stored
// unless IgnoreSetTimeouts (a kernel that does not take the write).
func (f *Fake) SetTimeouts(ctx context.Context, t Timeouts) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.call("SetTimeouts"); err != nil {
		return err
	}
	if f.IgnoreSetTimeouts {
		return nil
	}
	if t.UDP > 0 {
		f.TimeoutsValue.UDP = t.UDP
	}
	if t.UDPStream > 0 {
		f.TimeoutsValue.UDPStream = t.UDPStream
	}
	if t.TCPTimeWait > 0 {
		f.TimeoutsValue.TCPTimeWait = t.TCPTimeWait
	}
	return nil
}
