// Package probetest provides a stateful fake probe.Interface: per-address
// answers, a log of every connect, and a switchable default.
package probetest

import (
	"context"
	"net/netip"
	"sync"
	"time"

	"github.com/remediate-dev/remediate/internal/probe"
)

// Fake answers Connect from a table of per-address outcomes (default
// Connected) and records every call. Goroutine-safe.
type Fake struct {
	mu      sync.Mutex
	answers map[netip.AddrPort]probe.Outcome
	seq     map[netip.AddrPort][]probe.Outcome
	calls   []netip.AddrPort
	// Latency is reported for every answer (default 1ms); a Timeout
	// reports the timeout.
	Latency time.Duration
}

var _ probe.Interface = (*Fake)(nil)

// New returns a fake where every address answers.
func New() *Fake {
	return &Fake{answers: map[netip.AddrPort]probe.Outcome{}, seq: map[netip.AddrPort][]probe.Outcome{}, Latency: time.Millisecond}
}

// Set makes addr answer with o from now on.
func (f *Fake) Set(addr string, o probe.Outcome) {
	f.mu.Lock()
	defer f.mu.Unlock()
	a := netip.MustParseAddrPort(addr)
	f.answers[a] = o
	delete(f.seq, a)
}

// Sequence makes addr's next connects answer os in order, then fall back
// to its Set outcome.
func (f *Fake) Sequence(addr string, os ...probe.Outcome) {
	f.mu.Lock()
	defer f.mu.Unlock()
	a := netip.MustParseAddrPort(addr)
	f.seq[a] = append([]probe.Outcome(nil), os...)
}

// Calls returns the addresses connected to, in order, and forgets them.
func (f *Fake) Calls() []netip.AddrPort {
	f.mu.Lock()
	defer f.mu.Unlock()
	c := f.calls
	f.calls = nil
	return c
}

// Connect implements probe.Interface.
func (f *Fake) Connect(ctx context.Context, addr netip.AddrPort, timeout time.Duration) probe.Result {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := ctx.Err(); err != nil {
		return probe.Result{Addr: addr, Outcome: probe.Aborted, Err: err}
	}
	f.calls = append(f.calls, addr)
	o, ok := f.answers[addr]
	if !ok {
		o = probe.Connected
	}
	if s := f.seq[addr]; len(s) > 0 {
		o, f.seq[addr] = s[0], s[1:]
	}
	r := probe.Result{Addr: addr, Outcome: o, Latency: f.Latency}
	switch o {
	case probe.Connected:
	case probe.Timeout:
		r.Latency, r.Err = timeout, context.DeadlineExceeded
	default:
		r.Err = &fakeErr{o}
	}
	return r
}

type fakeErr struct{ o probe.Outcome }

func (e *fakeErr) Error() string { return "fake: " + string(e.o) }
