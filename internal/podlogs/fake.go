package podlogs

import (
	"context"
	"fmt"
	"sync"
)

// Fake is a stateful Reader for tests: lines appended to a source are
// returned by Tail (the last MaxLines of them), an error set for a source
// is returned instead.
type Fake struct {
	// MaxLines bounds a Tail (0: all).
	MaxLines int

	mu    sync.Mutex
	lines map[Source][]Line
	errs  map[Source]error
	reads int
}

var _ Reader = (*Fake)(nil)

// Append adds lines to a source's log.
func (f *Fake) Append(s Source, lines ...Line) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.lines == nil {
		f.lines = map[Source][]Line{}
	}
	f.lines[s] = append(f.lines[s], lines...)
}

// SetError makes Tail of s fail with err (nil clears it).
func (f *Fake) SetError(s Source, err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.errs == nil {
		f.errs = map[Source]error{}
	}
	f.errs[s] = err
}

// Reads is how many Tails were answered.
func (f *Fake) Reads() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.reads
}

// Tail implements Reader.
func (f *Fake) Tail(ctx context.Context, s Source) (Tail, error) {
	if err := ctx.Err(); err != nil {
		return Tail{}, err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.reads++
	if err := f.errs[s]; err != nil {
		return Tail{}, err
	}
	ls, ok := f.lines[s]
	if !ok {
		return Tail{}, fmt.Errorf("%s: %w", s, ErrNoLogs)
	}
	if f.MaxLines > 0 && len(ls) > f.MaxLines {
		ls = ls[len(ls)-f.MaxLines:]
	}
	return Tail{Lines: append([]Line(nil), ls...), Files: []string{"fake:" + s.String()}}, nil
}
