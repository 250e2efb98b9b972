package detect

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"sync"
	"time"

	"github.com/remediate-dev/remediate/internal/finding"
	"github.com/remediate-dev/remediate/internal/kubeproxy"
	"github.com/remediate-dev/remediate/internal/node"
	"github.com/remediate-dev/remediate/internal/procs"
	"github.com/remediate-dev/remediate/policy"
)

// XtablesLockContentionParams are the thresholds of XtablesLockContention.
type XtablesLockContentionParams struct {
	// MaxHold is how long one process may hold the lock. /proc/locks has
	// no times, so the hold time is observed across cycles: from the first
	// of the consecutive cycles that saw the process holding it. A one-shot
	// run therefore sees 0 and only reports waiters; a process that
	// releases and re-takes the lock between two cycles counts as holding.
	MaxHold policy.Duration `yaml:"maxHold"`
	// MaxWaiters is how many processes may wait for the lock at once.
	MaxWaiters int `yaml:"maxWaiters"`
}

// SetDefaults sets the defaults of XtablesLockContention (registry.Defaulter).
func (p *XtablesLockContentionParams) SetDefaults() {
	*p = XtablesLockContentionParams{MaxHold: policy.D(30 * time.Second), MaxWaiters: 3}
}

// Validate implements policy.Validator.
func (p *XtablesLockContentionParams) Validate() []policy.FieldError {
	var errs []policy.FieldError
	if p.MaxHold.Duration <= 0 {
		errs = append(errs, policy.FieldError{Field: "maxHold", Msg: "must be > 0"})
	}
	if p.MaxWaiters < 1 {
		errs = append(errs, policy.FieldError{Field: "maxWaiters", Msg: "must be >= 1"})
	}
	return errs
}

func init() {
	Define("XtablesLockContention",
		"a process holding the xtables lock longer than maxHold, or maxWaiters processes waiting for it; one finding per real holder",
		newXtablesLockContention, Targets(finding.KindProcess), Windowed())
}

type xtablesLock struct {
	p XtablesLockContentionParams
	n *node.Node

	mu    sync.Mutex
	since map[string]time.Time // holder target (or "lock/<dev>") -> first seen holding
	judgement
	causes causeWatch
}

func newXtablesLockContention(p *XtablesLockContentionParams, n *node.Node) (Detector, error) {
	return &xtablesLock{p: *p, n: n, since: map[string]time.Time{}}, nil
}

// unknownHolder is the target when the lock is held by nobody visible
// (another PID namespace, or the flock caller exited with no visible child).
const unknownHolder = "xtables-lock/holder-not-visible"

func (d *xtablesLock) Detect(ctx context.Context) ([]Finding, error) {
	out, err := d.detect(ctx)
	if err != nil {
		return nil, err
	}
	// The causes: kube-proxy's churn, rule set size and save time, its
	// throttling, over at least maxHold. kube-proxy's metrics are the last
	// scrape the kube-proxy detectors made (no request here: a lock
	// detector never waits on kube-proxy); without one the causes say so.
	var sc *kubeproxy.Scrape
	if ls, ok := d.n.KubeProxy.(interface{ LastScrape() *kubeproxy.Scrape }); ok && d.n.KubeProxy != nil {
		sc = ls.LastScrape()
	}
	span := d.p.MaxHold.Duration
	d.causes.observe(ctx, d.n, sc, span)
	d.causes.attach(ctx, d.n, sc, func(Finding) kubeproxy.Family { return kubeproxy.Unlabelled }, span, out)
	return out, nil
}

func (d *xtablesLock) detect(ctx context.Context) ([]Finding, error) {
	if d.n.Procs == nil {
		return nil, Skip("%s", d.n.Why("procs"))
	}
	if d.n.XtablesLock == "" {
		return nil, Skip("no xtables lock file configured (--xtables-lock)")
	}
	l, err := d.n.Procs.FileLocks(ctx, d.n.XtablesLock)
	if errors.Is(err, fs.ErrNotExist) {
		// Either no legacy iptables ever ran here, or the host's /run is
		// not mounted into this container: say so rather than "healthy".
		d.track(nil, time.Time{})
		return nil, Skip("xtables lock file %s does not exist (no legacy iptables has run on this node, or the host's /run is not mounted here)", d.n.XtablesLock)
	}
	if err != nil {
		return nil, fmt.Errorf("reading locks on %s: %w", d.n.XtablesLock, err)
	}
	now := d.n.Clock.Now()
	if !l.Held {
		d.track(nil, now)
		d.set("xtables lock %s free", d.n.XtablesLock)
		return nil, nil
	}
	d.set("xtables lock %s held for less than %s, %d waiting (max %d)", d.n.XtablesLock, d.p.MaxHold.Duration, len(l.Waiters), d.p.MaxWaiters)
	keys := make([]string, 0, len(l.Holders))
	for _, h := range l.Holders {
		keys = append(keys, h.Target())
	}
	if len(keys) == 0 {
		keys = []string{unknownHolder}
	}
	since := d.track(keys, now)
	waiters := processSummaries(l.Waiters, now)
	holders := processSummaries(l.Holders, now)
	tooMany := len(l.Waiters) >= d.p.MaxWaiters

	var out []Finding
	for i, k := range keys {
		hold := now.Sub(since[k])
		if hold < d.p.MaxHold.Duration && !tooMany {
			continue
		}
		why := fmt.Sprintf("in every cycle for %s (max %s); %d waiting (max %d)", hold.Round(time.Second), d.p.MaxHold.Duration, len(l.Waiters), d.p.MaxWaiters)
		ev := map[string]any{
			"xtablesLock":             d.n.XtablesLock,
			"lockDev":                 l.Dev,
			"lockPIDs":                l.LockPIDs,
			procs.EvidenceHoldSeconds: durSeconds(hold),
			"holdTrackedSince":        since[k].UTC().Format(time.RFC3339),
			"holders":                 holders,
			"waiters":                 waiters,
			"waiterCount":             len(l.Waiters),
		}
		var msg string
		sev := Critical
		if k == unknownHolder {
			msg = fmt.Sprintf("xtables lock %s held by a process not visible here (/proc/locks pid %v) %s", d.n.XtablesLock, l.LockPIDs, why)
		} else {
			h := l.Holders[i]
			for kk, v := range processEvidence(h, now) {
				ev[kk] = v
			}
			msg = fmt.Sprintf("xtables lock %s held by %s (pid %d) %s", d.n.XtablesLock, h.Name(), h.Pid, why)
			ev["holdsXtablesLock"] = true
			if notTarget := outOfReach(h, procs.NetfilterPrograms, d.n.Procs.SelfNetNS(), ev); notTarget != "" {
				sev = Info
				msg += "; this holder is not a target: " + notTarget
			}
		}
		out = append(out, Finding{
			Detector: "XtablesLockContention",
			Target:   k,
			Severity: sev,
			Message:  msg,
			Evidence: ev,
		})
	}
	return out, nil
}

// track records when each holder was first seen holding the lock, forgets
// holders no longer holding it, and returns the first-seen times.
func (d *xtablesLock) track(keys []string, now time.Time) map[string]time.Time {
	d.mu.Lock()
	defer d.mu.Unlock()
	next := make(map[string]time.Time, len(keys))
	for _, k := range keys {
		if t, ok := d.since[k]; ok {
			next[k] = t
		} else {
			next[k] = now
		}
	}
	d.since = next
	out := make(map[string]time.Time, len(next))
	for k, v := range next {
		out[k] = v
	}
	return out
}
