package iptables

import (
	"context"
	"fmt"
	"sync"
	"time"
)

// Fake is a stateful Interface for tests: it holds save output text per
// family and backend, parses it on every Save like the real adapter, and
// counts calls. Unset backends are ErrUnavailable.
type Fake struct {
	mu    sync.Mutex
	text  map[string]string
	errs  map[string]error
	dur   map[string]time.Duration
	calls map[string]int
}

var _ Interface = (*Fake)(nil)

// NewFake returns a Fake with no backends.
func NewFake() *Fake {
	return &Fake{text: map[string]string{}, errs: map[string]error{}, dur: map[string]time.Duration{}, calls: map[string]int{}}
}

func key(f Family, b Backend) string { return string(f) + "/" + string(b) }

// SetRules makes the backend available with that save output.
func (k *Fake) SetRules(f Family, b Backend, saveOutput string) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.text[key(f, b)] = saveOutput
}

// SetError makes Save of that backend fail with err.
func (k *Fake) SetError(f Family, b Backend, err error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.errs[key(f, b)] = err
}

// SetDuration sets the Duration Save reports.
func (k *Fake) SetDuration(f Family, b Backend, d time.Duration) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.dur[key(f, b)] = d
}

// Calls returns how many times Save ran for that backend.
func (k *Fake) Calls(f Family, b Backend) int {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.calls[key(f, b)]
}

// Save implements Interface.
func (k *Fake) Save(ctx context.Context, f Family, b Backend) (*Snapshot, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	kk := key(f, b)
	k.calls[kk]++
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if err := k.errs[kk]; err != nil {
		return nil, err
	}
	text, ok := k.text[kk]
	if !ok {
		return nil, fmt.Errorf("%w: %s not installed (fake)", ErrUnavailable, SaveCommand(f, b))
	}
	rs, err := ParseString(text)
	if err != nil {
		return nil, fmt.Errorf("parsing %s output: %w", SaveCommand(f, b), err)
	}
	return &Snapshot{Family: f, Backend: b, Rules: rs, Duration: k.dur[kk], Bytes: len(text)}, nil
}
