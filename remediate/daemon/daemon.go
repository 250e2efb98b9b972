// Package daemon runs the engine as a long-lived node agent: a jittered
// detection loop, policy reload on SIGHUP and when the policy file changes
// (a ConfigMap update swaps the kubelet's `..data` symlink), graceful stop,
// and the HTTP endpoints /metrics, /healthz and /readyz.
package daemon

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"sync"
	"time"

	"go.uber.org/zap"
	"k8s.io/utils/clock"

	"github.com/remediate-dev/remediate/internal/boundedfile"
	"github.com/remediate-dev/remediate/policy"
	"github.com/remediate-dev/remediate/remediate"
)

// Config wires a daemon.
type Config struct {
	// PolicyPath is watched for changes and reloaded on SIGHUP.
	PolicyPath string
	// Load reads and validates a policy file.
	Load func(path string) (*policy.Policy, error)
	// Engine runs cycles; its policy is replaced on reload.
	Engine *remediate.Engine
	// OnReport, if set, receives every cycle's report (events, conditions).
	OnReport func(context.Context, *remediate.Report)
	// OnReloadError, if set, is told about a rejected policy.
	OnReloadError func(context.Context, error)
	// Metrics serves /metrics (remediate/exporters/prometheusexporter);
	// nil: not served. Reload results reach the engine's exporters
	// (Engine.PolicyReloaded).
	Metrics http.Handler
	// Addr for the HTTP endpoints ("" disables them).
	Addr string
	// PollInterval for policy file changes (default 5s).
	PollInterval time.Duration
	// Reload receives a value on SIGHUP.
	Reload <-chan struct{}
	Clock  clock.WithTicker
	Log    *zap.Logger
	// Rand returns a float in [0,1) for jitter (default math/rand/v2).
	Rand func() float64
}

// Daemon is a running loop; create with New, start with Run.
type Daemon struct {
	cfg Config

	mu        sync.Mutex
	started   time.Time
	lastCycle time.Time
	inCycle   time.Time // start of the cycle running now (zero between cycles)
	lastErr   error
	ready     bool
	policySum [32]byte
	policyVer string // mtime+size+inode of the file last seen
	findings  findingLog
	cycles    cycleLog
}

// New returns a daemon for cfg.
func New(cfg Config) *Daemon {
	if cfg.Clock == nil {
		cfg.Clock = clock.RealClock{}
	}
	if cfg.Log == nil {
		cfg.Log = zap.NewNop()
	}
	if cfg.PollInterval <= 0 {
		cfg.PollInterval = 5 * time.Second
	}
	if cfg.Rand == nil {
		cfg.Rand = rand.Float64
	}
	d := &Daemon{cfg: cfg}
	// Fingerprint the policy now, just after it was loaded, so a change
	// made between New and Run is still seen as a change.
	if cfg.PolicyPath != "" {
		d.policySum, d.policyVer = d.fingerprint()
	}
	return d
}

// Run loops until ctx is done. The cycle in progress when ctx is cancelled
// ends without starting new actions (a running one sees its context
// cancelled), then held guardrail resources are released and the HTTP
// server stops.
func (d *Daemon) Run(ctx context.Context) error {
	d.mu.Lock()
	d.started = d.cfg.Clock.Now()
	d.mu.Unlock()

	var srv *http.Server
	if d.cfg.Addr != "" {
		ln, err := net.Listen("tcp", d.cfg.Addr)
		if err != nil {
			return fmt.Errorf("listening on %s: %w", d.cfg.Addr, err)
		}
		srv = &http.Server{Handler: d.Handler(), ReadHeaderTimeout: 5 * time.Second}
		go func() {
			if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
				d.cfg.Log.Error("http server failed", zap.Error(err))
			}
		}()
		d.cfg.Log.Info("serving /metrics, /healthz, /readyz", zap.String("addr", ln.Addr().String()))
	}
	defer func() {
		if srv != nil {
			sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			_ = srv.Shutdown(sctx)
			cancel()
		}
		rctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		d.cfg.Engine.Close(rctx)
		cancel()
		d.cfg.Log.Info("stopped", zap.Duration("uptime", d.cfg.Clock.Since(d.started).Round(time.Second)))
	}()

	pol := d.cfg.Engine.Policy()
	// First cycle after a random fraction of the jitter window, so a
	// DaemonSet's pods do not act in lockstep.
	wait := time.Duration(d.cfg.Rand() * pol.Jitter * float64(pol.Interval.Duration))
	d.cfg.Log.Info("daemon started", zap.String("mode", string(pol.Mode)), zap.Int("rules", len(pol.Rules)),
		zap.Duration("interval", pol.Interval.Duration), zap.Duration("firstCycleIn", wait))
	timer := d.cfg.Clock.NewTimer(wait)
	defer timer.Stop()
	poll := d.cfg.Clock.NewTicker(d.cfg.PollInterval)
	defer poll.Stop()
	for {
		select {
		case <-ctx.Done():
			d.cfg.Log.Info("stopping", zap.String("reason", context.Cause(ctx).Error()))
			return nil
		case <-d.cfg.Reload:
			d.reload(ctx, "SIGHUP")
		case <-poll.C():
			// Cheap stat every poll; the content is read and hashed only
			// when the file looks different (a touch without a change does
			// not reload).
			if ver := d.version(); ver != d.policyVer {
				d.policyVer = ver
				if d.contentSum() != d.policySum {
					d.reload(ctx, "policy file changed")
				}
			}
		case <-timer.C():
			d.cycle(ctx)
			pol = d.cfg.Engine.Policy()
			timer.Reset(nextInterval(pol, d.cfg.Rand()))
		}
	}
}

// nextInterval is the interval ± jitter/2 of it.
func nextInterval(p *policy.Policy, r float64) time.Duration {
	iv := float64(p.Interval.Duration)
	return time.Duration(iv + (r-0.5)*p.Jitter*iv)
}

func (d *Daemon) cycle(ctx context.Context) {
	start := d.cfg.Clock.Now()
	d.mu.Lock()
	d.inCycle = start
	d.mu.Unlock()
	rep, err := d.cfg.Engine.Cycle(ctx)
	d.mu.Lock()
	d.inCycle = time.Time{}
	d.lastErr = err
	if rep != nil {
		d.lastCycle = d.cfg.Clock.Now()
		d.ready = true
	}
	d.mu.Unlock()
	if err != nil {
		d.cfg.Log.Error("cycle failed", zap.Error(err))
	}
	if rep == nil {
		return
	}
	now := d.cfg.Clock.Now()
	d.cycles.observe(d.cfg.Log, rep, now.Sub(start), now)
	d.findings.observe(d.cfg.Log, rep)
	if d.cfg.OnReport != nil {
		d.cfg.OnReport(ctx, rep)
	}
}

// reload loads the policy file; an invalid policy keeps the old one.
func (d *Daemon) reload(ctx context.Context, why string) {
	d.policySum, d.policyVer = d.fingerprint()
	p, err := d.cfg.Load(d.cfg.PolicyPath)
	if err == nil {
		err = d.cfg.Engine.SetPolicy(p)
	}
	if err != nil {
		d.cfg.Log.Error("policy reload rejected; keeping the policy in force", zap.String("trigger", why), zap.Error(err))
		d.cfg.Engine.PolicyReloaded(err)
		if d.cfg.OnReloadError != nil {
			d.cfg.OnReloadError(ctx, err)
		}
		return
	}
	d.cfg.Engine.PolicyReloaded(nil)
	d.cfg.Log.Info("policy reloaded", zap.String("trigger", why), zap.String("mode", string(p.Mode)), zap.Int("rules", len(p.Rules)))
}

// fingerprint returns the policy file's content hash and its version.
func (d *Daemon) fingerprint() ([32]byte, string) { return d.contentSum(), d.version() }

// version is a cheap identity of the resolved policy file: inode, size and
// mtime. The kubelet updates a ConfigMap volume by swapping a symlink, which
// changes the inode.
func (d *Daemon) version() string {
	fi, err := os.Stat(d.cfg.PolicyPath)
	if err != nil {
		return "missing: " + err.Error()
	}
	return fmt.Sprintf("%d/%d/%d", inode(fi), fi.Size(), fi.ModTime().UnixNano())
}

// contentSum hashes the policy file (zero if unreadable). The read is
// bounded like policy.Load's: a FIFO or a huge file swapped in for the
// policy is not waited on or read (it hashes as unreadable, and the
// reload that follows is rejected).
func (d *Daemon) contentSum() [32]byte {
	data, err := boundedfile.Read(d.cfg.PolicyPath, policy.MaxSize)
	if err != nil {
		return [32]byte{}
	}
	return sha256.Sum256(data)
}

// Handler serves /metrics, /healthz and /readyz.
func (d *Daemon) Handler() http.Handler {
	mux := http.NewServeMux()
	if d.cfg.Metrics != nil {
		mux.Handle("/metrics", d.cfg.Metrics)
	}
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) {
		if err := d.Healthy(); err != nil {
			http.Error(w, err.Error(), http.StatusServiceUnavailable)
			return
		}
		fmt.Fprintln(w, "ok")
	})
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, _ *http.Request) {
		d.mu.Lock()
		ready := d.ready
		d.mu.Unlock()
		if !ready {
			http.Error(w, "no cycle completed yet", http.StatusServiceUnavailable)
			return
		}
		fmt.Fprintln(w, "ok")
	})
	return mux
}

// Healthy reports whether the loop is alive. Between cycles, the last one
// (or the start) is at most three intervals plus the detector timeout old:
// cycles that stopped (the loop stuck anywhere but in a cycle) turn it
// unhealthy within a few intervals. During a cycle, the cycle has run for
// at most what it may take (detector timeout and every action's timeout)
// plus an interval.
func (d *Daemon) Healthy() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	p := d.cfg.Engine.Policy()
	now := d.cfg.Clock.Now()
	if !d.inCycle.IsZero() {
		limit := p.Interval.Duration + p.DetectorTimeout.Duration + time.Duration(p.Guardrails.MaxTargetsPerCycle)*p.ActionTimeout.Duration
		if age := now.Sub(d.inCycle); age > limit {
			return fmt.Errorf("the cycle started %s ago has not finished (limit %s); loop stalled", age.Round(time.Second), limit)
		}
		return nil
	}
	limit := 3*p.Interval.Duration + p.DetectorTimeout.Duration
	last := d.lastCycle
	if last.IsZero() {
		last = d.started
	}
	if age := now.Sub(last); age > limit {
		return fmt.Errorf("last cycle finished %s ago (limit %s: 3 intervals and the detector timeout); cycles stopped, loop stalled", age.Round(time.Second), limit)
	}
	return nil
}
