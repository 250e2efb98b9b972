package remediate

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/remediate-dev/remediate/remediate/guardrails"
	"github.com/remediate-dev/remediate/remediate/journal"
)

func TestClampFuture(t *testing.T) {
	future := time.Date(2031, 1, 2, 3, 4, 5, 0, time.UTC)
	st := NewState()
	st.History = []ActionRecord{
		{Time: t0.Add(-time.Hour), Rule: "r", Target: "a", Outcome: "executed"},
		{Time: future, Rule: "r", Target: "b", Outcome: "executed"},
		{Time: t0.Add(-time.Minute), Rule: "r", Target: "c", Outcome: "executed"},
	}
	st.Targets["r|b"] = TargetState{Phase: PhaseVerifying, Since: future, LastSeen: future, LastActed: future, VerifyAt: future}
	st.Targets["r|c"] = TargetState{Phase: PhaseVerifying, Since: t0, LastSeen: t0, LastActed: t0, VerifyAt: t0.Add(30 * time.Second)}
	c := st.ClampFuture(t0, time.Minute)
	if c.N != 5 || !c.Latest.Equal(future) {
		t.Fatalf("clamped %+v, want 5 entries, latest %s", c, future)
	}
	for i, h := range st.History {
		if h.Time.After(t0) || (i > 0 && h.Time.Before(st.History[i-1].Time)) {
			t.Fatalf("history %d at %s: not clamped to now or out of order: %+v", i, h.Time, st.History)
		}
	}
	if b := st.Targets["r|b"]; !b.LastActed.Equal(t0) || !b.VerifyAt.Equal(t0.Add(time.Minute)) {
		t.Errorf("target b = %+v", b)
	}
	if c := st.Targets["r|c"]; !c.VerifyAt.Equal(t0.Add(30 * time.Second)) {
		t.Errorf("a due time within verifyAfter was clamped: %+v", c)
	}
	if c := st.ClampFuture(t0, time.Minute); c.N != 0 {
		t.Errorf("second clamp changed %d", c.N)
	}
}

// TestHistoryFromTheFutureIsClamped (issue 27 item 3): a state file whose
// history has an entry dated 2031 (the clock ran ahead, then was set back)
// must not hold a 1/h rate limit until 2031. The entry is clamped to now
// with a warning, a metric, a journal note and a finding on remediate; the
// limit then holds one window from now, and the rule acts after it.
func TestHistoryFromTheFutureIsClamped(t *testing.T) {
	h := newHarness(t)
	future := time.Date(2031, 6, 1, 0, 0, 0, 0, time.UTC)
	st := NewState()
	st.History = []ActionRecord{{Time: future, Rule: "fix-it", Target: "process/9", Action: "FakeFix", Outcome: "executed"}}
	if err := (&Store{Dir: h.dir}).Save(st); err != nil {
		t.Fatal(err)
	}
	e := h.engine(mustPolicy(t, strings.Replace(enforceRule, "rateLimit: {max: 10, per: 1h}", "rateLimit: {max: 1, per: 1h}", 1)))
	setPresent("a", "process/1")
	rep := h.cycle(e)
	d := decisionFor(rep, "process/1")
	if d.Outcome != OutcomeBlocked || d.Guardrail != guardrails.GuardRuleRate || strings.Contains(d.Reason, "2031") ||
		!strings.Contains(d.Reason, t0.Add(time.Hour).Format(time.RFC3339)) {
		t.Fatalf("decision %+v: want blocked by the rule rate limit until now+1h, not 2031", d)
	}
	var self *ReportFinding
	for i, f := range rep.Findings {
		if f.Detector == SelfDetector && f.Target == "state/clock" {
			self = &rep.Findings[i]
		}
	}
	if self == nil || !strings.Contains(self.Message, "2031-06-01T00:00:00Z") || len(rep.Warnings) == 0 {
		t.Fatalf("no finding on remediate about the clock: %+v warnings %v", rep.Findings, rep.Warnings)
	}
	if v := h.exported().clamped; v != 1 {
		t.Errorf("remediate_state_future_entries_clamped_total = %v", v)
	}
	saved, _ := (&Store{Dir: h.dir}).Load(t0)
	if len(saved.History) != 1 || !saved.History[0].Time.Equal(t0) {
		t.Fatalf("saved history %+v, want the entry clamped to %s", saved.History, t0)
	}
	if !strings.Contains(strings.Join(journalKinds(t, h.dir), ","), journal.KindNote) {
		t.Error("no journal note")
	}
	// Said once: the clamped state is saved.
	h.clock.Step(time.Minute)
	if rep := h.cycle(e); len(rep.Warnings) != 0 {
		t.Errorf("warned again: %v", rep.Warnings)
	}
	h.clock.Step(time.Hour)
	if d := decisionFor(h.cycle(e), "process/1"); d.Outcome != OutcomeExecuted {
		t.Fatalf("an hour after the clamp: %+v", d)
	}
}

// crashedDir runs one cycle whose action blocks, and copies the state dir
// as it is while the action runs: what kill -9 of the daemon at that moment
// leaves (the state saved with the attempt pending, the intent journaled).
// The returned harness works on the copy.
func crashedDir(t *testing.T, pol string) *harness {
	t.Helper()
	h := newHarness(t)
	e := h.engine(mustPolicy(t, pol))
	setPresent("a", "process/1")
	release := make(chan struct{})
	copied := t.TempDir()
	w.actBlock["a"] = release
	w.actHook["a"] = func() {
		for _, name := range []string{stateFile, journal.FileName} {
			b, err := os.ReadFile(filepath.Join(h.dir, name))
			if err != nil {
				t.Error(err)
				continue
			}
			if err := os.WriteFile(filepath.Join(copied, name), b, 0o600); err != nil {
				t.Error(err)
			}
		}
		close(release)
	}
	h.cycle(e)
	w.mu.Lock()
	delete(w.actBlock, "a")
	delete(w.actHook, "a")
	w.executed = nil
	w.mu.Unlock()
	j, err := journal.Open(copied, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	h2 := &harness{t: t, dir: copied, clock: h.clock, opts: h.opts}
	h2.opts.StateDir, h2.opts.Journal, h2.opts.Exporters = copied, j, []Exporter{&recorder{}}
	return h2
}

// TestInterruptedActionIsSettled (issue 27 item 2, on the files a kill -9
// mid-action leaves; the real daemon killed -9 is
// cmd/remediate TestDaemonKilledMidActionSettles): the restarted engine
// records the attempt as interrupted (journal, history, log, metric, a
// finding on remediate), verifies the target now, and decides from that.
func TestInterruptedActionIsSettled(t *testing.T) {
	t.Run("target still there: failed attempt, acted on again", func(t *testing.T) {
		h := crashedDir(t, enforceRule)
		before, _ := (&Store{Dir: h.dir}).Load(t0)
		if len(before.History) != 1 || before.History[0].Outcome != historyPending {
			t.Fatalf("the crash left %+v, want one pending attempt", before.History)
		}
		h.clock.Step(5 * time.Second)
		e := h.engine(mustPolicy(t, enforceRule))
		rep := h.cycle(e)
		if v := h.exported().interrupted[RuleAction{"fix-it", "FakeFix"}]; v != 1 {
			t.Errorf("remediate_actions_interrupted_total = %v", v)
		}
		var self bool
		for _, f := range rep.Findings {
			self = self || (f.Detector == SelfDetector && strings.Contains(f.Message, "was interrupted"))
		}
		if !self {
			t.Errorf("no finding on remediate: %+v", rep.Findings)
		}
		var failed bool
		for _, d := range rep.Decisions {
			failed = failed || (d.Outcome == OutcomeFailed && strings.Contains(d.Reason, "interrupted: the daemon stopped during the action; the finding is still present"))
		}
		if !failed {
			t.Errorf("no failed attempt saying it was interrupted: %+v", rep.Decisions)
		}
		// Verified now: still present, so a failed attempt (1 of 2), and
		// acted on again within the guardrails.
		if d := decisionFor(rep, "process/1"); d.Outcome != OutcomeExecuted || d.Phase != PhaseVerifying {
			t.Fatalf("decision after the restart %+v", d)
		}
		if got := executed(); len(got) != 1 {
			t.Fatalf("executed %v", got)
		}
		after, _ := (&Store{Dir: h.dir}).Load(t0)
		var outs []string
		for _, r := range after.History {
			outs = append(outs, r.Outcome)
		}
		if strings.Join(outs, ",") != "interrupted,executed" || after.Targets["fix-it|process/1"].Attempts != 1 {
			t.Fatalf("history %v, target %+v", outs, after.Targets["fix-it|process/1"])
		}
		recs, _ := journal.ReadAll(h.dir)
		var kinds []string
		for _, r := range recs {
			kinds = append(kinds, r.Kind+"/"+r.Outcome)
		}
		if strings.Join(kinds, ",") != "intent/,outcome/interrupted,intent/,outcome/executed" {
			t.Fatalf("journal %v", kinds)
		}
	})
	t.Run("target gone: resolved, no action", func(t *testing.T) {
		h := crashedDir(t, enforceRule)
		setPresent("a")
		e := h.engine(mustPolicy(t, enforceRule))
		h.cycle(e) // first cycle after a start: absence is not judged yet
		h.clock.Step(time.Second)
		h.cycle(e)
		after, _ := (&Store{Dir: h.dir}).Load(t0)
		ts, kept := after.Targets["fix-it|process/1"]
		if len(after.History) != 1 || after.History[0].Outcome != historyInterrupted || (kept && ts.Phase != PhaseResolved) || len(executed()) != 0 {
			t.Fatalf("history %+v targets %+v executed %v", after.History, after.Targets, executed())
		}
		if !strings.Contains(strings.Join(journalKinds(t, h.dir), ","), journal.KindVerified) {
			t.Errorf("no verified record: %v", journalKinds(t, h.dir))
		}
	})
	t.Run("interrupted counts against the cooldown", func(t *testing.T) {
		pol := strings.Replace(enforceRule, "cooldown: 0s", "cooldown: 30m", 1)
		h := crashedDir(t, pol)
		h.clock.Step(time.Minute)
		rep := h.cycle(h.engine(mustPolicy(t, pol)))
		if d := decisionFor(rep, "process/1"); d.Outcome != OutcomeBlocked || d.Guardrail != guardrails.GuardCooldown || len(executed()) != 0 {
			t.Fatalf("decision %+v", d)
		}
	})
}
