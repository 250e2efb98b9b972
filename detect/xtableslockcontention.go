package detect

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/remediate-dev/remediate/internal/finding"
	"github.com/remediate-dev/remediate/internal/kubeproxy"
	"github.com/remediate-dev/remediate/internal/lockwatch"
	"github.com/remediate-dev/remediate/internal/node"
	"github.com/remediate-dev/remediate/internal/procident"
	"github.com/remediate-dev/remediate/internal/procs"
	"github.com/remediate-dev/remediate/policy"
)

// XtablesLockContentionParams are the thresholds of XtablesLockContention.
type XtablesLockContentionParams struct {
	// MaxHold is how long one process may hold the lock. With the lock
	// watcher (the daemon and --once) the hold is measured as it happens:
	// a process that releases and re-takes the lock starts a new hold.
	// Without it, the hold is tracked across cycles (a process seen
	// holding at two consecutive cycles counts as holding in between).
	MaxHold policy.Duration `yaml:"maxHold"`
	// MaxWaiters is how many processes may wait for the lock at once.
	MaxWaiters int `yaml:"maxWaiters"`
	// MaxRestoreWait is how long an iptables-restore may wait for the
	// lock (or be watched holding it): kube-proxy's restores give up
	// after 5s (`-w 5`) and count a restore failure, so a restore waiting
	// longer means the holder is starving the node's rules. The holders
	// are then reported at once, with "held ≥ N" from the oldest
	// waiter's wait.
	MaxRestoreWait policy.Duration `yaml:"maxRestoreWait"`
	// RepeatHold, RepeatMax and RepeatWindow report micro-outages: more
	// than RepeatMax holds of at least RepeatHold within RepeatWindow
	// (measured by the lock watcher; target xtables-lock/repeated-holds).
	// The field guide on xtables lock micro-outages sees 1-3s holds drop
	// new connections during deploys, and judges kube-proxy rates over
	// 5-minute windows; the count is ours: one slow restore is normal, a
	// series of them is the guide's pattern.
	RepeatHold   policy.Duration `yaml:"repeatHold"`
	RepeatMax    int             `yaml:"repeatMax"`
	RepeatWindow policy.Duration `yaml:"repeatWindow"`
}

// SetDefaults sets the defaults of XtablesLockContention (registry.Defaulter).
func (p *XtablesLockContentionParams) SetDefaults() {
	*p = XtablesLockContentionParams{MaxHold: policy.D(30 * time.Second), MaxWaiters: 3,
		MaxRestoreWait: policy.D(5 * time.Second),
		RepeatHold:     policy.D(time.Second), RepeatMax: 3, RepeatWindow: policy.D(5 * time.Minute)}
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
	if p.MaxRestoreWait.Duration <= 0 {
		errs = append(errs, policy.FieldError{Field: "maxRestoreWait", Msg: "must be > 0"})
	}
	if p.RepeatHold.Duration <= 0 {
		errs = append(errs, policy.FieldError{Field: "repeatHold", Msg: "must be > 0"})
	}
	if p.RepeatMax < 0 {
		errs = append(errs, policy.FieldError{Field: "repeatMax", Msg: "must be >= 0"})
	}
	if p.RepeatWindow.Duration < p.RepeatHold.Duration {
		errs = append(errs, policy.FieldError{Field: "repeatWindow", Msg: "must be >= repeatHold"})
	}
	return errs
}

func init() {
	Define("XtablesLockContention",
		"a process holding the xtables lock longer than maxHold, an iptables-restore waiting for it longer than maxRestoreWait, or maxWaiters processes waiting (one finding per real holder); repeated holds of repeatHold or more (micro-outages)",
		newXtablesLockContention, Targets(finding.KindProcess), Windowed())
}

type xtablesLock struct {
	p XtablesLockContentionParams
	n *node.Node

	mu    sync.Mutex
	since map[string]time.Time // holder target (or "lock/<dev>") -> first seen holding (without the watcher)
	kp    []kpFailures         // kube-proxy's restore failures at recent cycles (repeated holds)
	judgement
	causes causeWatch
	watch  progressWatch
}

func newXtablesLockContention(p *XtablesLockContentionParams, n *node.Node) (Detector, error) {
	return &xtablesLock{p: *p, n: n, since: map[string]time.Time{}}, nil
}

// unknownHolder is the target when the lock is held by nobody visible
// (another PID namespace, or the flock caller exited with no visible child).
const unknownHolder = "xtables-lock/holder-not-visible"

// repeatedHolds is the target of the micro-outage finding.
const repeatedHolds = "xtables-lock/repeated-holds"

func (d *xtablesLock) Detect(ctx context.Context) ([]finding.Finding, error) {
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
	d.causes.attach(ctx, d.n, sc, func(finding.Finding) kubeproxy.Family { return kubeproxy.Unlabelled }, span, out)
	return out, nil
}

func (d *xtablesLock) detect(ctx context.Context) ([]finding.Finding, error) {
	if d.n.Procs == nil {
		return nil, finding.Skip("%s", d.n.Why("procs"))
	}
	if d.n.XtablesLock == "" {
		return nil, finding.Skip("no xtables lock file configured (--xtables-lock)")
	}
	l, err := d.n.Procs.FileLocks(ctx, d.n.XtablesLock)
	if errors.Is(err, fs.ErrNotExist) {
		// Either no legacy iptables ever ran here, or the host's /run is
		// not mounted into this container: say so rather than "healthy".
		d.track(nil, time.Time{})
		return nil, finding.Skip("xtables lock file %s does not exist (no legacy iptables has run on this node, or the host's /run is not mounted here)", d.n.XtablesLock)
	}
	if err != nil {
		return nil, fmt.Errorf("reading locks on %s: %w", d.n.XtablesLock, err)
	}
	// The watcher starts at the first run that finds the lock file
	// (lazily: a policy without this detector, or a node without legacy
	// iptables, never runs it) and measures every hold from then on.
	watch := d.n.XtablesLockWatch
	watchErr := ""
	if watch != nil {
		if err := watch.Start(); err != nil {
			watchErr = err.Error()
			watch = nil
		}
	}
	now := d.n.Clock.Now()
	var out []finding.Finding
	repeated := ""
	if watch != nil {
		var f *finding.Finding
		f, repeated = d.repeated(ctx, watch, now)
		if f != nil {
			out = append(out, *f)
		}
	}
	if !l.Held {
		d.track(nil, now)
		d.set("xtables lock %s free%s", d.n.XtablesLock, repeated)
		return out, nil
	}
	var holds []lockwatch.Hold
	if watch != nil {
		holds = watch.Holds(now.Add(-d.p.MaxHold.Duration - d.p.RepeatWindow.Duration))
	}
	reused := dropReusedCallers(&l, holds)
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
	// The lock has been held at least as long as its oldest waiter has
	// waited: sound from one look.
	oldest := oldestWaiter(l.Waiters, holds, now)
	restoreWaits := false
	var waitingNames []string
	for _, w := range l.Waiters {
		wt := waitedFor(w, holds, now)
		if isRestore(w) && wt.d >= d.p.MaxRestoreWait.Duration {
			restoreWaits = true
		}
		if len(waitingNames) < 5 {
			waitingNames = append(waitingNames, fmt.Sprintf("%s (pid %d, %s%s)", w.Name(), w.Pid, wt.d.Round(time.Second), wt.how()))
		}
	}
	if len(l.Waiters) > len(waitingNames) {
		waitingNames = append(waitingNames, fmt.Sprintf("and %d more", len(l.Waiters)-len(waitingNames)))
	}
	lockHeld := oldest.d
	held := make([]time.Duration, len(keys))
	measured := "watched"
	if watch == nil {
		measured = "seen holding at every cycle"
	}
	for i, k := range keys {
		switch {
		case watch == nil:
			held[i] = now.Sub(since[k])
		case k != unknownHolder:
			held[i] = heldSince(l.Holders[i], holds, now)
			if held[i] == 0 || len(holds) > 0 && !holds[len(holds)-1].Exact {
				measured = "watched since first seen holding"
			}
		case len(holds) > 0 && holds[len(holds)-1].End.IsZero():
			held[i] = holds[len(holds)-1].Duration(now)
		}
		lockHeld = max(lockHeld, held[i])
	}
	d.set("xtables lock %s held ≥ %s, %d waiting (max hold %s, max %d waiting, restores may wait %s)%s", d.n.XtablesLock,
		lockHeld.Round(time.Second), len(l.Waiters), d.p.MaxHold.Duration, d.p.MaxWaiters, d.p.MaxRestoreWait.Duration, repeated)

	reported := func(i int) bool {
		k, hold := keys[i], held[i]
		// A restore holding the lock (watched) as long as kube-proxy's
		// restores would wait for it is reported like a waiting one.
		restoreHolds := k != unknownHolder && isRestore(l.Holders[i]) && hold >= d.p.MaxRestoreWait.Duration
		return hold >= d.p.MaxHold.Duration || tooMany || restoreWaits || restoreHolds
	}
	// The holders to report: were they at work (CPU time) over the window?
	var toJudge []procs.Process
	for i, k := range keys {
		if k != unknownHolder && reported(i) {
			toJudge = append(toJudge, l.Holders[i])
		}
	}
	judged, err := d.watch.judge(ctx, d.n, toJudge)
	if err != nil {
		return nil, err
	}
	progressOf := map[procs.Ref]progress{}
	for _, pr := range judged {
		progressOf[pr.cur.Ref()] = pr
	}
	pods := procident.PodsOf(d.n.Pods, now)
	for i, k := range keys {
		hold := held[i]
		if !reported(i) {
			continue
		}
		why := fmt.Sprintf("for ≥ %s (%s; max %s); held ≥ %s", hold.Round(time.Second), measured, d.p.MaxHold.Duration, lockHeld.Round(time.Second))
		if oldest.p != nil {
			why += fmt.Sprintf(" (its oldest waiter %s pid %d has waited %s%s)", oldest.p.Name(), oldest.p.Pid, oldest.d.Round(time.Second), oldest.how())
		}
		why += fmt.Sprintf("; %d waiting (max %d)", len(l.Waiters), d.p.MaxWaiters)
		if len(waitingNames) > 0 {
			why += ": " + strings.Join(waitingNames, ", ")
		}
		ev := map[string]any{
			"xtablesLock":             d.n.XtablesLock,
			"lockDev":                 l.Dev,
			"lockPIDs":                l.LockPIDs,
			procs.EvidenceHoldSeconds: durSeconds(hold),
			"holdMeasured":            measured,
			"lockHeldAtLeastSeconds":  durSeconds(lockHeld),
			"holders":                 holders,
			"waiters":                 waiters,
			"waiterCount":             len(l.Waiters),
		}
		if watch == nil {
			ev["holdTrackedSince"] = since[k].UTC().Format(time.RFC3339)
			if watchErr != "" {
				ev["lockWatchError"] = watchErr
			}
		}
		var msg string
		sev := finding.Critical
		sub := finding.Subject{AgeSeconds: durSeconds(hold)}
		if k == unknownHolder {
			msg = fmt.Sprintf("xtables lock %s held by a process not visible here (/proc/locks pid %v) %s", d.n.XtablesLock, l.LockPIDs, why)
			if len(reused) > 0 {
				ev["lockPIDsReused"] = reused
				msg += fmt.Sprintf("; /proc/locks pid %v now names a process created after the hold began (the caller exited, a child holds its descriptor): not the holder", reused)
			}
		} else {
			h := l.Holders[i]
			for kk, v := range processEvidence(h, now) {
				ev[kk] = v
			}
			name := h.Name()
			if isRestore(h) {
				name += fmt.Sprintf(" running %s", h.Age(now).Round(time.Second))
			}
			msg = fmt.Sprintf("xtables lock %s held by %s (pid %d) %s", d.n.XtablesLock, name, h.Pid, why)
			ev["holdsXtablesLock"] = true
			ev["holdersFrom"] = l.HoldersFrom
			sub.Process = &finding.Process{HoldsXtablesLock: true, HoldMeasured: true, HoldSeconds: durSeconds(hold)}
			pr, ok := progressOf[h.Ref()]
			switch {
			case !ok:
				// Gone since the lock was read: the next cycle sees.
				continue
			case pr.advancing():
				sub.Process.MakingProgress = true
				pr.evidence(ev, nil)
				msg += fmt.Sprintf("; the holder is at work, making progress (%s): not a target", pr)
				sev = finding.Warning
			default:
				pr.evidence(ev, sub.Process)
				msg += fmt.Sprintf("; the holder makes no progress (%s)", pr)
			}
			if notTarget := outOfReach(h, procs.NetfilterPrograms, d.n, pods, ev); notTarget != "" {
				sev = finding.Info
				msg += "; this holder is not a target: " + notTarget
			}
		}
		out = append(out, finding.Finding{
			Detector: "XtablesLockContention",
			Target:   k,
			Severity: sev,
			Message:  msg,
			Evidence: ev,
			Subject:  sub,
		})
	}
	return out, nil
}

// dropReusedCallers removes from l's holders found from /proc/locks'
// callers (HoldersFromProcLocks: no fd access) those created after the
// watched hold began: the caller exited (a child holds the inherited
// descriptor) and its PID now names another process. It returns their
// PIDs. Only an exactly watched hold going on now has a start to judge by.
func dropReusedCallers(l *procs.FileLocks, holds []lockwatch.Hold) []int32 {
	if l.HoldersFrom != procs.HoldersFromProcLocks || len(holds) == 0 {
		return nil
	}
	cur := holds[len(holds)-1]
	if !cur.End.IsZero() || !cur.Exact || cur.Start.IsZero() {
		return nil
	}
	// Create times count in 10 ms ticks.
	latest := cur.Start.Add(20 * time.Millisecond).UnixMilli()
	var reused []int32
	kept := make([]procs.Process, 0, len(l.Holders))
	for _, h := range l.Holders {
		if h.CreateTimeMs > latest {
			reused = append(reused, h.Pid)
			continue
		}
		kept = append(kept, h)
	}
	l.Holders = kept
	return reused
}

// isRestore reports whether p is an iptables restore (argv[0]).
func isRestore(p procs.Process) bool { return slices.Contains(procs.RestoreNames, p.Name()) }

// wait is how long a waiter has waited, at least, and how that is known.
type wait struct {
	p *procs.Process
	d time.Duration
	// fromAge: not seen by the watcher; the process's age (an iptables
	// command waits for the lock from its start).
	fromAge bool
}

func (w wait) how() string {
	if w.fromAge {
		return " since it started"
	}
	return ""
}

// waitedFor is how long p has waited, at least: since the watcher saw it
// begin to wait (across consecutive holds); else the longer of how long
// the watcher has seen it waiting and, for an iptables program (which
// takes the lock first thing), its age.
func waitedFor(p procs.Process, holds []lockwatch.Hold, now time.Time) wait {
	var first time.Time
	seenStart := false
	for _, h := range holds {
		for _, w := range h.Waiters {
			if w.Pid == p.Pid && w.CreateTimeMs == p.CreateTimeMs && (first.IsZero() || w.Since.Before(first)) {
				first, seenStart = w.Since, w.SeenStart
			}
		}
	}
	if !first.IsZero() && seenStart {
		return wait{p: &p, d: now.Sub(first)}
	}
	wt := wait{p: &p}
	if !first.IsZero() {
		wt.d = now.Sub(first)
	}
	if n := p.Name(); strings.HasPrefix(n, "iptables") || strings.HasPrefix(n, "ip6tables") {
		if a := p.Age(now); a > wt.d {
			wt.d, wt.fromAge = a, true
		}
	}
	return wt
}

func oldestWaiter(ws []procs.Process, holds []lockwatch.Hold, now time.Time) wait {
	var best wait
	for _, w := range ws {
		if wt := waitedFor(w, holds, now); best.p == nil || wt.d > best.d {
			best = wt
		}
	}
	return best
}

// heldSince is how long the watcher has seen p hold the lock without a
// break (0 when it has not seen it hold).
func heldSince(p procs.Process, holds []lockwatch.Hold, now time.Time) time.Duration {
	if len(holds) == 0 {
		return 0
	}
	cur := holds[len(holds)-1]
	if !cur.End.IsZero() {
		return 0
	}
	for _, h := range cur.Holders {
		if h.Pid == p.Pid && h.CreateTimeMs == p.CreateTimeMs {
			return cur.Duration(now)
		}
	}
	// Without fd access (no CAP_SYS_PTRACE) the watcher names no holder:
	// /proc/locks' caller, created before the hold began, is the one.
	if len(cur.Holders) == 0 && slices.Contains(cur.LockPIDs, p.Pid) && p.CreateTimeMs <= cur.Start.Add(20*time.Millisecond).UnixMilli() {
		return cur.Duration(now)
	}
	return 0
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
