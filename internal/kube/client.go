// Package kube connects the daemon to the Kubernetes API: client
// construction (in-cluster or --kubeconfig), the cluster view of Services
// and EndpointSlices that detectors read (View), the watch on this node's
// own Node object (NodeWatch), and the Reporter that publishes decisions as
// Events and the KubeProxyDataplaneHealthy NodeCondition.
//
// Everything here degrades: without cluster access Connect returns a
// *NoAccessError whose reason the daemon records in node.Unavailable, so
// API-dependent detectors and actions skip with that reason while the
// node-local ones keep running.
package kube

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"sync"
	"time"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
)

// UserAgent is sent with every request.
const UserAgent = "remediate"

// NoAccessError says why the daemon has no cluster access. It is not a
// failure of the daemon: API-dependent rules skip with Reason.
type NoAccessError struct{ Reason string }

func (e *NoAccessError) Error() string { return "no cluster access: " + e.Reason }

// IsNoAccess reports whether err is a *NoAccessError.
func IsNoAccess(err error) bool {
	var n *NoAccessError
	return errors.As(err, &n)
}

// Options tune Connect.
type Options struct {
	// Kubeconfig is the --kubeconfig path; empty means in-cluster config.
	Kubeconfig string
	// QPS and Burst bound the client's request rate (defaults 5 and 10: the
	// daemon runs on every node, so it must be gentle with the apiserver).
	QPS   float32
	Burst int
	// WrapTransport, if set, wraps the HTTP transport (tests count requests).
	WrapTransport func(http.RoundTripper) http.RoundTripper
}

// Client is a connected clientset plus the observed health of the
// connection (the Contact tracker sees every request's outcome).
type Client struct {
	Interface kubernetes.Interface
	Config    *rest.Config
	Contact   *Contact
}

// RESTConfig builds the client configuration: from opts.Kubeconfig when set,
// else in-cluster. With neither it returns a *NoAccessError naming both.
func RESTConfig(kubeconfig string) (*rest.Config, error) {
	if kubeconfig != "" {
		if _, err := os.Stat(kubeconfig); err != nil {
			return nil, &NoAccessError{Reason: fmt.Sprintf("--kubeconfig %s: %v", kubeconfig, err)}
		}
		cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
		if err != nil {
			return nil, &NoAccessError{Reason: fmt.Sprintf("--kubeconfig %s: %v", kubeconfig, err)}
		}
		return cfg, nil
	}
	cfg, err := rest.InClusterConfig()
	if err != nil {
		if errors.Is(err, rest.ErrNotInCluster) {
			return nil, &NoAccessError{Reason: "not running in a pod (KUBERNETES_SERVICE_HOST/PORT unset) and no --kubeconfig given"}
		}
		return nil, &NoAccessError{Reason: "in-cluster config: " + err.Error()}
	}
	return cfg, nil
}

// Connect builds a clientset. It does not contact the server: a server that
// is down shows up later as a stale view, not as a start-up failure.
func Connect(opts Options) (*Client, error) {
	cfg, err := RESTConfig(opts.Kubeconfig)
	if err != nil {
		return nil, err
	}
	return NewClient(cfg, opts)
}

// NewClient builds a Client from an existing rest.Config (tests use the
// harness's config). Protobuf is used on the wire: it halves decode memory
// for large lists.
func NewClient(cfg *rest.Config, opts Options) (*Client, error) {
	cfg = rest.CopyConfig(cfg)
	cfg.UserAgent = UserAgent
	cfg.QPS, cfg.Burst = opts.QPS, opts.Burst
	if cfg.QPS == 0 {
		cfg.QPS = 5
	}
	if cfg.Burst == 0 {
		cfg.Burst = 10
	}
	cfg.AcceptContentTypes = "application/vnd.kubernetes.protobuf,application/json"
	cfg.ContentType = "application/vnd.kubernetes.protobuf"
	contact := &Contact{}
	prev := cfg.WrapTransport
	cfg.WrapTransport = func(rt http.RoundTripper) http.RoundTripper {
		if prev != nil {
			rt = prev(rt)
		}
		if opts.WrapTransport != nil {
			rt = opts.WrapTransport(rt)
		}
		return &contactRoundTripper{next: rt, c: contact}
	}
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("building clientset: %w", err)
	}
	return &Client{Interface: cs, Config: cfg, Contact: contact}, nil
}

// Contact records the outcome of the latest requests to the apiserver: a
// transport error, a 5xx or a 429 (throttled) marks it unreachable, any
// other answer reachable.
type Contact struct {
	mu          sync.Mutex
	lastOK      time.Time
	lastErr     error
	lastErrTime time.Time
}

// ContactState is a snapshot of a Contact.
type ContactState struct {
	// LastOK is the time of the last answered request.
	LastOK time.Time
	// LastError is the last transport error or 5xx, at LastErrorTime.
	LastError     error
	LastErrorTime time.Time
}

// Snapshot returns the last successful contact and the last error.
func (c *Contact) Snapshot() ContactState {
	c.mu.Lock()
	defer c.mu.Unlock()
	return ContactState{LastOK: c.lastOK, LastError: c.lastErr, LastErrorTime: c.lastErrTime}
}

// Reachable is true when the latest outcome was a success.
func (c *Contact) Reachable() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return !c.lastOK.IsZero() && !c.lastOK.Before(c.lastErrTime)
}

func (c *Contact) record(err error) {
	now := time.Now()
	c.mu.Lock()
	defer c.mu.Unlock()
	if err != nil {
		c.lastErr, c.lastErrTime = err, now
		return
	}
	c.lastOK = now
}

type contactRoundTripper struct {
	next http.RoundTripper
	c    *Contact
}

func (t *contactRoundTripper) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := t.next.RoundTrip(req)
	switch {
	case err != nil && errors.Is(err, context.Canceled):
		// The caller gave up; says nothing about the server.
	case err != nil:
		t.c.record(fmt.Errorf("%s %s: %w", req.Method, req.URL.Path, err))
	case resp.StatusCode >= 500 || resp.StatusCode == http.StatusTooManyRequests:
		// An apiserver that throttles every request (429) is as good as
		// unreachable for a watch that needs to be re-established.
		t.c.record(fmt.Errorf("%s %s: HTTP %d", req.Method, req.URL.Path, resp.StatusCode))
	default:
		t.c.record(nil)
	}
	return resp, err
}
