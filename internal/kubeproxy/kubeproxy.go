// Package kubeproxy reads kube-proxy's observable surface: its Prometheus
// /metrics, its /healthz and its /proxyMode, across the versions users run
// (1.30-1.32 without the ip_family label and with Go time strings in
// /healthz; 1.33+ with ip_family and per-family RFC 3339 health).
//
// Reads are plain HTTP GETs with short timeouts and a response size limit;
// nothing here takes the xtables lock or touches the kernel. A malformed,
// oversized or unexpected answer is an error of kind KindBadResponse, a
// refused or timed-out connection one of kind KindUnreachable, so detectors
// can report "kube-proxy is unreachable" as its own finding.
//
// The real Client caches each scrape for a short TTL, so the detectors of
// one cycle share one scrape instead of each asking kube-proxy again.
package kubeproxy

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// Mode is kube-proxy's proxy mode as /proxyMode reports it.
type Mode string

// Modes.
const (
	ModeIPTables Mode = "iptables"
	ModeIPVS     Mode = "ipvs"
	ModeNFTables Mode = "nftables"
)

// Scrape is one read of /metrics.
type Scrape struct {
	// Metrics is the parsed content.
	Metrics *Metrics
	// At is when the scrape was made (the reader's clock).
	At time.Time
	// Seq increases by one with every real scrape, so a caller that sees
	// the same Seq twice knows it got a cached copy, not a new sample.
	Seq uint64
}

// Interface reads kube-proxy. Implementations are goroutine-safe.
type Interface interface {
	// Metrics returns a recent scrape of /metrics (possibly shared with
	// other callers of the same cycle).
	Metrics(ctx context.Context) (*Scrape, error)
	// Healthz returns a recent answer of /healthz. A 503 is not an error:
	// it is a Healthz with Healthy false.
	Healthz(ctx context.Context) (*Healthz, error)
	// ProxyMode returns the mode kube-proxy runs in.
	ProxyMode(ctx context.Context) (Mode, error)
	// SyncPeriod is kube-proxy's configured syncPeriod (from the policy),
	// the unit the detectors' thresholds are expressed in.
	SyncPeriod() time.Duration
}

// ErrorKind classifies a failed read.
type ErrorKind string

// Error kinds.
const (
	// KindUnreachable: connection refused, reset, or timed out.
	KindUnreachable ErrorKind = "unreachable"
	// KindBadResponse: unexpected HTTP status, body over the size limit,
	// or a body that does not parse.
	KindBadResponse ErrorKind = "bad-response"
)

// Error is a failed read of one kube-proxy endpoint.
type Error struct {
	Kind ErrorKind
	// URL is the endpoint read.
	URL string
	Err error
}

func (e *Error) Error() string {
	return fmt.Sprintf("kube-proxy %s at %s: %v", e.Kind, e.URL, e.Err)
}

func (e *Error) Unwrap() error { return e.Err }

// AsError returns err as an *Error if it is (or wraps) one.
func AsError(err error) (*Error, bool) {
	var e *Error
	if errors.As(err, &e) {
		return e, true
	}
	return nil, false
}

// ErrTooLarge is wrapped by a KindBadResponse error when a body exceeds the
// size limit.
var ErrTooLarge = errors.New("response larger than the size limit")
