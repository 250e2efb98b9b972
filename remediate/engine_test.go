package remediate

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	clocktesting "k8s.io/utils/clock/testing"

	"github.com/remediate-dev/remediate/detect"
	"github.com/remediate-dev/remediate/internal/finding"
	"github.com/remediate-dev/remediate/internal/node"
	"github.com/remediate-dev/remediate/policy"
	"github.com/remediate-dev/remediate/remediate/action"
	"github.com/remediate-dev/remediate/remediate/guardrails"
	"github.com/remediate-dev/remediate/remediate/journal"
)

// world is the fake node the test detectors observe and test actions change.
type world struct {
	mu       sync.Mutex
	present  map[string][]string // key -> targets present
	fail     map[string]error    // key -> detector error
	panicky  map[string]bool
	hang     map[string]chan struct{}
	executed []string
	actErr   map[string]error
	actPanic map[string]bool
	actHang  map[string]bool
	actBlock map[string]chan struct{}    // Execute waits for it, ignoring ctx
	actHook  map[string]func()           // called as Execute begins
	starts   int                         // Execute calls begun
	fixes    map[string]bool             // executing the action removes the target
	severity map[string]finding.Severity // target -> severity (default critical)
}

var w = &world{}

func resetWorld() {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.present, w.fail, w.panicky = map[string][]string{}, map[string]error{}, map[string]bool{}
	w.hang, w.executed, w.actErr = map[string]chan struct{}{}, nil, map[string]error{}
	w.actPanic, w.actHang, w.fixes = map[string]bool{}, map[string]bool{}, map[string]bool{}
	w.actBlock, w.starts, w.actHook = map[string]chan struct{}{}, 0, map[string]func(){}
	w.severity = map[string]finding.Severity{}
}

type fakeParams struct {
	Key string `yaml:"key"`
}

type fakeDetector struct{ key string }

func (d fakeDetector) Detect(ctx context.Context) ([]finding.Finding, error) {
	w.mu.Lock()
	hang, fail, pan := w.hang[d.key], w.fail[d.key], w.panicky[d.key]
	targets := append([]string(nil), w.present[d.key]...)
	sev := map[string]finding.Severity{}
	for k, v := range w.severity {
		sev[k] = v
	}
	w.mu.Unlock()
	if pan {
		panic("detector bug")
	}
	if hang != nil {
		<-hang // ignores ctx on purpose
	}
	if fail != nil {
		return nil, fail
	}
	var out []finding.Finding
	for _, t := range targets {
		s := finding.Critical
		if v, ok := sev[t]; ok {
			s = v
		}
		out = append(out, finding.Finding{Target: t, Severity: s, Message: "bad " + t, Evidence: map[string]any{"k": d.key}})
	}
	return out, nil
}

type fakeAction struct{ key string }

func (a fakeAction) Plan(_ context.Context, f finding.Finding) (action.Plan, error) {
	return action.Plan{Summary: "fix " + f.Target}, nil
}

func (a fakeAction) Execute(ctx context.Context, f finding.Finding) (action.Result, error) {
	w.mu.Lock()
	w.starts++
	pan, hang, err, fixes, block, hook := w.actPanic[a.key], w.actHang[a.key], w.actErr[a.key], w.fixes[a.key], w.actBlock[a.key], w.actHook[a.key]
	w.mu.Unlock()
	if hook != nil {
		hook()
	}
	if pan {
		panic("action bug")
	}
	if hang {
		select {} // never returns, ignores ctx
	}
	if block != nil {
		<-block // ignores ctx on purpose
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	w.executed = append(w.executed, a.key+":"+f.Target)
	if err != nil {
		return action.Result{}, err
	}
	if fixes {
		var keep []string
		for _, t := range w.present[a.key] {
			if t != f.Target {
				keep = append(keep, t)
			}
		}
		w.present[a.key] = keep
	}
	return action.Result{Summary: "fixed " + f.Target, Details: map[string]any{"previous": 1}}, nil
}

func init() {
	detect.Define("Fake", "test", func(p *fakeParams, _ *node.Node) (detect.Detector, error) { return fakeDetector{p.Key}, nil })
	action.Define("FakeFix", "test",
		func(p *fakeParams, _ *node.Node) (action.Action, error) { return fakeAction{p.Key}, nil }, action.ActsOnAnyFinding())
	action.Define("FakeDisruptive", "test",
		func(p *fakeParams, _ *node.Node) (action.Action, error) { return fakeAction{p.Key}, nil }, action.ActsOnAnyFinding(), action.Disruptive())
	action.Define("FakeNeedsAPI", "test",
		func(p *fakeParams, _ *node.Node) (action.Action, error) { return fakeAction{p.Key}, nil }, action.ActsOnAnyFinding(), action.NeedsAPI())
}

func executed() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return append([]string(nil), w.executed...)
}

func setPresent(key string, targets ...string) {
	w.mu.Lock()
	w.present[key] = targets
	w.mu.Unlock()
}

func mustPolicy(t *testing.T, src string) *policy.Policy {
	t.Helper()
	p, err := policy.Parse("test.yaml", []byte("apiVersion: remediate.dev/v1alpha1\nkind: RemediationPolicy\n"+src), Catalog{})
	if err != nil {
		t.Fatalf("policy: %v", err)
	}
	return p
}

type harness struct {
	t     *testing.T
	dir   string
	clock *clocktesting.FakeClock
	opts  Options
}

func newHarness(t *testing.T) *harness {
	resetWorld()
	dir := t.TempDir()
	j, err := journal.Open(dir, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	clk := clocktesting.NewFakeClock(t0)
	return &harness{t: t, dir: dir, clock: clk, opts: Options{
		Node: &node.Node{Name: "node1", Clock: clk}, StateDir: dir, Journal: j, Clock: clk, LockTimeout: time.Second,
		Exporters: []Exporter{&recorder{}},
	}}
}

func (h *harness) engine(p *policy.Policy) *Engine {
	h.t.Helper()
	e, err := New(p, h.opts)
	if err != nil {
		h.t.Fatal(err)
	}
	return e
}

func (h *harness) cycle(e *Engine) *Report {
	h.t.Helper()
	rep, err := e.Cycle(context.Background())
	if err != nil {
		h.t.Fatalf("cycle: %v", err)
	}
	return rep
}

func decisionFor(rep *Report, target string) Decision {
	for _, d := range rep.Decisions {
		if d.Target == target && d.Outcome != OutcomeFailed {
			return d
		}
	}
	for _, d := range rep.Decisions {
		if d.Target == target {
			return d
		}
	}
	return Decision{}
}

func journalKinds(t *testing.T, dir string) []string {
	recs, err := journal.ReadAll(dir)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, r := range recs {
		out = append(out, r.Kind)
	}
	return out
}

const enforceRule = `mode: enforce
rules:
- name: fix-it
  detector: {type: Fake, key: a}
  for: 0s
  action: {type: FakeFix, key: a}
  cooldown: 0s
  verifyAfter: 30s
  maxAttempts: 2
  rateLimit: {max: 10, per: 1h}
`

func TestEnforceActsVerifiesAndJournals(t *testing.T) {
	h := newHarness(t)
	e := h.engine(mustPolicy(t, enforceRule))
	w.fixes["a"] = true
	setPresent("a", "process/1")
	rep := h.cycle(e)
	d := decisionFor(rep, "process/1")
	if d.Outcome != OutcomeExecuted || d.Phase != PhaseVerifying || d.Action != "FakeFix" {
		t.Fatalf("decision = %+v", d)
	}
	if got := executed(); len(got) != 1 {
		t.Fatalf("executed = %v", got)
	}
	if rep.ExitCode() != 2 {
		t.Fatalf("exit code with findings = %d", rep.ExitCode())
	}
	// Before verifyAfter: waiting.
	h.clock.Step(10 * time.Second)
	rep = h.cycle(e)
	if d := decisionFor(rep, "process/1"); d.Outcome != OutcomeSkipped || !strings.Contains(d.Reason, "verifying") {
		t.Fatalf("during verify: %+v", d)
	}
	h.clock.Step(30 * time.Second)
	rep = h.cycle(e)
	if len(rep.Findings) != 0 || rep.ExitCode() != 0 {
		t.Fatalf("after fix: %+v", rep)
	}
	kinds := strings.Join(journalKinds(t, h.dir), ",")
	if kinds != "intent,outcome,verified" {
		t.Fatalf("journal kinds = %s", kinds)
	}
	recs, _ := journal.ReadAll(h.dir)
	if recs[0].ID == "" || recs[0].ID != recs[1].ID || recs[1].Outcome != "executed" || recs[1].Details["previous"] != float64(1) {
		t.Fatalf("intent/outcome records: %+v", recs[:2])
	}
}

func TestAuditModeNeverActs(t *testing.T) {
	h := newHarness(t)
	e := h.engine(mustPolicy(t, strings.Replace(enforceRule, "mode: enforce", "mode: audit", 1)))
	setPresent("a", "process/1")
	for i := 0; i < 3; i++ {
		rep := h.cycle(e)
		d := decisionFor(rep, "process/1")
		if d.Outcome != OutcomeDryRun || !strings.Contains(d.Reason, "mode audit: would fix process/1") {
			t.Fatalf("cycle %d: %+v", i, d)
		}
		h.clock.Step(time.Minute)
	}
	if got := executed(); len(got) != 0 {
		t.Fatalf("audit mode executed %v", got)
	}
	if kinds := strings.Join(journalKinds(t, h.dir), ","); kinds != "dry-run" {
		t.Fatalf("dry-run journaled %s, want once", kinds)
	}
}

func TestForceDryRunAndRuleDryRun(t *testing.T) {
	h := newHarness(t)
	h.opts.ForceDryRun = true
	e := h.engine(mustPolicy(t, enforceRule))
	setPresent("a", "process/1")
	if d := decisionFor(h.cycle(e), "process/1"); d.Outcome != OutcomeDryRun || !strings.Contains(d.Reason, "--dry-run") {
		t.Fatalf("--dry-run: %+v", d)
	}
	h2 := newHarness(t)
	e2 := h2.engine(mustPolicy(t, enforceRule+"  dryRun: true\n"))
	setPresent("a", "process/1")
	if d := decisionFor(h2.cycle(e2), "process/1"); d.Outcome != OutcomeDryRun || !strings.Contains(d.Reason, "rule dryRun") {
		t.Fatalf("rule dryRun: %+v", d)
	}
	if len(executed()) != 0 {
		t.Fatal("dry run executed")
	}
}

// TestRateLimitSurvivesRestarts restarts the engine before every cycle (a
// crash-looping daemon) and shows the rule's rate limit still holds.
func TestRateLimitSurvivesRestarts(t *testing.T) {
	h := newHarness(t)
	src := strings.Replace(enforceRule, "rateLimit: {max: 10, per: 1h}", "rateLimit: {max: 2, per: 1h}", 1)
	p := mustPolicy(t, src)
	blocked := 0
	for i := 0; i < 8; i++ {
		setPresent("a", "process/"+string(rune('a'+i))) // a new target each time: no cooldown involved
		e := h.engine(p)                                // fresh engine = restarted daemon
		rep := h.cycle(e)
		if d := rep.Decisions[0]; d.Outcome == OutcomeBlocked {
			if d.Guardrail != guardrails.GuardRuleRate {
				t.Fatalf("blocked by %s, want %s", d.Guardrail, guardrails.GuardRuleRate)
			}
			blocked++
		}
		h.clock.Step(time.Minute)
	}
	if n := len(executed()); n != 2 {
		t.Fatalf("executed %d actions across restarts, rate limit is 2/h", n)
	}
	if blocked != 6 {
		t.Fatalf("blocked %d, want 6", blocked)
	}
	// After the window passes, it may act again.
	h.clock.Step(time.Hour)
	setPresent("a", "process/z")
	if d := h.cycle(h.engine(p)).Decisions[0]; d.Outcome != OutcomeExecuted {
		t.Fatalf("after window: %+v", d)
	}
}

// TestCrashDuringActionStillCounts simulates a daemon killed while the
// action runs: the history record written before Execute must count.
func TestCrashDuringActionStillCounts(t *testing.T) {
	h := newHarness(t)
	p := mustPolicy(t, strings.Replace(enforceRule, "rateLimit: {max: 10, per: 1h}", "rateLimit: {max: 1, per: 1h}", 1))
	st := NewState()
	st.History = append(st.History, ActionRecord{Time: t0.Add(-time.Minute), Rule: "fix-it", Target: "process/x", Action: "FakeFix", Outcome: "pending"})
	if err := (&Store{Dir: h.dir}).Save(st); err != nil {
		t.Fatal(err)
	}
	setPresent("a", "process/y")
	if d := h.cycle(h.engine(p)).Decisions[0]; d.Outcome != OutcomeBlocked {
		t.Fatalf("a pending (crashed) attempt did not count: %+v", d)
	}
}

func TestCorruptStateQuarantinedAndTreatedAsRecent(t *testing.T) {
	h := newHarness(t)
	if err := os.WriteFile(filepath.Join(h.dir, "state.json"), []byte("{not json"), 0o600); err != nil {
		t.Fatal(err)
	}
	setPresent("a", "process/1")
	p := mustPolicy(t, enforceRule)
	rep := h.cycle(h.engine(p))
	if len(rep.Warnings) == 0 || !strings.Contains(rep.Warnings[0], "quarantined") {
		t.Fatalf("no warning: %+v", rep.Warnings)
	}
	if d := rep.Decisions[0]; d.Outcome != OutcomeBlocked {
		t.Fatalf("acted with unknown history: %+v", d)
	}
	matches, _ := filepath.Glob(filepath.Join(h.dir, "state.json.corrupt-*"))
	if len(matches) != 1 {
		t.Fatalf("corrupt file not quarantined: %v", matches)
	}
	// The marker persists across restarts until the windows pass.
	h.clock.Step(30 * time.Minute)
	if d := h.cycle(h.engine(p)).Decisions[0]; d.Outcome != OutcomeBlocked {
		t.Fatalf("restart forgot unknown history: %+v", d)
	}
	h.clock.Step(31 * time.Minute)
	if d := h.cycle(h.engine(p)).Decisions[0]; d.Outcome != OutcomeExecuted {
		t.Fatalf("after the windows: %+v", d)
	}
}

func TestFailuresEscalateAndClear(t *testing.T) {
	h := newHarness(t)
	e := h.engine(mustPolicy(t, enforceRule))
	w.actErr["a"] = errors.New("exit status 1: permission denied")
	setPresent("a", "process/1")
	d := decisionFor(h.cycle(e), "process/1")
	if d.Outcome != OutcomeFailed || !strings.Contains(d.Reason, "attempt 1 of 2") {
		t.Fatalf("first: %+v", d)
	}
	h.clock.Step(time.Minute)
	d = decisionFor(h.cycle(e), "process/1")
	if d.Outcome != OutcomeFailed || d.Phase != PhaseEscalated {
		t.Fatalf("second: %+v", d)
	}
	for i := 0; i < 3; i++ {
		h.clock.Step(time.Minute)
		d = decisionFor(h.cycle(e), "process/1")
		if d.Outcome != OutcomeBlocked || d.Guardrail != guardrails.GuardEscalation {
			t.Fatalf("escalated target acted on: %+v", d)
		}
	}
	if n := len(executed()); n != 2 {
		t.Fatalf("executed %d, want 2", n)
	}
	kinds := strings.Join(journalKinds(t, h.dir), ",")
	// intent,outcome for each of the two attempts, then the escalation.
	if kinds != "intent,outcome,intent,outcome,escalated" {
		t.Fatalf("journal kinds = %s", kinds)
	}
	// Clears only when the finding clears; then a new episode may act.
	setPresent("a")
	h.clock.Step(time.Minute)
	h.cycle(e)
	w.mu.Lock()
	w.actErr["a"] = nil
	w.mu.Unlock()
	setPresent("a", "process/1")
	if d := decisionFor(h.cycle(e), "process/1"); d.Outcome != OutcomeExecuted {
		t.Fatalf("after clearing: %+v", d)
	}
}

func TestVerificationFailureRetriesThenEscalates(t *testing.T) {
	h := newHarness(t)
	e := h.engine(mustPolicy(t, enforceRule)) // action "succeeds" but fixes nothing
	setPresent("a", "process/1")
	h.cycle(e)
	h.clock.Step(31 * time.Second)
	rep := h.cycle(e)
	var failed, executedNow bool
	for _, d := range rep.Decisions {
		failed = failed || (d.Outcome == OutcomeFailed && strings.Contains(d.Reason, "verification failed"))
		executedNow = executedNow || d.Outcome == OutcomeExecuted
	}
	if !failed || !executedNow {
		t.Fatalf("want verification failure and a retry: %+v", rep.Decisions)
	}
	h.clock.Step(31 * time.Second)
	rep = h.cycle(e)
	if d := decisionFor(rep, "process/1"); d.Phase != PhaseEscalated {
		t.Fatalf("want escalation after 2 failed verifications: %+v", rep.Decisions)
	}
}

func TestDetectorFailuresAreFindingsAndKeepState(t *testing.T) {
	h := newHarness(t)
	p := mustPolicy(t, strings.Replace(enforceRule, "for: 0s", "for: 1m", 1)+"detectorTimeout: 200ms\n")
	e := h.engine(p)
	setPresent("a", "process/1")
	if d := decisionFor(h.cycle(e), "process/1"); d.Phase != PhasePending {
		t.Fatalf("%+v", d)
	}
	// An erroring detector: a finding about the daemon; the pending state is kept (unknown is not absent).
	w.mu.Lock()
	w.fail["a"] = errors.New("read /proc: boom")
	w.mu.Unlock()
	h.clock.Step(30 * time.Second)
	rep := h.cycle(e)
	if len(rep.Findings) != 1 || rep.Findings[0].Detector != SelfDetector || !strings.Contains(rep.Findings[0].Message, "boom") {
		t.Fatalf("findings = %+v", rep.Findings)
	}
	w.mu.Lock()
	w.fail["a"] = nil
	w.panicky["a"] = true
	w.mu.Unlock()
	h.clock.Step(10 * time.Second)
	rep = h.cycle(e)
	if len(rep.Findings) != 1 || !strings.Contains(rep.Findings[0].Message, "panicked") {
		t.Fatalf("panic not reported: %+v", rep.Findings)
	}
	w.mu.Lock()
	w.panicky["a"] = false
	w.mu.Unlock()
	h.clock.Step(30 * time.Second) // 70s since first seen: for=1m met only if state was kept
	if d := decisionFor(h.cycle(e), "process/1"); d.Outcome != OutcomeExecuted {
		t.Fatalf("pending state lost across detector failure: %+v", d)
	}
}

func TestHungDetectorDoesNotStallLoop(t *testing.T) {
	h := newHarness(t)
	e := h.engine(mustPolicy(t, enforceRule+"- name: other\n  detector: {type: Fake, key: b}\ndetectorTimeout: 200ms\n"))
	release := make(chan struct{})
	w.mu.Lock()
	w.hang["a"] = release
	w.mu.Unlock()
	setPresent("b", "x")
	start := time.Now()
	rep := h.cycle(e)
	if time.Since(start) > 5*time.Second {
		t.Fatal("cycle stalled on a hung detector")
	}
	var sawTimeout, sawOther bool
	for _, f := range rep.Findings {
		sawTimeout = sawTimeout || (f.Detector == SelfDetector && strings.Contains(f.Message, "did not finish"))
		sawOther = sawOther || f.Target == "x"
	}
	if !sawTimeout || !sawOther {
		t.Fatalf("findings = %+v", rep.Findings)
	}
	rep = h.cycle(e)
	if !strings.Contains(rep.Findings[0].Message+rep.Findings[1].Message, "still running") {
		t.Fatalf("second cycle should not restart a hung detector: %+v", rep.Findings)
	}
	close(release)
}

func TestActionPanicAndHangAreContained(t *testing.T) {
	h := newHarness(t)
	p := mustPolicy(t, enforceRule+"actionTimeout: 200ms\n")
	e := h.engine(p)
	w.actPanic["a"] = true
	setPresent("a", "process/1")
	rep := h.cycle(e)
	if d := decisionFor(rep, "process/1"); d.Outcome != OutcomeFailed || !strings.Contains(d.Reason, "panicked") {
		t.Fatalf("panic: %+v", d)
	}
	w.mu.Lock()
	w.actPanic["a"] = false
	w.actHang["a"] = true
	w.mu.Unlock()
	h.clock.Step(time.Minute)
	start := time.Now()
	rep = h.cycle(e)
	if time.Since(start) > 5*time.Second {
		t.Fatal("hung action stalled the loop")
	}
	if d := decisionFor(rep, "process/1"); d.Outcome != OutcomeFailed || !strings.Contains(d.Reason, "did not finish") {
		t.Fatalf("hang: %+v", d)
	}
	self := false
	for _, f := range rep.Findings {
		self = self || f.Detector == SelfDetector
	}
	if !self {
		t.Fatal("hung action is not a finding about the daemon")
	}
}

func TestCooldownNodeLimitAndMaxTargets(t *testing.T) {
	h := newHarness(t)
	src := `mode: enforce
guardrails: {maxActionsPerHour: 3, maxTargetsPerCycle: 2}
rules:
- name: fix-it
  detector: {type: Fake, key: a}
  for: 0s
  action: {type: FakeFix, key: a}
  cooldown: 10m
  rateLimit: {max: 100, per: 1h}
  maxAttempts: 100
  verifyAfter: 0s
`
	e := h.engine(mustPolicy(t, src))
	setPresent("a", "t1", "t2", "t3")
	rep := h.cycle(e)
	count := map[Outcome]int{}
	for _, d := range rep.Decisions {
		count[d.Outcome]++
		if d.Outcome == OutcomeBlocked && d.Guardrail != guardrails.GuardMaxTargets {
			t.Fatalf("blocked by %s", d.Guardrail)
		}
	}
	if count[OutcomeExecuted] != 2 || count[OutcomeBlocked] != 1 {
		t.Fatalf("max targets per cycle: %v", count)
	}
	// Next cycle: t1,t2 re-verified as still present (verifyAfter 0 → failed) but in cooldown; t3 acts; node limit then full.
	h.clock.Step(time.Minute)
	rep = h.cycle(e)
	var guards []string
	for _, d := range rep.Decisions {
		if d.Outcome == OutcomeBlocked {
			guards = append(guards, d.Guardrail)
		}
	}
	if len(executed()) != 3 || strings.Count(strings.Join(guards, ","), guardrails.GuardCooldown) != 2 {
		t.Fatalf("executed=%v blocked by %v", executed(), guards)
	}
	setPresent("a", "t4")
	h.clock.Step(time.Minute)
	if d := decisionFor(h.cycle(e), "t4"); d.Guardrail != guardrails.GuardNodeRate {
		t.Fatalf("node limit: %+v", d)
	}
}

type failingGuard struct{}

func (failingGuard) Name() string { return "budget" }
func (failingGuard) Check(context.Context, *guardrails.Request) error {
	return errors.New("apiserver unreachable")
}

type countingHolder struct {
	checks, releases atomic.Int32
	sawDryRun        atomic.Bool
	cancelledRelease atomic.Bool // Release was given a done context
}

func (g *countingHolder) Name() string { return "slots" }
func (g *countingHolder) Check(_ context.Context, r *guardrails.Request) error {
	if r.DryRun {
		g.sawDryRun.Store(true)
		return nil
	}
	g.checks.Add(1)
	return nil
}
func (g *countingHolder) Release(ctx context.Context, _ *guardrails.Request) {
	if ctx.Err() != nil {
		g.cancelledRelease.Store(true)
	}
	g.releases.Add(1)
}

// TestNeedsAPIDeclarationReachesFreshness: the engine hands the action's
// own declaration (action.NeedsAPI) to the api-freshness guardrail, which
// blocks it without cluster access and lets a node-local action act.
func TestNeedsAPIDeclarationReachesFreshness(t *testing.T) {
	for _, c := range []struct {
		act     string
		outcome Outcome
	}{{"FakeNeedsAPI", OutcomeBlocked}, {"FakeFix", OutcomeExecuted}} {
		h := newHarness(t)
		h.opts.Cluster = guardrails.Cluster{Freshness: guardrails.NewFreshness(nil, "no cluster access: test")}
		setPresent("a", "p")
		d := decisionFor(h.cycle(h.engine(mustPolicy(t, strings.Replace(enforceRule, "type: FakeFix", "type: "+c.act, 1)))), "p")
		if d.Outcome != c.outcome || (c.outcome == OutcomeBlocked && d.Guardrail != guardrails.GuardFreshness) {
			t.Errorf("%s: %s %s %q, want %s", c.act, d.Outcome, d.Guardrail, d.Reason, c.outcome)
		}
	}
}

// TestClusterGuardrailsFailClosedAndRelease: a cluster guardrail that
// errs blocks; a holder (the budget) is held until verification and not
// taken by a dry run.
func TestClusterGuardrailsFailClosedAndRelease(t *testing.T) {
	h := newHarness(t)
	h.opts.Cluster = guardrails.Cluster{Budget: failingGuard{}}
	setPresent("a", "p")
	d := decisionFor(h.cycle(h.engine(mustPolicy(t, enforceRule))), "p")
	if d.Outcome != OutcomeBlocked || !strings.Contains(d.Reason, "failing closed: apiserver unreachable") {
		t.Fatalf("erroring guardrail did not block: %+v", d)
	}

	h2 := newHarness(t)
	holder := &countingHolder{}
	h2.opts.Cluster = guardrails.Cluster{Budget: holder}
	e := h2.engine(mustPolicy(t, enforceRule))
	w.fixes["a"] = true
	setPresent("a", "p")
	h2.cycle(e)
	if holder.checks.Load() != 1 || holder.releases.Load() != 0 {
		t.Fatalf("held before verification: checks=%d releases=%d", holder.checks.Load(), holder.releases.Load())
	}
	h2.clock.Step(31 * time.Second)
	h2.cycle(e)
	if holder.releases.Load() != 1 {
		t.Fatalf("not released after verification: %d", holder.releases.Load())
	}
	// A dry run asks but takes nothing.
	h3 := newHarness(t)
	holder3 := &countingHolder{}
	h3.opts.Cluster = guardrails.Cluster{Budget: holder3}
	setPresent("a", "p")
	h3.cycle(h3.engine(mustPolicy(t, strings.Replace(enforceRule, "enforce", "audit", 1))))
	if !holder3.sawDryRun.Load() || holder3.checks.Load() != 0 || holder3.releases.Load() != 0 {
		t.Fatal("dry run took a budget slot")
	}
}

func TestOnceMeetsForButKeepsOtherGuardrails(t *testing.T) {
	h := newHarness(t)
	h.opts.Once = true
	src := strings.Replace(enforceRule, "for: 0s", "for: 1h", 1)
	setPresent("a", "p")
	if d := decisionFor(h.cycle(h.engine(mustPolicy(t, src))), "p"); d.Outcome != OutcomeExecuted {
		t.Fatalf("once: %+v", d)
	}
	// A second one-shot run shares the first one's history via the state dir.
	src2 := strings.Replace(src, "cooldown: 0s", "cooldown: 1h", 1)
	if d := decisionFor(h.cycle(h.engine(mustPolicy(t, src2))), "p"); d.Outcome == OutcomeExecuted {
		t.Fatalf("second once ignored cooldown from the first: %+v", d)
	}
}

func TestReportOnlyRuleAndVanishingTargets(t *testing.T) {
	h := newHarness(t)
	e := h.engine(mustPolicy(t, "rules:\n- name: watch\n  detector: {type: Fake, key: a}\n  for: 0s\n"))
	setPresent("a", "p1", "p2")
	rep := h.cycle(e)
	if len(rep.Decisions) != 2 || rep.Decisions[0].Reason != "report-only rule (no action)" {
		t.Fatalf("%+v", rep.Decisions)
	}
	setPresent("a")
	rep = h.cycle(e)
	if len(rep.Decisions) != 0 || len(rep.Findings) != 0 {
		t.Fatalf("vanished targets still reported: %+v", rep)
	}
	st, _ := (&Store{Dir: h.dir}).Load(h.clock.Now())
	if len(st.Targets) != 0 {
		t.Fatalf("state kept for vanished targets: %v", st.Targets)
	}
}

func TestStateDirLockSerializesRuns(t *testing.T) {
	dir := t.TempDir()
	s := &Store{Dir: dir}
	unlock, err := s.Lock(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	if _, err := s.Lock(ctx); err == nil || !strings.Contains(err.Error(), "locked by another remediate process") {
		t.Fatalf("second lock: %v", err)
	}
	unlock()
	unlock2, err := s.Lock(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	unlock2()
}

// TestOnceDoesNotShortenDaemonFor: a one-shot run pointed at the daemon's
// state dir decides with `for` met, but the daemon afterwards still waits
// its full `for` from the first sighting.
func TestOnceDoesNotShortenDaemonFor(t *testing.T) {
	h := newHarness(t)
	src := strings.Replace(enforceRule, "for: 0s", "for: 10m", 1)
	p := mustPolicy(t, src)
	setPresent("a", "p")
	once := h.opts
	once.Once, once.ForceDryRun = true, true
	e1, err := New(p, once)
	if err != nil {
		t.Fatal(err)
	}
	if d := decisionFor(h.cycle(e1), "p"); d.Outcome != OutcomeDryRun {
		t.Fatalf("once: %+v", d)
	}
	daemon := h.engine(p)
	h.clock.Step(time.Minute)
	if d := decisionFor(h.cycle(daemon), "p"); d.Outcome != OutcomeSkipped || d.Phase != PhasePending {
		t.Fatalf("daemon acted 1m after first sighting with for=10m: %+v", d)
	}
	if len(executed()) != 0 {
		t.Fatalf("executed %v", executed())
	}
	h.clock.Step(9 * time.Minute)
	if d := decisionFor(h.cycle(daemon), "p"); d.Outcome != OutcomeExecuted {
		t.Fatalf("daemon did not fire after for (counted from the once run's sighting): %+v", d)
	}
}

type refusingAction struct{}

func (refusingAction) Plan(context.Context, finding.Finding) (action.Plan, error) {
	return action.Plan{Summary: "kill it"}, nil
}
func (refusingAction) Execute(context.Context, finding.Finding) (action.Result, error) {
	return action.Result{}, finding.Skip("process exited before SIGTERM")
}

func init() {
	action.Define("FakeRefuse", "test",
		func(*fakeParams, *node.Node) (action.Action, error) { return refusingAction{}, nil }, action.ActsOnAnyFinding())
}

// TestRefusalAtExecutionIsNotAFailure: an action whose re-check refuses
// (the target vanished) neither burns an attempt nor uses the rate budget.
func TestRefusalAtExecutionIsNotAFailure(t *testing.T) {
	h := newHarness(t)
	src := strings.Replace(strings.Replace(enforceRule, "type: FakeFix", "type: FakeRefuse", 1), "rateLimit: {max: 10, per: 1h}", "rateLimit: {max: 1, per: 1h}", 1)
	e := h.engine(mustPolicy(t, src))
	setPresent("a", "p")
	for i := 0; i < 4; i++ {
		d := decisionFor(h.cycle(e), "p")
		if d.Outcome != OutcomeSkipped || !strings.Contains(d.Reason, "refused at execution: process exited") || d.Phase == PhaseEscalated {
			t.Fatalf("cycle %d: %+v", i, d)
		}
		h.clock.Step(time.Minute)
	}
	recs, _ := journal.ReadAll(h.dir)
	if len(recs) != 8 || recs[1].Outcome != "skipped" {
		t.Fatalf("journal: %+v", recs)
	}
}

func TestOnceDryRunDoesNotShortenTheDaemonsFor(t *testing.T) {
	h := newHarness(t)
	src := strings.Replace(enforceRule, "for: 0s", "for: 1h", 1)
	setPresent("a", "p")
	// The daemon sees the finding first: Pending.
	daemon := h.engine(mustPolicy(t, src))
	if d := decisionFor(h.cycle(daemon), "p"); d.Outcome != OutcomeSkipped || d.Phase != PhasePending {
		t.Fatalf("daemon first cycle: %+v", d)
	}
	// On-call runs `remediate --once --dry-run` on the same state dir.
	once := h.opts
	once.Once, once.ForceDryRun = true, true
	e1, err := New(mustPolicy(t, src), once)
	if err != nil {
		t.Fatal(err)
	}
	h.clock.Step(time.Minute)
	if d := decisionFor(h.cycle(e1), "p"); d.Outcome != OutcomeDryRun {
		t.Fatalf("once dry run: %+v", d)
	}
	// The daemon's next cycle is still within `for`: it must not act.
	h.clock.Step(time.Minute)
	if d := decisionFor(h.cycle(daemon), "p"); d.Outcome == OutcomeExecuted || len(executed()) != 0 {
		t.Fatalf("a --once --dry-run made the daemon act before `for`: %+v executed=%v", d, executed())
	}
	// And it still acts once `for` has passed since the finding appeared.
	h.clock.Step(time.Hour)
	if d := decisionFor(h.cycle(daemon), "p"); d.Outcome != OutcomeExecuted {
		t.Fatalf("after for: %+v", d)
	}
}

func TestReloadRemovingARuleReleasesWhatItHolds(t *testing.T) {
	h := newHarness(t)
	holder := &countingHolder{}
	h.opts.Cluster = guardrails.Cluster{Budget: holder}
	e := h.engine(mustPolicy(t, enforceRule))
	setPresent("a", "p")
	h.cycle(e)
	if holder.checks.Load() != 1 || holder.releases.Load() != 0 {
		t.Fatalf("not held while verifying: checks=%d releases=%d", holder.checks.Load(), holder.releases.Load())
	}
	// The rule is renamed away while its target is Verifying: nothing will
	// ever step that target again.
	if err := e.SetPolicy(mustPolicy(t, strings.Replace(enforceRule, "fix-it", "other", 1))); err != nil {
		t.Fatal(err)
	}
	if holder.releases.Load() != 1 {
		t.Fatalf("slot of a removed rule still held after reload: releases=%d", holder.releases.Load())
	}
	// A reload that keeps the rule keeps its slot.
	h.clock.Step(time.Hour)
	h.cycle(e)
	if holder.checks.Load() != 2 {
		t.Fatalf("checks=%d", holder.checks.Load())
	}
	if err := e.SetPolicy(mustPolicy(t, strings.Replace(enforceRule, "fix-it", "other", 1))); err != nil {
		t.Fatal(err)
	}
	if holder.releases.Load() != 1 {
		t.Fatalf("reload released the slot of a rule it kept: releases=%d", holder.releases.Load())
	}
}

func TestAbandonedActionIsNotStartedAgainWhileRunning(t *testing.T) {
	h := newHarness(t)
	p := mustPolicy(t, strings.Replace(enforceRule, "maxAttempts: 2", "maxAttempts: 5", 1)+"actionTimeout: 100ms\n")
	e := h.engine(p)
	release := make(chan struct{})
	w.actBlock["a"] = release
	setPresent("a", "p")
	if d := decisionFor(h.cycle(e), "p"); d.Outcome != OutcomeFailed || !strings.Contains(d.Reason, "did not finish") {
		t.Fatalf("first: %+v", d)
	}
	// Next cycle: the abandoned Execute still runs; starting another one
	// on the same target would act twice at once.
	h.clock.Step(time.Minute)
	d := decisionFor(h.cycle(e), "p")
	w.mu.Lock()
	starts := w.starts
	w.mu.Unlock()
	if starts != 1 || !strings.Contains(d.Reason, "still running") {
		t.Fatalf("action started again while the abandoned one runs: starts=%d %+v", starts, d)
	}
	// Once it returns (late, writing its result), the rule may act again.
	close(release)
	deadline := time.Now().Add(5 * time.Second)
	for len(executed()) == 0 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	time.Sleep(50 * time.Millisecond)
	h.clock.Step(time.Minute)
	if d := decisionFor(h.cycle(e), "p"); d.Outcome != OutcomeExecuted {
		t.Fatalf("after the abandoned action returned: %+v", d)
	}
}

// stopGuard cancels the cycle's context as a SIGTERM arriving mid-cycle would.
type stopGuard struct{ cancel context.CancelFunc }

func (stopGuard) Name() string { return "stop" }
func (g stopGuard) Check(context.Context, *guardrails.Request) error {
	g.cancel()
	return nil
}

func TestNoNewActionAfterStop(t *testing.T) {
	h := newHarness(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	holder := &countingHolder{}
	// The stop arrives after the holder took its slot: the holder sits
	// before the budget's place in the chain, the stop in it.
	h.opts.Cluster = guardrails.Cluster{KubeProxyRollout: holder, Budget: stopGuard{cancel}}
	e := h.engine(mustPolicy(t, enforceRule))
	setPresent("a", "p")
	rep, err := e.Cycle(ctx)
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(50 * time.Millisecond) // an action started in the background would have run by now
	if d := decisionFor(rep, "p"); d.Outcome != OutcomeSkipped || !strings.Contains(d.Reason, "stopping") || len(executed()) != 0 {
		t.Fatalf("acted after stop: %+v executed=%v", d, executed())
	}
	if holder.checks.Load() != 1 || holder.releases.Load() != 1 {
		t.Fatalf("slot taken before the stop not released: checks=%d releases=%d", holder.checks.Load(), holder.releases.Load())
	}
	st, _ := (&Store{Dir: h.dir}).Load(h.clock.Now())
	if len(st.History) != 0 {
		t.Fatalf("an attempt not made counts against the limits: %+v", st.History)
	}
}

func TestPolicyDoesNotWaitForACycle(t *testing.T) {
	h := newHarness(t)
	e := h.engine(mustPolicy(t, enforceRule+"detectorTimeout: 20s\n"))
	release := make(chan struct{})
	w.mu.Lock()
	w.hang["a"] = release
	w.mu.Unlock()
	cycled := make(chan struct{})
	go func() {
		defer close(cycled)
		_, _ = e.Cycle(context.Background())
	}()
	defer func() { close(release); <-cycled }()
	time.Sleep(50 * time.Millisecond) // the cycle is in its detectors
	got := make(chan *policy.Policy, 1)
	go func() { got <- e.Policy() }()
	select {
	case p := <-got:
		if p == nil || p.Rules[0].Name != "fix-it" {
			t.Fatalf("policy = %+v", p)
		}
	case <-time.After(2 * time.Second):
		t.Fatal("Policy() (behind /healthz) blocked for the whole cycle: a slow cycle fails the liveness probe")
	}
}

func TestFreshDetectorsFirstRunDoesNotClearEscalation(t *testing.T) {
	h := newHarness(t)
	src := strings.Replace(enforceRule, "maxAttempts: 2", "maxAttempts: 1", 1)
	e := h.engine(mustPolicy(t, src))
	w.actErr["a"] = errors.New("boom")
	setPresent("a", "p")
	if d := decisionFor(h.cycle(e), "p"); d.Phase != PhaseEscalated {
		t.Fatalf("not escalated: %+v", d)
	}
	// A reload (or restart) rebuilds the detector; a rate or hold-time
	// detector reports nothing on its first run: no baseline yet.
	for _, restart := range []bool{false, true} {
		if restart {
			e = h.engine(mustPolicy(t, src))
		} else if err := e.SetPolicy(mustPolicy(t, src)); err != nil {
			t.Fatal(err)
		}
		setPresent("a")
		h.clock.Step(time.Hour)
		h.cycle(e)
		setPresent("a", "p")
		h.clock.Step(time.Minute)
		if d := decisionFor(h.cycle(e), "p"); d.Guardrail != guardrails.GuardEscalation || len(executed()) != 1 {
			t.Fatalf("restart=%v: escalation cleared by a fresh detector's empty first run: %+v executed=%v", restart, d, executed())
		}
	}
	// Once warm, absence clears as before.
	setPresent("a")
	h.cycle(e)
	if st, _ := (&Store{Dir: h.dir}).Load(h.clock.Now()); len(st.Targets) != 0 {
		t.Fatalf("cleared finding kept: %v", st.Targets)
	}
}

func TestSlotReleasedWhenStopCancelsTheAction(t *testing.T) {
	h := newHarness(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	holder := &countingHolder{}
	h.opts.Cluster = guardrails.Cluster{Budget: holder}
	e := h.engine(mustPolicy(t, enforceRule))
	// SIGTERM arrives while the action runs; the action fails with it.
	w.actHook["a"] = cancel
	w.actErr["a"] = context.Canceled
	setPresent("a", "p")
	if _, err := e.Cycle(ctx); err != nil {
		t.Fatal(err)
	}
	if holder.releases.Load() != 1 || holder.cancelledRelease.Load() {
		t.Fatalf("slot released with the cancelled context (the API call fails, the slot stays taken for its TTL): releases=%d cancelled=%v",
			holder.releases.Load(), holder.cancelledRelease.Load())
	}
}

func TestSlotReleasedWhenAnotherRunJudgedTheVerification(t *testing.T) {
	h := newHarness(t)
	holder := &countingHolder{}
	h.opts.Cluster = guardrails.Cluster{Budget: holder}
	daemon := h.engine(mustPolicy(t, enforceRule))
	setPresent("a", "p")
	h.cycle(daemon) // executed, Verifying, slot held
	// After verifyAfter, on-call runs `remediate --once --dry-run` on the
	// daemon's state dir: the finding is still there, verification failed.
	once := h.opts
	once.Once, once.ForceDryRun, once.Cluster = true, true, guardrails.Cluster{}
	e1, err := New(mustPolicy(t, enforceRule), once)
	if err != nil {
		t.Fatal(err)
	}
	h.clock.Step(time.Minute)
	h.cycle(e1)
	// Then the finding clears; the daemon never sees its target Verifying.
	setPresent("a")
	h.clock.Step(time.Minute)
	h.cycle(daemon)
	if holder.releases.Load() != 1 {
		t.Fatalf("slot held for a target no longer Verifying: checks=%d releases=%d", holder.checks.Load(), holder.releases.Load())
	}
}

// TestActionErrorTextIsNotADaemonFault: only a real panic or an overrun of
// the engine's deadline is a finding about the daemon, not an action error
// whose text happens to say "panicked".
func TestActionErrorTextIsNotADaemonFault(t *testing.T) {
	h := newHarness(t)
	e := h.engine(mustPolicy(t, enforceRule))
	w.mu.Lock()
	w.actErr["a"] = errors.New("iptables-restore panicked: exit status 2")
	w.mu.Unlock()
	setPresent("a", "p")
	rep := h.cycle(e)
	if d := decisionFor(rep, "p"); d.Outcome != OutcomeFailed {
		t.Fatalf("%+v", d)
	}
	for _, f := range rep.Findings {
		if f.Detector == SelfDetector {
			t.Fatalf("an ordinary action error was reported as a daemon fault: %+v", f)
		}
	}
}

// TestCriticalTargetGetsTheRateLimit: two warning-level targets listed
// first (lower PIDs) used to take the rule's whole rate limit while the
// critical one stayed untouched for the hour (issue 13).
func TestCriticalTargetGetsTheRateLimit(t *testing.T) {
	h := newHarness(t)
	p := mustPolicy(t, strings.Replace(enforceRule, "rateLimit: {max: 10, per: 1h}", "rateLimit: {max: 2, per: 1h}", 1))
	setPresent("a", "process/100@1", "process/101@1", "process/300@1")
	w.mu.Lock()
	w.severity["process/100@1"], w.severity["process/101@1"] = finding.Warning, finding.Warning
	w.mu.Unlock()
	rep := h.cycle(h.engine(p))
	got := executed()
	if len(got) != 2 || got[0] != "a:process/300@1" {
		t.Fatalf("executed %v, want the critical process/300@1 first", got)
	}
	if d := decisionFor(rep, "process/101@1"); d.Outcome != OutcomeBlocked || d.Guardrail != guardrails.GuardRuleRate {
		t.Errorf("last warning: %+v, want blocked by the rate limit", d)
	}
}
