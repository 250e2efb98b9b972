package kubeproxy

import (
	"context"
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	clocktesting "k8s.io/utils/clock/testing"
)

// server serves /metrics, /healthz and /proxyMode from fixtures that the
// test can change between scrapes.
type server struct {
	mu            sync.Mutex
	metrics       []byte
	healthStatus  int
	health        []byte
	mode          string
	delay         time.Duration
	metricsHits   atomic.Int64
	metricsStatus int
}

func (s *server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	metrics, hs, health, mode, delay, ms := s.metrics, s.healthStatus, s.health, s.mode, s.delay, s.metricsStatus
	s.mu.Unlock()
	if delay > 0 {
		select {
		case <-time.After(delay):
		case <-r.Context().Done():
			return
		}
	}
	switch r.URL.Path {
	case "/metrics":
		s.metricsHits.Add(1)
		if ms != 0 {
			w.WriteHeader(ms)
		}
		w.Write(metrics)
	case "/healthz":
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(hs)
		w.Write(health)
	case "/proxyMode":
		w.Write([]byte(mode))
	default:
		http.NotFound(w, r)
	}
}

func newServer(t *testing.T) (*server, *httptest.Server) {
	s := &server{metrics: readFixture(t, "metrics-v1.34-healthy.txt"), healthStatus: 200,
		health: readFixture(t, "healthz-v1.34-healthy.json"), mode: "iptables"}
	ts := httptest.NewServer(s)
	t.Cleanup(ts.Close)
	return s, ts
}

func newClient(t *testing.T, base string, opts Options) *Client {
	t.Helper()
	opts.MetricsURL = base + "/metrics"
	opts.HealthzURL = base + "/healthz"
	opts.ProxyModeURL = base + "/proxyMode"
	c, err := New(opts)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func TestClientReadsAndCaches(t *testing.T) {
	s, ts := newServer(t)
	clk := clocktesting.NewFakeClock(time.Unix(1795261400, 0))
	c := newClient(t, ts.URL, Options{Clock: clk, CacheTTL: 5 * time.Second})
	ctx := context.Background()
	if c.LastScrape() != nil {
		t.Error("LastScrape before any scrape")
	}

	// Concurrent callers of one cycle share one scrape.
	var wg sync.WaitGroup
	seqs := make([]uint64, 7)
	for i := range seqs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sc, err := c.Metrics(ctx)
			if err != nil {
				t.Error(err)
				return
			}
			seqs[i] = sc.Seq
		}()
	}
	wg.Wait()
	if n := s.metricsHits.Load(); n != 1 {
		t.Errorf("7 concurrent callers made %d scrapes, want 1", n)
	}
	for _, q := range seqs {
		if q != 1 {
			t.Errorf("seqs = %v, want all 1", seqs)
			break
		}
	}
	if last := c.LastScrape(); last == nil || last.Seq != 1 || s.metricsHits.Load() != 1 {
		t.Errorf("LastScrape = %+v after one scrape (and must not scrape itself)", last)
	}

	// After the TTL a new scrape is made and sees the new answer.
	s.mu.Lock()
	s.metrics = readFixture(t, "metrics-v1.34-stalled.txt")
	s.mu.Unlock()
	clk.Step(6 * time.Second)
	sc, err := c.Metrics(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if sc.Seq != 2 || *sc.Metrics.Families["IPv4"].RestoreFailures != 1 {
		t.Errorf("second scrape seq %d, failures %v", sc.Seq, sc.Metrics.Families["IPv4"].RestoreFailures)
	}

	h, err := c.Healthz(ctx)
	if err != nil || !h.Healthy || h.Format != FormatPerFamily {
		t.Errorf("Healthz = %+v, %v", h, err)
	}
	s.mu.Lock()
	s.healthStatus, s.health = 503, readFixture(t, "healthz-v1.34-stalled.json")
	s.mu.Unlock()
	clk.Step(6 * time.Second)
	h, err = c.Healthz(ctx)
	if err != nil || h.Healthy || h.StatusCode != 503 {
		t.Errorf("503 Healthz = %+v, %v; want unhealthy without error", h, err)
	}
	if m, err := c.ProxyMode(ctx); err != nil || m != ModeIPTables {
		t.Errorf("ProxyMode = %q, %v", m, err)
	}
}

func wantKind(t *testing.T, err error, kind ErrorKind) {
	t.Helper()
	e, ok := AsError(err)
	if !ok {
		t.Fatalf("error %v is not a *kubeproxy.Error", err)
	}
	if e.Kind != kind {
		t.Fatalf("kind = %s (%v), want %s", e.Kind, err, kind)
	}
}

func TestClientBadResponses(t *testing.T) {
	ctx := context.Background()
	t.Run("too large", func(t *testing.T) {
		s, ts := newServer(t)
		s.metrics = []byte(strings.Repeat("# comment line that is long enough\n", 10000))
		c := newClient(t, ts.URL, Options{MaxBytes: 64 << 10, CacheTTL: -1})
		_, err := c.Metrics(ctx)
		wantKind(t, err, KindBadResponse)
		if !errors.Is(err, ErrTooLarge) {
			t.Errorf("err %v does not wrap ErrTooLarge", err)
		}
	})
	t.Run("malformed metrics", func(t *testing.T) {
		s, ts := newServer(t)
		s.metrics = []byte("kubeproxy_x{ 1\n")
		_, err := newClient(t, ts.URL, Options{}).Metrics(ctx)
		wantKind(t, err, KindBadResponse)
	})
	t.Run("metrics HTTP 500", func(t *testing.T) {
		s, ts := newServer(t)
		s.metricsStatus = 500
		_, err := newClient(t, ts.URL, Options{}).Metrics(ctx)
		wantKind(t, err, KindBadResponse)
	})
	t.Run("html healthz", func(t *testing.T) {
		s, ts := newServer(t)
		s.health = []byte("<html>proxy</html>")
		_, err := newClient(t, ts.URL, Options{}).Healthz(ctx)
		wantKind(t, err, KindBadResponse)
	})
	t.Run("timeout", func(t *testing.T) {
		s, ts := newServer(t)
		s.delay = 2 * time.Second
		start := time.Now()
		_, err := newClient(t, ts.URL, Options{Timeout: 200 * time.Millisecond}).Metrics(ctx)
		wantKind(t, err, KindUnreachable)
		if d := time.Since(start); d > 1500*time.Millisecond {
			t.Errorf("timed-out scrape took %v", d)
		}
	})
	t.Run("connection refused", func(t *testing.T) {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		addr := l.Addr().String()
		l.Close()
		c := newClient(t, "http://"+addr, Options{})
		_, err = c.Metrics(ctx)
		wantKind(t, err, KindUnreachable)
		_, err = c.Healthz(ctx)
		wantKind(t, err, KindUnreachable)
	})
}

func TestNewRejectsBadURL(t *testing.T) {
	for _, u := range []string{"127.0.0.1:10249/metrics", "ftp://x/metrics", "http:///metrics"} {
		if _, err := New(Options{MetricsURL: u}); err == nil {
			t.Errorf("New accepted %q", u)
		}
	}
}

func TestCacheDoesNotShareAGivenUpCaller(t *testing.T) {
	s, ts := newServer(t)
	s.delay = 300 * time.Millisecond
	c := newClient(t, ts.URL, Options{})
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if _, err := c.Metrics(ctx); err == nil {
		t.Fatal("want a timeout")
	}
	s.mu.Lock()
	s.delay = 0
	s.mu.Unlock()
	if _, err := c.Metrics(context.Background()); err != nil {
		t.Errorf("a caller's own timeout was served to the next caller: %v", err)
	}
}
