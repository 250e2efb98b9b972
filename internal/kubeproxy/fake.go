package kubeproxy

import (
	"context"
	"errors"
	"strings"
	"sync"
	"time"

	"k8s.io/utils/clock"
)

// Fake is an in-memory Interface for tests. It holds kube-proxy's current
// answers as raw text (so the real parsers run) and parses them on every
// call; every Metrics call is a new scrape (Seq increases). Set* methods
// change the answers between calls. Goroutine-safe.
type Fake struct {
	mu             sync.Mutex
	clock          clock.PassiveClock
	syncPeriod     time.Duration
	metricsText    string
	metricsErr     error
	healthStatus   int
	healthBody     string
	healthErr      error
	mode           Mode
	modeErr        error
	configz        *Configz
	configzErr     error
	seq            uint64
	MetricsCalls   int
	HealthzCalls   int
	ProxyModeCalls int
}

var (
	_ Interface    = (*Fake)(nil)
	_ ConfigReader = (*Fake)(nil)
)

// SetConfigz sets what Configz returns (nil and nil: unreachable).
func (f *Fake) SetConfigz(c *Configz, err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.configz, f.configzErr = c, err
}

// ConfiguredSyncPeriod implements ConfigReader.
func (f *Fake) ConfiguredSyncPeriod() time.Duration { return f.syncPeriod }

// Configz implements ConfigReader.
func (f *Fake) Configz(ctx context.Context) (*Configz, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.configz == nil && f.configzErr == nil {
		return nil, &Error{Kind: KindUnreachable, URL: "http://127.0.0.1:10249/configz", Err: errNotSet}
	}
	return f.configz, f.configzErr
}

// NewFake returns a Fake in iptables mode with the given syncPeriod and no
// metrics or health answers yet (reads fail as unreachable until set).
func NewFake(clk clock.PassiveClock, syncPeriod time.Duration) *Fake {
	return &Fake{clock: clk, syncPeriod: syncPeriod, mode: ModeIPTables,
		metricsErr: &Error{Kind: KindUnreachable, URL: DefaultMetricsURL, Err: errNotSet},
		healthErr:  &Error{Kind: KindUnreachable, URL: DefaultHealthzURL, Err: errNotSet}}
}

var errNotSet = errors.New("no answer set in the fake")

// SetMetrics sets the /metrics text and clears any injected error.
func (f *Fake) SetMetrics(text string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.metricsText, f.metricsErr = text, nil
}

// SetMetricsError makes Metrics fail with err.
func (f *Fake) SetMetricsError(err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.metricsErr = err
}

// SetHealthz sets the /healthz status and body and clears any error.
func (f *Fake) SetHealthz(status int, body string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.healthStatus, f.healthBody, f.healthErr = status, body, nil
}

// SetHealthzError makes Healthz fail with err.
func (f *Fake) SetHealthzError(err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.healthErr = err
}

// SetMode sets the proxy mode (and clears the mode error when err is nil).
func (f *Fake) SetMode(m Mode, err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.mode, f.modeErr = m, err
}

// Metrics implements Interface.
func (f *Fake) Metrics(ctx context.Context) (*Scrape, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.MetricsCalls++
	if f.metricsErr != nil {
		return nil, f.metricsErr
	}
	m, err := ParseMetrics(strings.NewReader(f.metricsText))
	if err != nil {
		return nil, &Error{Kind: KindBadResponse, URL: DefaultMetricsURL, Err: err}
	}
	f.seq++
	return &Scrape{Metrics: m, At: f.clock.Now(), Seq: f.seq}, nil
}

// Healthz implements Interface.
func (f *Fake) Healthz(ctx context.Context) (*Healthz, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.HealthzCalls++
	if f.healthErr != nil {
		return nil, f.healthErr
	}
	h, err := ParseHealthz(f.healthStatus, []byte(f.healthBody))
	if err != nil {
		return nil, &Error{Kind: KindBadResponse, URL: DefaultHealthzURL, Err: err}
	}
	return h, nil
}

// ProxyMode implements Interface.
func (f *Fake) ProxyMode(ctx context.Context) (Mode, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.ProxyModeCalls++
	return f.mode, f.modeErr
}

// SyncPeriod implements Interface.
func (f *Fake) SyncPeriod() time.Duration { return f.syncPeriod }
