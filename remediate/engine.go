package remediate

import (
	"context"
	"errors"
	"fmt"
	"runtime/debug"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"
	"k8s.io/utils/clock"

	"github.com/remediate-dev/remediate/detect"
	"github.com/remediate-dev/remediate/internal/finding"
	"github.com/remediate-dev/remediate/internal/node"
	"github.com/remediate-dev/remediate/policy"
	"github.com/remediate-dev/remediate/remediate/action"
	"github.com/remediate-dev/remediate/remediate/guardrails"
	"github.com/remediate-dev/remediate/remediate/journal"
)

// SelfDetector is the Detector name of findings about the daemon itself (a
// detector or action that failed, hung or panicked).
const SelfDetector = "remediate"

// historyKeep bounds how long action history is kept in the state file.
const historyKeep = 7 * 24 * time.Hour

// Options configure an Engine.
type Options struct {
	// Node carries the adapters detectors and actions use.
	Node *node.Node
	// StateDir holds state.json, state.lock and the journal.
	StateDir string
	// ForceDryRun makes every action a dry run (--dry-run).
	ForceDryRun bool
	// Once makes every rule's `for` count as met (remediate --once).
	Once bool
	// Cluster holds the cluster guardrails (opt-out, API freshness, storm
	// guard, fleet pause, kube-proxy rollout, budget), one named field
	// each; guardrails.Chain puts them in order. It is the one way a
	// guardrail is added.
	Cluster guardrails.Cluster
	// Journal receives intent and outcome records; required.
	Journal *journal.Journal
	// Exporters receive every policy put in force and every cycle's
	// report (exporter.go): /metrics is one.
	Exporters []Exporter
	// Clock defaults to the real clock.
	Clock clock.Clock
	// Log defaults to a no-op logger.
	Log *zap.Logger
	// LockTimeout bounds the wait for the state dir lock (default 30s).
	LockTimeout time.Duration
	// NodeFor, if set, rebuilds the node's adapters for a policy (the
	// kube-proxy endpoints come from the policy); it is called on New and
	// on every reload, and Node is replaced by its result.
	NodeFor func(*policy.Policy) (*node.Node, error)
}

// Engine runs cycles of detect → decide → act for a policy.
type Engine struct {
	opts  Options
	store *Store

	mu    sync.Mutex // guards pol and rules; one cycle at a time
	pol   *policy.Policy
	rules []*ruleRuntime
	// cur is pol for readers outside the cycle (/healthz): they must not
	// wait for a cycle, which may take minutes.
	cur atomic.Pointer[policy.Policy]
	// held maps Request.Key() to holders to release when the attempt ends.
	held map[string][]heldGuard
}

type heldGuard struct {
	h   guardrails.Holder
	req guardrails.Request
}

type ruleRuntime struct {
	rule     *policy.Rule
	det      detect.Detector
	kinds    []finding.Kind // the detector type's declared target kinds
	act      action.Action  // nil for report-only rules
	actType  action.Type
	running  atomic.Bool // the detector is still running (possibly hung)
	runSince atomic.Int64
	// actBusy: the action's Plan or Execute is still running (possibly
	// abandoned after its deadline); it is not started again meanwhile.
	actBusy  atomic.Bool
	actSince atomic.Int64
	// warm is set after the detector instance's first successful run.
	// Detectors that judge across cycles (rates, hold times) report
	// nothing on their first run, so absence then is not evidence.
	warm bool
}

// New builds an engine for p. Every rule's detector and action are
// constructed now, so a policy that cannot be instantiated fails here.
func New(p *policy.Policy, o Options) (*Engine, error) {
	if o.Clock == nil {
		o.Clock = clock.RealClock{}
	}
	if o.Log == nil {
		o.Log = zap.NewNop()
	}
	if o.LockTimeout <= 0 {
		o.LockTimeout = 30 * time.Second
	}
	if o.Journal == nil {
		return nil, errors.New("engine: a journal is required")
	}
	if o.Node == nil && o.NodeFor == nil {
		return nil, errors.New("engine: node is required")
	}
	e := &Engine{opts: o, store: &Store{Dir: o.StateDir}, held: map[string][]heldGuard{}}
	if err := e.SetPolicy(p); err != nil {
		return nil, err
	}
	return e, nil
}

// Policy returns the policy in force. It does not wait for a running
// cycle.
func (e *Engine) Policy() *policy.Policy {
	return e.cur.Load()
}

// SetPolicy swaps in a new policy (a reload). Detectors and actions are
// rebuilt; per-target state and history are kept (they live in the state
// dir). On error the old policy stays in force.
func (e *Engine) SetPolicy(p *policy.Policy) error {
	n := e.opts.Node
	if e.opts.NodeFor != nil {
		var err error
		if n, err = e.opts.NodeFor(p); err != nil {
			return fmt.Errorf("building node adapters: %w", err)
		}
	}
	rules, err := build(p, n)
	if err != nil {
		return err
	}
	for _, rr := range rules {
		if rr.actType.ReplacedBy != "" {
			e.opts.Log.Warn("rule uses a deprecated action type: it runs as "+rr.actType.ReplacedBy,
				zap.String("rule", rr.rule.Name), zap.String("action", rr.actType.Name), zap.String("note", rr.actType.Deprecation))
		}
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	e.pol, e.rules, e.opts.Node = p, rules, n
	e.cur.Store(p)
	e.exportPolicy(p)
	// A rule that is gone never steps its targets again, so nothing else
	// would release what its attempts hold (a cluster budget slot).
	keep := map[string]bool{}
	for i := range p.Rules {
		keep[p.Rules[i].Name] = true
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for k := range e.held {
		if !keep[guardrails.RuleOfKey(k)] {
			e.releaseHeld(ctx, k)
		}
	}
	return nil
}

func build(p *policy.Policy, n *node.Node) ([]*ruleRuntime, error) {
	var errs []string
	var out []*ruleRuntime
	for i := range p.Rules {
		r := &p.Rules[i]
		rr := &ruleRuntime{rule: r}
		dt, ok := detect.Lookup(r.Detector.Type)
		if !ok {
			errs = append(errs, fmt.Sprintf("rule %s: unknown detector type %q", r.Name, r.Detector.Type))
			continue
		}
		det, err := dt.New(r.Detector.Params, n)
		if err != nil {
			errs = append(errs, fmt.Sprintf("rule %s: detector %s: %v", r.Name, r.Detector.Type, err))
			continue
		}
		rr.det, rr.kinds = det, dt.Targets
		if r.Action != nil {
			at, ok := action.Lookup(r.Action.Type)
			if !ok {
				errs = append(errs, fmt.Sprintf("rule %s: unknown action type %q", r.Name, r.Action.Type))
				continue
			}
			act, err := at.New(r.Action.Params, n)
			if err != nil {
				errs = append(errs, fmt.Sprintf("rule %s: action %s: %v", r.Name, r.Action.Type, err))
				continue
			}
			rr.act, rr.actType = act, at
		}
		out = append(out, rr)
	}
	if len(errs) > 0 {
		return nil, fmt.Errorf("building rules: %s", strings.Join(errs, "; "))
	}
	return out, nil
}

// detResult is one detector's outcome in a cycle.
type detResult struct {
	findings []finding.Finding
	err      error
	skip     string
	judged   string // what a clean run judged (detect.Judged)
}

// Cycle runs one detection pass, decides and acts. It holds the state dir
// lock for its duration. The returned report is complete even when some
// detectors or actions failed; an error means the cycle could not run or
// could not persist its state.
func (e *Engine) Cycle(ctx context.Context) (*Report, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	start := e.opts.Clock.Now()
	pol := e.pol

	lockCtx, cancel := context.WithTimeout(ctx, e.opts.LockTimeout)
	unlock, err := e.store.Lock(lockCtx)
	cancel()
	if err != nil {
		return nil, err
	}
	defer unlock()

	rep := &Report{Node: e.opts.Node.Name, Mode: string(pol.Mode), Time: start,
		Findings: []ReportFinding{}, Decisions: []Decision{}, Skipped: []SkippedCheck{}}
	if e.opts.ForceDryRun {
		rep.Mode, rep.ForcedDryRun = string(policy.Audit), true
	}
	st, warn := e.store.Load(start)
	if warn != nil {
		e.opts.Log.Error("state file unreadable; quarantined", zap.Error(warn))
		rep.Warnings = append(rep.Warnings, warn.Error())
		e.journal(journal.Record{Kind: journal.KindNote, Summary: warn.Error()}, rep)
	}
	// What a previous life left unsettled, before anything is decided.
	x := &CycleExport{Report: rep, Policy: pol}
	e.settleUnfinished(st, rep, start, x)
	e.clampClock(st, rep, start, x)

	results := e.detectAll(ctx, pol)

	acted := 0
	c := &cycle{e: e, pol: pol, st: st, rep: rep, x: x, acted: &acted}
	for i, rr := range e.rules {
		c.rule(ctx, rr, results[i])
	}
	rep.OK = okChecks(e.rules, results)
	// What is held is held for a Verifying target. Another process sharing
	// the state dir (remediate --once) may have judged the verification.
	for k := range e.held {
		if st.Targets[k].Phase != PhaseVerifying {
			e.releaseHeld(ctx, k)
		}
	}

	st.Prune(e.opts.Clock.Now(), max(historyKeep, maxWindow(pol)))
	sortReport(rep)
	saveErr := e.store.Save(st)
	e.exportCycle(x, results, st)
	if saveErr != nil {
		return rep, fmt.Errorf("persisting guardrail state: %w", saveErr)
	}
	return rep, nil
}

func maxWindow(p *policy.Policy) time.Duration {
	w := guardrails.NodeRateWindow
	for _, r := range p.Rules {
		w = max(w, r.RateLimit.Per.Duration, r.Cooldown.Duration)
	}
	return w
}

// detectAll runs every rule's detector concurrently, each with its own
// deadline and panic recovery. A detector still running from an earlier
// cycle (hung) is not started again.
func (e *Engine) detectAll(ctx context.Context, pol *policy.Policy) []detResult {
	out := make([]detResult, len(e.rules))
	var wg sync.WaitGroup
	for i, rr := range e.rules {
		wg.Add(1)
		go func() {
			defer wg.Done()
			out[i] = e.detectOne(ctx, rr, pol.DetectorTimeout.Duration)
		}()
	}
	wg.Wait()
	return out
}

func (e *Engine) detectOne(ctx context.Context, rr *ruleRuntime, timeout time.Duration) detResult {
	if !rr.running.CompareAndSwap(false, true) {
		since := time.Unix(0, rr.runSince.Load())
		return detResult{err: fmt.Errorf("detector still running since %s (hung?); not started again", since.UTC().Format(time.RFC3339))}
	}
	rr.runSince.Store(e.opts.Clock.Now().UnixNano())
	dctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	ch := make(chan detResult, 1)
	go func() {
		defer rr.running.Store(false)
		defer func() {
			if p := recover(); p != nil {
				e.opts.Log.Error("detector panicked", zap.String("rule", rr.rule.Name), zap.Any("panic", p), zap.ByteString("stack", debug.Stack()))
				ch <- detResult{err: fmt.Errorf("detector panicked: %v", p)}
			}
		}()
		fs, err := rr.det.Detect(dctx)
		ch <- detResult{findings: fs, err: err, judged: judgedFigure(rr.det, fs, err)}
	}()
	select {
	case r := <-ch:
		if reason, ok := finding.IsSkip(r.err); ok {
			return detResult{skip: reason}
		}
		return r
	case <-dctx.Done():
		return detResult{err: fmt.Errorf("detector did not finish within %s: %w", timeout, dctx.Err())}
	}
}

// Sample runs once the detectors of the rules whose detector type judges
// across samples (detect.Type.Windowed: rates, histogram deltas, growth,
// hold times) and discards what they report. It gives them their first
// sample, so that a Cycle some time later judges rates and windows in a
// single one-shot run (remediate --once --sample). It decides nothing,
// takes no lock, touches no state and does not make a rule warm: the next
// Cycle still clears no target state, because absence over a short sample
// is not the daemon's evidence that a target has cleared. It returns the
// names of the rules it sampled (none: nothing to wait for).
func (e *Engine) Sample(ctx context.Context) []string {
	e.mu.Lock()
	defer e.mu.Unlock()
	var sampled []*ruleRuntime
	var names []string
	for _, rr := range e.rules {
		if t, ok := detect.Lookup(rr.rule.Detector.Type); ok && t.Windowed {
			sampled = append(sampled, rr)
			names = append(names, rr.rule.Name)
		}
	}
	var wg sync.WaitGroup
	for _, rr := range sampled {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if r := e.detectOne(ctx, rr, e.pol.DetectorTimeout.Duration); r.err != nil {
				e.opts.Log.Debug("first sample failed", zap.String("rule", rr.rule.Name), zap.Error(r.err))
			}
		}()
	}
	wg.Wait()
	return names
}

// cycle is the decision state of one Cycle.
type cycle struct {
	e     *Engine
	pol   *policy.Policy
	st    *State
	rep   *Report
	x     *CycleExport // what the exporters get besides the report
	acted *int
}

func (c *cycle) rule(ctx context.Context, rr *ruleRuntime, res detResult) {
	r := rr.rule
	log := c.e.opts.Log.With(zap.String("rule", r.Name))
	switch {
	case res.skip != "":
		c.rep.Skipped = append(c.rep.Skipped, SkippedCheck{Rule: r.Name, Detector: r.Detector.Type, Reason: res.skip})
		return // unknown is not absent: states stay as they are
	case res.err != nil:
		log.Warn("detector failed", zap.Error(res.err))
		c.x.DetectorErrors = append(c.x.DetectorErrors, RuleDetector{r.Name, r.Detector.Type})
		c.rep.Findings = append(c.rep.Findings, ReportFinding{Rule: r.Name, Finding: finding.Finding{
			Detector: SelfDetector, Target: "detector/" + r.Name, Severity: finding.Warning,
			Message:  fmt.Sprintf("detector %s failed: %v", r.Detector.Type, res.err),
			Evidence: map[string]any{"detectorType": r.Detector.Type, "error": res.err.Error()},
		}})
		return
	}

	present := map[string]finding.Finding{}
	var order []string
	for _, f := range capTargets(r.Detector.Type, orderTargets(res.findings)) {
		f = withKind(boundFinding(f), rr.kinds)
		if f.Detector == "" {
			f.Detector = r.Detector.Type
		}
		if f.Target == "" {
			f.Target = "unnamed"
		}
		if _, dup := present[f.Target]; dup {
			continue
		}
		present[f.Target] = f
		order = append(order, f.Target)
		c.rep.Findings = append(c.rep.Findings, ReportFinding{Rule: r.Name, Finding: f})
	}
	// Targets with state but no finding this cycle (vanished or cleared).
	// Not on a new detector instance's first run (daemon start, policy
	// reload): a rate or hold-time detector has no baseline yet, and an
	// escalated or verifying target must not be cleared by that.
	prefix := guardrails.TargetKey(r.Name, "")
	warm := rr.warm
	rr.warm = true
	for k := range c.st.Targets {
		if !warm {
			break
		}
		if t, ok := strings.CutPrefix(k, prefix); ok {
			if _, seen := present[t]; !seen {
				order = append(order, t)
			}
		}
	}
	timing := Timing{For: r.For.Duration, VerifyAfter: r.VerifyAfter.Duration, MaxAttempts: r.MaxAttempts, Once: c.e.opts.Once}
	for _, target := range order {
		f, isPresent := present[target]
		if !isPresent {
			f = finding.Finding{Detector: r.Detector.Type, Target: target}
		}
		c.target(ctx, rr, f, isPresent, timing, log)
	}
}

func (c *cycle) target(ctx context.Context, rr *ruleRuntime, f finding.Finding, present bool, tm Timing, log *zap.Logger) {
	r := rr.rule
	key := guardrails.TargetKey(r.Name, f.Target)
	prev := c.st.Targets[key]
	now := c.e.opts.Clock.Now()
	// With Once, Step makes the action due but keeps the target Pending,
	// so a one-shot run never shortens the daemon's `for`.
	next, act := Step(prev, present, now, tm)
	c.setState(key, next)
	actName := ""
	if rr.act != nil {
		actName = rr.actType.Name
	}
	dec := Decision{Rule: r.Name, Action: actName, Target: f.Target, Phase: next.Phase}

	// Transitions worth an audit line.
	if prev.Phase == PhaseVerifying && next.Phase != PhaseVerifying {
		c.e.releaseHeld(ctx, key)
		switch next.Phase {
		case PhaseResolved:
			log.Info("action verified: finding cleared", zap.String("target", f.Target))
			c.e.journal(journal.Record{Kind: journal.KindVerified, Rule: r.Name, Target: f.Target, Action: actName,
				Summary: "finding cleared after action"}, c.rep)
		case PhaseFailed, PhaseEscalated:
			c.rep.Decisions = append(c.rep.Decisions, Decision{Rule: r.Name, Action: actName, Target: f.Target, Phase: next.Phase,
				Outcome: OutcomeFailed, Reason: fmt.Sprintf("verification failed: %s (attempt %d of %d)", next.LastError, next.Attempts, tm.MaxAttempts)})
		}
	}
	if next.Phase == PhaseEscalated && prev.Phase != PhaseEscalated {
		c.escalate(r, f, actName, next, log)
	}
	if !present && next.Phase != PhaseVerifying {
		return // cleared or vanished: nothing to decide
	}

	switch {
	case !act:
		dec.Outcome = OutcomeSkipped
		switch next.Phase {
		case PhasePending:
			dec.Reason = fmt.Sprintf("pending: present for %s, fires after %s", now.Sub(next.Since).Round(time.Second), tm.For)
		case PhaseVerifying:
			dec.Reason = fmt.Sprintf("verifying: re-check at %s", next.VerifyAt.UTC().Format(time.RFC3339))
		case PhaseEscalated:
			dec.Outcome = OutcomeBlocked
			dec.Guardrail = guardrails.GuardEscalation
			dec.Reason = fmt.Sprintf("escalated after %d failed attempts (last: %s); acting again only after the finding clears", next.Attempts, next.LastError)
		default:
			dec.Reason = "no action due in phase " + string(next.Phase)
		}
	case rr.act == nil:
		dec.Outcome = OutcomeSkipped
		dec.Reason = "report-only rule (no action)"
	default:
		c.decideAndAct(ctx, rr, f, key, tm, &dec, log)
	}
	c.rep.Decisions = append(c.rep.Decisions, dec)
}

func (c *cycle) setState(key string, ts TargetState) {
	if ts.Phase == PhaseOK {
		delete(c.st.Targets, key)
		return
	}
	c.st.Targets[key] = ts
}

func (c *cycle) escalate(r *policy.Rule, f finding.Finding, actName string, ts TargetState, log *zap.Logger) {
	log.Error("target escalated: attempts exhausted, no more actions until the finding clears",
		zap.String("target", f.Target), zap.Int("attempts", ts.Attempts), zap.String("lastError", ts.LastError))
	c.e.journal(journal.Record{Kind: journal.KindEscalated, Rule: r.Name, Target: f.Target, Action: actName,
		Summary: fmt.Sprintf("escalated after %d failed attempts", ts.Attempts), Error: ts.LastError}, c.rep)
}

// journal appends a record, stamping time and node; a failure becomes a
// report warning (the action itself was already guarded by the intent
// write).
func (e *Engine) journal(r journal.Record, rep *Report) {
	if r.Time.IsZero() {
		r.Time = e.opts.Clock.Now()
	}
	if r.Node == "" {
		r.Node = e.opts.Node.Name
	}
	if err := e.opts.Journal.Append(r); err != nil {
		e.opts.Log.Error("journal write failed", zap.Error(err))
		rep.Warnings = append(rep.Warnings, "journal write failed: "+err.Error())
	}
}

func (e *Engine) releaseHeld(ctx context.Context, key string) {
	releaseAll(ctx, e.held[key])
	delete(e.held, key)
}

// releaseAll releases held resources. It does not use ctx's cancellation:
// a slot not released because the daemon is stopping (the action was just
// cancelled) would block every node's disruptive actions until its TTL.
func releaseAll(ctx context.Context, held []heldGuard) {
	if len(held) == 0 {
		return
	}
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	for _, hg := range held {
		hg.h.Release(rctx, &hg.req)
	}
}

// Close releases every resource still held by guardrails (budget slots).
func (e *Engine) Close(ctx context.Context) {
	e.mu.Lock()
	defer e.mu.Unlock()
	for k := range e.held {
		e.releaseHeld(ctx, k)
	}
}

func shortHash(s string) string {
	var h uint32 = 2166136261
	for i := 0; i < len(s); i++ {
		h ^= uint32(s[i])
		h *= 16777619
	}
	return fmt.Sprintf("%08x", h)
}
