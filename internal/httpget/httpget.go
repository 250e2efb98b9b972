// Package httpget is the daemon's one way to read an HTTP endpoint on the
// node (kube-proxy's /metrics, /healthz, /proxyMode, /configz), for the
// detectors and the evidence bundle alike. NewClient's client never
// follows a redirect (its target, and its body, is nobody we asked: a 302
// into a credentials document must not land in a finding or a bundle),
// never goes through a proxy from the environment (HTTP_PROXY would send a
// node-local request, and what it carries, off the node), keeps no idle
// connections and bounds the whole request; Get bounds the body read.
package httpget

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"time"

	"github.com/remediate-dev/remediate/internal/clip"
)

// Defaults of Options.
const (
	DefaultTimeout  = 3 * time.Second
	DefaultMaxBytes = 8 << 20
)

var (
	// ErrRedirect is wrapped by Get's error for a 3xx answer (never
	// followed).
	ErrRedirect = errors.New("redirect")
	// ErrTooLarge is wrapped by Get's error when a body exceeds the bound.
	ErrTooLarge = errors.New("response larger than the size limit")
)

// Options configure a client. Zero fields take the defaults.
type Options struct {
	// Timeout bounds each request: connect, headers and body.
	Timeout time.Duration
	// Transport makes the connections (tests reach an endpoint in a
	// network namespace through it). Default: no proxy, no keep-alives,
	// response headers within Timeout. Redirects are refused whatever the
	// transport.
	Transport http.RoundTripper
}

// NewClient returns the HTTP client every fetch of the daemon uses.
func NewClient(o Options) *http.Client {
	if o.Timeout <= 0 {
		o.Timeout = DefaultTimeout
	}
	tr := o.Transport
	if tr == nil {
		tr = &http.Transport{Proxy: nil, DisableKeepAlives: true, ResponseHeaderTimeout: o.Timeout,
			TLSHandshakeTimeout: o.Timeout, MaxResponseHeaderBytes: 64 << 10}
	}
	return &http.Client{Transport: tr, Timeout: o.Timeout, CheckRedirect: noRedirects}
}

// noRedirects makes the client return a redirect response as is (Get
// turns it into ErrRedirect).
func noRedirects(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }

// TransportError is a failure to get an answer at all (connect, timeout,
// reading the body), as opposed to an answer Get refuses (ErrRedirect,
// ErrTooLarge).
type TransportError struct{ Err error }

func (e *TransportError) Error() string { return e.Err.Error() }
func (e *TransportError) Unwrap() error { return e.Err }

// Get performs one GET of u with c within timeout (0: c's own) and
// returns the status and at most maxBytes of body (more is ErrTooLarge; 0
// means DefaultMaxBytes). A 3xx answer is ErrRedirect, its target named
// (clipped), its body not read.
func Get(ctx context.Context, c *http.Client, u, accept string, timeout time.Duration, maxBytes int64) (int, []byte, error) {
	if maxBytes <= 0 {
		maxBytes = DefaultMaxBytes
	}
	if timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, timeout)
		defer cancel()
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return 0, nil, err
	}
	if accept != "" {
		req.Header.Set("Accept", accept)
	}
	resp, err := c.Do(req)
	if err != nil {
		return 0, nil, &TransportError{Err: err}
	}
	defer resp.Body.Close()
	if resp.StatusCode >= 300 && resp.StatusCode < 400 {
		return resp.StatusCode, nil, fmt.Errorf("HTTP %d %w to %q not followed", resp.StatusCode, ErrRedirect, clip.String(resp.Header.Get("Location"), 200))
	}
	body, err := io.ReadAll(io.LimitReader(resp.Body, maxBytes+1))
	if err != nil {
		return resp.StatusCode, nil, &TransportError{Err: fmt.Errorf("reading body: %w", err)}
	}
	if int64(len(body)) > maxBytes {
		return resp.StatusCode, body[:maxBytes], fmt.Errorf("%w (%d bytes)", ErrTooLarge, maxBytes)
	}
	return resp.StatusCode, body, nil
}
