package kubeproxy

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"sync/atomic"
	"time"

	"k8s.io/utils/clock"

	"github.com/remediate-dev/remediate/internal/clip"
	"github.com/remediate-dev/remediate/internal/httpget"
)

// Defaults for Options.
const (
	DefaultMetricsURL   = "http://127.0.0.1:10249/metrics"
	DefaultHealthzURL   = "http://127.0.0.1:10256/healthz"
	DefaultProxyModeURL = "http://127.0.0.1:10249/proxyMode"
	DefaultSyncPeriod   = 30 * time.Second
	DefaultTimeout      = 3 * time.Second
	// DefaultMaxBytes bounds a response body. kube-proxy's /metrics is
	// about 100 KiB; 8 MiB leaves room without letting a broken endpoint
	// exhaust the daemon's memory.
	DefaultMaxBytes = 8 << 20
	// DefaultCacheTTL is how long a scrape is reused: long enough for the
	// detectors of one cycle to share it, much shorter than any sensible
	// cycle interval.
	DefaultCacheTTL = 5 * time.Second
)

// Options configures a Client. Zero fields take the defaults.
type Options struct {
	MetricsURL, HealthzURL, ProxyModeURL string
	// SyncPeriod is kube-proxy's configured syncPeriod.
	SyncPeriod time.Duration
	// Timeout bounds each HTTP request (connect, headers and body).
	Timeout time.Duration
	// MaxBytes bounds each response body.
	MaxBytes int64
	// CacheTTL is how long an answer (or a failure) is reused.
	CacheTTL time.Duration
	// Transport makes the connections (tests reach a kube-proxy in a
	// network namespace through it). Default: httpget's (no keep-alives,
	// no proxy); redirects are refused either way.
	Transport http.RoundTripper
	// Clock defaults to the real clock.
	Clock clock.PassiveClock
}

// Client is the real Interface: HTTP GETs to kube-proxy, answers cached for
// CacheTTL and shared between concurrent callers.
type Client struct {
	opts   Options
	http   *http.Client
	clock  clock.PassiveClock
	mets   cache[*Scrape]
	health cache[*Healthz]
	mode   cache[Mode]
	config cache[*Configz]
	// discovered is the syncPeriod /configz last reported (ns; 0 none).
	discovered atomic.Int64
	seq        uint64 // guarded by mets.sem
	// last is the newest scrape that parsed (nil before the first).
	last atomic.Pointer[Scrape]
}

var (
	_ Interface    = (*Client)(nil)
	_ ConfigReader = (*Client)(nil)
)

// New returns a Client; it checks the URLs but does not contact kube-proxy.
func New(opts Options) (*Client, error) {
	if opts.MetricsURL == "" {
		opts.MetricsURL = DefaultMetricsURL
	}
	if opts.HealthzURL == "" {
		opts.HealthzURL = DefaultHealthzURL
	}
	if opts.ProxyModeURL == "" {
		opts.ProxyModeURL = DefaultProxyModeURL
	}
	for _, u := range []string{opts.MetricsURL, opts.HealthzURL, opts.ProxyModeURL} {
		pu, err := url.Parse(u)
		if err != nil || (pu.Scheme != "http" && pu.Scheme != "https") || pu.Host == "" {
			return nil, fmt.Errorf("kube-proxy URL %q: want http(s)://host:port/path", u)
		}
	}
	if opts.SyncPeriod <= 0 {
		opts.SyncPeriod = DefaultSyncPeriod
	}
	if opts.Timeout <= 0 {
		opts.Timeout = DefaultTimeout
	}
	if opts.MaxBytes <= 0 {
		opts.MaxBytes = DefaultMaxBytes
	}
	if opts.CacheTTL < 0 {
		opts.CacheTTL = 0
	} else if opts.CacheTTL == 0 {
		opts.CacheTTL = DefaultCacheTTL
	}
	if opts.Clock == nil {
		opts.Clock = clock.RealClock{}
	}
	c := &Client{opts: opts, http: httpget.NewClient(httpget.Options{Timeout: opts.Timeout, Transport: opts.Transport}), clock: opts.Clock}
	c.mets.init()
	c.health.init()
	c.mode.init()
	c.config.init()
	return c, nil
}

// SyncPeriod implements Interface: the syncPeriod kube-proxy's /configz
// last reported (see Configz), else the configured one.
func (c *Client) SyncPeriod() time.Duration {
	if d := c.discovered.Load(); d > 0 {
		return time.Duration(d)
	}
	return c.opts.SyncPeriod
}

// ConfiguredSyncPeriod is the syncPeriod from Options (the policy's).
func (c *Client) ConfiguredSyncPeriod() time.Duration { return c.opts.SyncPeriod }

// Metrics implements Interface.
func (c *Client) Metrics(ctx context.Context) (*Scrape, error) {
	return c.mets.get(ctx, c.clock, c.opts.CacheTTL, func() (*Scrape, error) {
		status, body, err := c.get(ctx, c.opts.MetricsURL, "text/plain;version=0.0.4")
		if err != nil {
			return nil, err
		}
		if status != http.StatusOK {
			return nil, &Error{Kind: KindBadResponse, URL: c.opts.MetricsURL, Err: fmt.Errorf("HTTP %d: %s", status, snippet(body))}
		}
		m, err := parseMetrics(body) // the body read, not copied again
		if err != nil {
			return nil, &Error{Kind: KindBadResponse, URL: c.opts.MetricsURL, Err: err}
		}
		c.seq++
		sc := &Scrape{Metrics: m, At: c.clock.Now(), Seq: c.seq}
		c.last.Store(sc)
		return sc, nil
	})
}

// LastScrape returns the newest metrics scrape that parsed, without
// contacting kube-proxy (nil before the first): for exporting what the
// detectors last saw at /metrics scrape time.
func (c *Client) LastScrape() *Scrape { return c.last.Load() }

// Healthz implements Interface.
func (c *Client) Healthz(ctx context.Context) (*Healthz, error) {
	return c.health.get(ctx, c.clock, c.opts.CacheTTL, func() (*Healthz, error) {
		status, body, err := c.get(ctx, c.opts.HealthzURL, "application/json")
		if err != nil {
			return nil, err
		}
		h, err := ParseHealthz(status, body)
		if err != nil {
			return nil, &Error{Kind: KindBadResponse, URL: c.opts.HealthzURL, Err: fmt.Errorf("%w (body: %s)", err, snippet(body))}
		}
		return h, nil
	})
}

// ProxyMode implements Interface.
func (c *Client) ProxyMode(ctx context.Context) (Mode, error) {
	return c.mode.get(ctx, c.clock, c.opts.CacheTTL, func() (Mode, error) {
		status, body, err := c.get(ctx, c.opts.ProxyModeURL, "text/plain")
		if err != nil {
			return "", err
		}
		if status != http.StatusOK {
			return "", &Error{Kind: KindBadResponse, URL: c.opts.ProxyModeURL, Err: fmt.Errorf("HTTP %d: %s", status, snippet(body))}
		}
		m, err := ParseProxyMode(body)
		if err != nil {
			return "", &Error{Kind: KindBadResponse, URL: c.opts.ProxyModeURL, Err: err}
		}
		return m, nil
	})
}

// ParseProxyMode accepts the plain-text body of /proxyMode.
func ParseProxyMode(body []byte) (Mode, error) {
	switch m := Mode(strings.TrimSpace(string(body))); m {
	case ModeIPTables, ModeIPVS, ModeNFTables, "kernelspace":
		return m, nil
	default:
		return "", fmt.Errorf("unknown proxy mode %s", snippet(body))
	}
}

// get performs one bounded GET (httpget: no redirect, no proxy) and
// returns the status and at most MaxBytes of body (more is an ErrTooLarge
// bad response).
func (c *Client) get(ctx context.Context, u, accept string) (int, []byte, error) {
	status, body, err := httpget.Get(ctx, c.http, u, accept, c.opts.Timeout, c.opts.MaxBytes)
	var terr *httpget.TransportError
	switch {
	case err == nil:
		return status, body, nil
	case errors.Is(err, httpget.ErrTooLarge):
		return 0, nil, &Error{Kind: KindBadResponse, URL: u, Err: fmt.Errorf("%w (%d bytes)", ErrTooLarge, c.opts.MaxBytes)}
	case errors.As(err, &terr):
		return 0, nil, &Error{Kind: KindUnreachable, URL: u, Err: err}
	}
	// A redirect (never followed: kube-proxy does not redirect, and a
	// redirect's target is nobody we asked) or a URL that is no request.
	return 0, nil, &Error{Kind: KindBadResponse, URL: u, Err: err}
}

// snippet returns the start of a body for error messages.
func snippet(b []byte) string { return clip.Excerpt(b, 80) }

// cache holds one endpoint's last answer. The semaphore serialises fetches:
// callers arriving during a fetch wait (or give up with their ctx) and then
// reuse its result.
type cache[T any] struct {
	sem chan struct{}
	at  time.Time
	ok  bool
	val T
	err error
}

func (c *cache[T]) init() { c.sem = make(chan struct{}, 1) }

func (c *cache[T]) get(ctx context.Context, clk clock.PassiveClock, ttl time.Duration, fetch func() (T, error)) (T, error) {
	select {
	case c.sem <- struct{}{}:
	case <-ctx.Done():
		var zero T
		return zero, ctx.Err()
	}
	defer func() { <-c.sem }()
	if c.ok && clk.Since(c.at) < ttl {
		return c.val, c.err
	}
	v, err := fetch()
	if ctx.Err() != nil {
		// This caller gave up: its failure says nothing to the others.
		return v, err
	}
	c.val, c.err = v, err
	c.at, c.ok = clk.Now(), true
	return v, err
}
