package kubelet

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"strconv"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/rest"
	"k8s.io/utils/clock"

	"github.com/remediate-dev/remediate/internal/clip"
	"github.com/remediate-dev/remediate/internal/httpget"
)

// DefaultTimeout bounds one scrape (connect, headers and body). A healthy
// kubelet answers /metrics in tens of milliseconds; its own authentication
// and authorization webhooks (a TokenReview and a SubjectAccessReview,
// cached by the kubelet) add two API round trips on a cold cache. Under
// the default detectorTimeout (10s).
const DefaultTimeout = 8 * time.Second

// DefaultPort is the kubelet's authenticated port (--port) when the Node
// does not say (status.daemonEndpoints.kubeletEndpoint.port).
const DefaultPort = 10250

// Scrape is one parsed read of the kubelet's /metrics.
type Scrape struct {
	Metrics Metrics
	// At is when the scrape was made (the reader's clock).
	At time.Time
	// Seq increases by one with every real scrape.
	Seq uint64
	// URL is what was read.
	URL string
}

// Interface reads this node's kubelet. Implementations are goroutine-safe.
type Interface interface {
	// Metrics scrapes /metrics. A failure is an *Error saying whose side
	// it is (RBAC, TLS, unreachable, a bad answer).
	Metrics(ctx context.Context) (*Scrape, error)
}

// ErrorKind classifies a failed scrape.
type ErrorKind string

// The kinds of failure.
const (
	// KindForbidden: the kubelet refused the token (401) or its
	// authorizer refused `get nodes/metrics` (403): RBAC.
	KindForbidden ErrorKind = "forbidden"
	// KindTLS: the kubelet's serving certificate does not verify against
	// the CA configured (--kubelet-ca, else the cluster's CA).
	KindTLS ErrorKind = "tls"
	// KindUnreachable: no connection, or no answer within the timeout.
	KindUnreachable ErrorKind = "unreachable"
	// KindBadResponse: another HTTP status, a body over MaxBody, or one
	// that does not parse.
	KindBadResponse ErrorKind = "bad-response"
	// KindNotKubelet: with unverified TLS, the socket that accepted the
	// connection is not root's (or not visible here): no token is sent.
	KindNotKubelet ErrorKind = "not-kubelet"
	// KindNoAddress: the kubelet's address is not known (the Node not
	// seen yet, no address in its status) or refused (an unverified
	// connection to an address that is not this host's).
	KindNoAddress ErrorKind = "no-address"
)

// Error is a failed scrape.
type Error struct {
	Kind ErrorKind
	URL  string
	Err  error
}

func (e *Error) Error() string {
	hint := ""
	switch e.Kind {
	case KindForbidden:
		hint = " (the ServiceAccount needs get on nodes/metrics: the chart's and deploy/'s ClusterRole grant it)"
	case KindNotKubelet:
		hint = " (with --kubelet-insecure-tls the token goes only to a listener owned by root, as the kubelet's is: an unprivileged process may have taken the kubelet's port while it restarted; verified TLS with --kubelet-ca needs no such check)"
	case KindTLS:
		hint = " (the kubelet's serving certificate is not signed by the CA given: pass --kubelet-ca, enable the kubelet's serverTLSBootstrap, or --kubelet-insecure-tls, which only ever connects to an address of this host)"
	}
	return fmt.Sprintf("kubelet %s: %s: %v%s", e.URL, e.Kind, e.Err, hint)
}

func (e *Error) Unwrap() error { return e.Err }

// AsError returns err's *Error, if it is one.
func AsError(err error) (*Error, bool) {
	var e *Error
	ok := errors.As(err, &e)
	return e, ok
}

// Address resolves the kubelet's host and port (the daemon: from its Node
// watch). It must not block.
type Address func() (host string, port int, err error)

// Options configure a Client.
type Options struct {
	// URL is a fixed /metrics URL (--kubelet-metrics-url); empty means
	// https://<Address()>/metrics.
	URL string
	// Address resolves the kubelet when URL is empty.
	Address Address
	// Auth is the API client configuration whose credentials (the
	// ServiceAccount's token file, re-read as the kubelet rotates it, or a
	// kubeconfig's) are sent to the kubelet. Its Host and TLS settings for
	// the API server are not used.
	Auth *rest.Config
	// CAFile verifies the kubelet's serving certificate; empty: the CA of
	// Auth (the cluster's CA, which signs kubelet serving certificates only
	// with serverTLSBootstrap).
	CAFile string
	// InsecureTLS skips verifying the serving certificate (self-signed
	// kubelet certificates, the kubeadm default). It is allowed only to an
	// address of this host (the daemon runs with hostNetwork), and the
	// token is sent only on a connection accepted by a socket owned by
	// root (the kubelet's; see listener.go): the token never leaves the
	// node, nor reaches an unprivileged process that took the kubelet's
	// port. The API configuration's own insecure-skip-tls-verify is never
	// used: without InsecureTLS the certificate is verified, against
	// CAFile or the API configuration's CA (New refuses when neither).
	InsecureTLS bool
	// Timeout bounds a scrape (DefaultTimeout when 0).
	Timeout time.Duration
	// LocalAddress reports whether ip is an address of this host
	// (default: the interfaces of this network namespace).
	LocalAddress func(ip netip.Addr) bool
	// Clock defaults to the real clock.
	Clock clock.PassiveClock
}

// Client is the real Interface.
type Client struct {
	o Options
	// http is built once (the transport re-reads the token file itself).
	http *http.Client
	mu   sync.Mutex
	seq  uint64
}

var _ Interface = (*Client)(nil)

// New returns a Client; nothing is contacted yet.
func New(o Options) (*Client, error) {
	if o.URL == "" && o.Address == nil {
		return nil, errors.New("kubelet: neither a URL nor an address resolver")
	}
	if o.URL != "" {
		u, err := url.Parse(o.URL)
		if err != nil || u.Scheme != "https" || u.Host == "" {
			return nil, fmt.Errorf("kubelet metrics URL %q: want https://host:port/metrics", o.URL)
		}
	}
	if o.Auth == nil {
		return nil, errors.New("kubelet: no credentials (cluster access is needed: the kubelet authenticates the ServiceAccount's token)")
	}
	if o.Timeout <= 0 {
		o.Timeout = DefaultTimeout
	}
	if o.LocalAddress == nil {
		o.LocalAddress = hostAddress
	}
	if o.Clock == nil {
		o.Clock = clock.RealClock{}
	}
	cfg := rest.AnonymousClientConfig(o.Auth) // TLS client certs kept, credentials re-added below
	cfg.BearerToken, cfg.BearerTokenFile = o.Auth.BearerToken, o.Auth.BearerTokenFile
	cfg.ExecProvider, cfg.AuthProvider = o.Auth.ExecProvider, o.Auth.AuthProvider
	cfg.Username, cfg.Password = o.Auth.Username, o.Auth.Password
	cfg.Host = "https://kubelet.invalid" // not used: each request carries its URL
	cfg.TLSClientConfig.ServerName = ""
	// The API configuration's insecure-skip-tls-verify is never inherited:
	// the kubelet's certificate is verified against a CA given for it (or
	// the cluster's), or, only with InsecureTLS, not verified and the
	// token sent only to a root-owned listener of this host.
	cfg.TLSClientConfig.Insecure = o.InsecureTLS
	switch {
	case o.InsecureTLS:
		cfg.TLSClientConfig.CAFile, cfg.TLSClientConfig.CAData = "", nil
		cfg.Dial = ownerCheckedDial(procNetTCP, &net.Dialer{Timeout: o.Timeout})
	case o.CAFile != "":
		cfg.TLSClientConfig.CAFile, cfg.TLSClientConfig.CAData = o.CAFile, nil
	case len(cfg.TLSClientConfig.CAData) == 0 && cfg.TLSClientConfig.CAFile == "":
		// Not the system's roots: a publicly trusted certificate of
		// another host is not this node's kubelet.
		return nil, errors.New("kubelet: no CA to verify the kubelet's serving certificate (the API configuration has none, as with insecure-skip-tls-verify, which is never used for the kubelet): pass --kubelet-ca, or --kubelet-insecure-tls to scrape this host's kubelet unverified")
	}
	// Never through an HTTP proxy: the kubelet is on this node.
	cfg.Proxy = func(*http.Request) (*url.URL, error) { return nil, nil }
	cfg.Timeout = o.Timeout
	rt, err := rest.TransportFor(cfg)
	if err != nil {
		return nil, fmt.Errorf("kubelet transport: %w", err)
	}
	// httpget's client: a redirect, which would carry the token
	// elsewhere, is never followed.
	return &Client{o: o, http: httpget.NewClient(httpget.Options{Timeout: o.Timeout, Transport: rt})}, nil
}

// URL is the /metrics URL the next scrape reads, or why it is not known.
func (c *Client) URL() (string, error) {
	if c.o.URL != "" {
		return c.o.URL, c.checkLocal(c.o.URL)
	}
	host, port, err := c.o.Address()
	if err != nil {
		return "", &Error{Kind: KindNoAddress, URL: "(unresolved)", Err: err}
	}
	if port <= 0 {
		port = DefaultPort
	}
	u := "https://" + net.JoinHostPort(host, strconv.Itoa(port)) + "/metrics"
	return u, c.checkLocal(u)
}

// checkLocal refuses an unverified connection to an address that is not
// this host's: the token would be handed to whoever answers.
func (c *Client) checkLocal(raw string) error {
	if !c.o.InsecureTLS {
		return nil
	}
	u, err := url.Parse(raw)
	if err != nil {
		return &Error{Kind: KindNoAddress, URL: raw, Err: err}
	}
	ip, err := netip.ParseAddr(u.Hostname())
	if err != nil || !c.o.LocalAddress(ip.Unmap()) {
		return &Error{Kind: KindNoAddress, URL: raw,
			Err: fmt.Errorf("unverified TLS (--kubelet-insecure-tls) is only used to an IP address of this host, and %q is not one", u.Hostname())}
	}
	return nil
}

// Metrics implements Interface: one bounded GET, parsed.
func (c *Client) Metrics(ctx context.Context) (*Scrape, error) {
	u, err := c.URL()
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, c.o.Timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return nil, &Error{Kind: KindNoAddress, URL: u, Err: err}
	}
	req.Header.Set("Accept", "text/plain;version=0.0.4")
	resp, err := c.http.Do(req)
	if err != nil {
		return nil, &Error{Kind: classify(err), URL: u, Err: err}
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, MaxBody+1))
	if err != nil {
		return nil, &Error{Kind: KindUnreachable, URL: u, Err: fmt.Errorf("reading the body: %w", err)}
	}
	switch {
	case resp.StatusCode == http.StatusUnauthorized || resp.StatusCode == http.StatusForbidden:
		return nil, &Error{Kind: KindForbidden, URL: u, Err: fmt.Errorf("HTTP %d: %s", resp.StatusCode, clip.String(string(body), 300))}
	case resp.StatusCode != http.StatusOK:
		return nil, &Error{Kind: KindBadResponse, URL: u, Err: fmt.Errorf("HTTP %d: %s", resp.StatusCode, clip.String(string(body), 300))}
	}
	m, err := parseMetrics(body)
	if err != nil {
		return nil, &Error{Kind: KindBadResponse, URL: u, Err: err}
	}
	c.mu.Lock()
	c.seq++
	seq := c.seq
	c.mu.Unlock()
	return &Scrape{Metrics: m, At: c.o.Clock.Now(), Seq: seq, URL: u}, nil
}

// classify tells a TLS verification failure from an unreachable kubelet.
func classify(err error) ErrorKind {
	var verify *tls.CertificateVerificationError
	var unknown x509.UnknownAuthorityError
	var hostname x509.HostnameError
	var invalid x509.CertificateInvalidError
	if errors.As(err, &verify) || errors.As(err, &unknown) || errors.As(err, &hostname) || errors.As(err, &invalid) {
		return KindTLS
	}
	if errors.Is(err, ErrNotKubelet) {
		return KindNotKubelet
	}
	return KindUnreachable
}

// hostAddress reports whether ip is an address of an interface of this
// network namespace (or loopback).
func hostAddress(ip netip.Addr) bool {
	if ip.IsLoopback() {
		return true
	}
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		return false
	}
	for _, a := range addrs {
		if p, err := netip.ParsePrefix(a.String()); err == nil && p.Addr().Unmap() == ip {
			return true
		}
	}
	return false
}

// NodeAddress is the kubelet's address from its Node: the first
// InternalIP (as metrics-server and the API server's own kubelet client
// prefer on most clusters), else the first ExternalIP, and the port the
// kubelet reports (status.daemonEndpoints.kubeletEndpoint.port).
func NodeAddress(n *corev1.Node) (string, int, error) {
	if n == nil {
		return "", 0, errors.New("this node's Node object is not known yet")
	}
	port := int(n.Status.DaemonEndpoints.KubeletEndpoint.Port)
	for _, t := range []corev1.NodeAddressType{corev1.NodeInternalIP, corev1.NodeExternalIP} {
		for _, a := range n.Status.Addresses {
			if a.Type == t {
				if _, err := netip.ParseAddr(a.Address); err == nil {
					return a.Address, port, nil
				}
			}
		}
	}
	return "", 0, fmt.Errorf("node %s has no InternalIP or ExternalIP address in its status", n.Name)
}
