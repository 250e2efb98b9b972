// Package probe makes single TCP connection attempts for the Service path
// probe: connect, then close at once, never a byte of payload. The real
// adapter is a thin wrapper around a dial function (by default net.Dialer
// in the daemon's network namespace: the node's, with hostNetwork), with a
// per-connect timeout; tests inject a dial function that connects from
// inside a test-made network namespace. Results are typed: an answer, a
// refusal (RST or ICMP), no answer within the timeout, unreachable, or
// aborted because the caller's context ended first (inconclusive, never a
// failure of the path).
//
// It also owns the typed reference of the probe's findings (Ref), and plans
// the paths to probe from the cluster view (Plan: which Service ports, in
// which families, compared with which endpoints, and why a Service is not
// probed); the detector judges what their connects mean.
package probe

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"syscall"
	"time"
)

// Outcome classifies one connection attempt.
type Outcome string

// Outcomes of Connect.
const (
	// Connected: the three-way handshake completed (and the connection
	// was closed at once).
	Connected Outcome = "connected"
	// Refused: the peer (or a rule on the way) answered with a reset
	// (ECONNREFUSED).
	Refused Outcome = "refused"
	// Timeout: no answer within the connect timeout (dropped on the way,
	// or the peer is gone without a trace).
	Timeout Outcome = "timeout"
	// Unreachable: no route, or an ICMP unreachable (EHOSTUNREACH,
	// ENETUNREACH, EADDRNOTAVAIL ...).
	Unreachable Outcome = "unreachable"
	// Failed: any other error.
	Failed Outcome = "error"
	// Aborted: the caller's context ended before the connect timeout. It
	// says nothing about the path.
	Aborted Outcome = "aborted"
)

// Result is one connection attempt.
type Result struct {
	// Addr is where it connected to.
	Addr netip.AddrPort
	// Outcome classifies it.
	Outcome Outcome
	// Latency is how long the attempt took (to the handshake, or to the
	// error).
	Latency time.Duration
	// Err is the dial error (nil when Connected).
	Err error
}

// OK reports whether the handshake completed.
func (r Result) OK() bool { return r.Outcome == Connected }

// String is "connected in 1.2ms", "timeout after 2s",
// "refused after 0.4ms: dial tcp ...: connection refused".
func (r Result) String() string {
	lat := r.Latency.Round(100 * time.Microsecond)
	switch r.Outcome {
	case Connected:
		return fmt.Sprintf("connected in %v", lat)
	case Timeout:
		return fmt.Sprintf("timeout after %v", lat)
	}
	if r.Err != nil {
		return fmt.Sprintf("%s after %v: %v", r.Outcome, lat, r.Err)
	}
	return fmt.Sprintf("%s after %v", r.Outcome, lat)
}

// Interface makes one bounded TCP connection attempt. Implementations are
// goroutine-safe.
type Interface interface {
	// Connect opens a TCP connection to addr and closes it at once,
	// waiting at most timeout (and never past ctx). It never writes.
	Connect(ctx context.Context, addr netip.AddrPort, timeout time.Duration) Result
}

// DialFunc dials a network address (net.Dialer.DialContext's signature).
type DialFunc func(ctx context.Context, network, addr string) (net.Conn, error)

// Options configure New.
type Options struct {
	// Dial makes the connection; default a net.Dialer in this process's
	// network namespace. Tests inject one that dials from another
	// namespace.
	Dial DialFunc
	// Now is the clock for latencies (default time.Now).
	Now func() time.Time
}

// Dialer is the real adapter.
type Dialer struct {
	dial DialFunc
	now  func() time.Time
}

var _ Interface = (*Dialer)(nil)

// New returns the real adapter.
func New(o Options) *Dialer {
	d := &Dialer{dial: o.Dial, now: o.Now}
	if d.dial == nil {
		var nd net.Dialer
		d.dial = nd.DialContext
	}
	if d.now == nil {
		d.now = time.Now
	}
	return d
}

// Connect implements Interface.
func (d *Dialer) Connect(ctx context.Context, addr netip.AddrPort, timeout time.Duration) Result {
	r := Result{Addr: addr}
	if !addr.IsValid() || addr.Port() == 0 {
		r.Outcome, r.Err = Failed, fmt.Errorf("invalid address %s", addr)
		return r
	}
	if err := ctx.Err(); err != nil {
		r.Outcome, r.Err = Aborted, err
		return r
	}
	cctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	start := d.now()
	c, err := d.dial(cctx, "tcp", addr.String())
	r.Latency = d.now().Sub(start)
	if err == nil {
		_ = c.Close()
		r.Outcome = Connected
		return r
	}
	r.Err = err
	r.Outcome = Classify(ctx, cctx, err)
	return r
}

// Classify maps a dial error to an Outcome: ctx is the caller's context,
// cctx the one bounded by the connect timeout.
func Classify(ctx, cctx context.Context, err error) Outcome {
	switch {
	case ctx.Err() != nil:
		return Aborted
	case errors.Is(err, syscall.ECONNREFUSED), errors.Is(err, syscall.ECONNRESET):
		return Refused
	case errors.Is(err, syscall.EHOSTUNREACH), errors.Is(err, syscall.ENETUNREACH),
		errors.Is(err, syscall.EADDRNOTAVAIL), errors.Is(err, syscall.EPERM), errors.Is(err, syscall.EACCES):
		// EPERM/EACCES: a local filter rule rejected the packet
		// (netfilter's DROP on OUTPUT answers the caller with EPERM).
		return Unreachable
	case errors.Is(err, context.DeadlineExceeded), cctx.Err() != nil:
		return Timeout
	}
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		return Timeout
	}
	return Failed
}
