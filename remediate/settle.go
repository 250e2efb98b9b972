package remediate

// Recovery at the start of a cycle, under the state dir lock: state that a
// previous life of the daemon (or a failed save) left behind is made to
// agree with the journal and with the clock before anything is decided.

import (
	"fmt"
	"path/filepath"
	"time"

	"go.uber.org/zap"

	"github.com/remediate-dev/remediate/internal/finding"
	"github.com/remediate-dev/remediate/remediate/guardrails"
	"github.com/remediate-dev/remediate/remediate/journal"
)

// History outcomes besides the report's Outcomes.
const (
	// historyPending: committed (counted by every limit), not yet returned.
	historyPending = "pending"
	// historyNotRun: the journal intent could not be written; the action
	// never started (act.go).
	historyNotRun = "not-run"
	// historyInterrupted: the intent was journaled, no outcome ever was
	// (the daemon was killed or crashed mid-action). It counts against
	// every limit: the action may have done part of its work.
	historyInterrupted = "interrupted"
)

// interruptedPrefix starts the LastError of a target whose action was
// interrupted; Step keeps it when the verification finds the target still
// there, so the failed attempt says why.
const interruptedPrefix = "interrupted: the daemon stopped during the action"

// attemptID is the journal ID shared by an attempt's intent and outcome.
func attemptID(at time.Time, key string) string {
	return fmt.Sprintf("%d-%s", at.UnixNano(), shortHash(key))
}

// recordID is h's journal ID (derived for records written before IDs were
// stored: the same formula from the same time and key).
func recordID(h ActionRecord) string {
	if h.ID != "" {
		return h.ID
	}
	return attemptID(h.Time, guardrails.TargetKey(h.Rule, h.Target))
}

// Clamped is what ClampFuture changed.
type Clamped struct {
	// N is how many times were moved back to now.
	N int
	// Latest is the furthest-ahead time seen.
	Latest time.Time
}

// ClampFuture moves every time in s that lies after now back to now: the
// clock ran ahead when they were written (then was set back), and an entry
// dated in 2031 would hold a rate limit or cooldown until 2031. Clamped
// entries count as if they happened now, so the limits they are part of
// still hold for one window: the safe side. VerifyAt is a due time, not a
// past event: it is clamped only beyond now plus maxAhead (the longest
// verifyAfter of the policy).
func (s *State) ClampFuture(now time.Time, maxAhead time.Duration) Clamped {
	var c Clamped
	clamp := func(t *time.Time, limit time.Time) {
		if t.After(limit) {
			c.N++
			if t.After(c.Latest) {
				c.Latest = *t
			}
			*t = limit
		}
	}
	for i := range s.History {
		clamp(&s.History[i].Time, now)
	}
	for k, ts := range s.Targets {
		clamp(&ts.Since, now)
		clamp(&ts.LastSeen, now)
		clamp(&ts.LastActed, now)
		clamp(&ts.VerifyAt, now.Add(maxAhead))
		s.Targets[k] = ts
	}
	clamp(&s.UnknownHistoryAt, now)
	if c.N > 0 {
		// Clamped records may now be out of order; Prune and the limits
		// read the history oldest first.
		sortHistory(s.History)
	}
	return c
}

func sortHistory(h []ActionRecord) {
	// Insertion sort: stable, and the history is nearly sorted.
	for i := 1; i < len(h); i++ {
		for j := i; j > 0 && h[j].Time.Before(h[j-1].Time); j-- {
			h[j], h[j-1] = h[j-1], h[j]
		}
	}
}

// clampClock applies ClampFuture at the start of a cycle and says so: log,
// metric, journal note, report warning and a finding on remediate itself.
func (e *Engine) clampClock(st *State, rep *Report, now time.Time, x *CycleExport) {
	maxAhead := time.Duration(0)
	for _, rr := range e.rules {
		maxAhead = max(maxAhead, rr.rule.VerifyAfter.Duration)
	}
	c := st.ClampFuture(now, maxAhead)
	if c.N == 0 {
		return
	}
	msg := fmt.Sprintf("%d guardrail state entries were dated in the future (the latest %s, now %s): the clock ran ahead; clamped to now, so their rate limits and cooldowns count from now instead of holding until then",
		c.N, c.Latest.UTC().Format(time.RFC3339), now.UTC().Format(time.RFC3339))
	e.opts.Log.Warn("guardrail state from the future clamped to now", zap.Int("entries", c.N), zap.Time("latest", c.Latest), zap.Time("now", now))
	x.ClockClamped += c.N
	rep.Warnings = append(rep.Warnings, msg)
	rep.Findings = append(rep.Findings, ReportFinding{Rule: SelfDetector, Finding: finding.Finding{
		Detector: SelfDetector, Target: "state/clock", Severity: finding.Warning, Message: msg,
		Evidence: map[string]any{"clampedEntries": c.N, "latest": c.Latest.UTC().Format(time.RFC3339Nano)},
	}})
	e.journal(journal.Record{Kind: journal.KindNote, Summary: msg}, rep)
}

// settleUnfinished settles the attempts the history still shows pending.
// It runs under the state dir lock, which a cycle holds while it acts, so
// no action of this daemon or of a --once run is in flight: a pending
// record is one whose outcome never reached the state file. The journal is
// the source of truth for what happened:
//   - an outcome record with the attempt's ID (the state save after the
//     action failed, e.g. a full disk): the history and the target's state
//     take that outcome, as if the save had worked;
//   - an intent but no outcome (the daemon was killed mid-action): the
//     attempt is interrupted. That is journaled (an outcome record
//     "interrupted"), logged, counted (remediate_actions_interrupted_total),
//     reported as a finding on remediate itself, and the target is put to
//     verification now: this cycle's detection says whether the target is
//     gone (resolved) or still there (a failed attempt: retried within the
//     guardrails, escalated at maxAttempts). The interrupted attempt counts
//     against every limit;
//   - no intent either (the daemon stopped between the state save and the
//     intent write, or the intent was rotated out of the journal): whether
//     the action started is unknown; settled as interrupted, and counted.
func (e *Engine) settleUnfinished(st *State, rep *Report, now time.Time, x *CycleExport) {
	var pending []int
	for i, h := range st.History {
		if h.Outcome == historyPending {
			pending = append(pending, i)
		}
	}
	if len(pending) == 0 {
		return
	}
	wanted := make(map[string]bool, len(pending))
	for _, i := range pending {
		wanted[recordID(st.History[i])] = true
	}
	outcomes, jerr := e.journalOutcomes(wanted)
	if jerr != nil {
		e.opts.Log.Warn("journal unreadable while settling unfinished actions; treating them as interrupted", zap.Error(jerr))
	}
	for _, i := range pending {
		h := &st.History[i]
		id := recordID(*h)
		key := guardrails.TargetKey(h.Rule, h.Target)
		if out, ok := outcomes[id]; ok && out.Outcome != historyInterrupted {
			e.adoptOutcome(st, h, key, out, rep)
			continue
		}
		// No intent either (a stop between the state save and the intent
		// write, or the journal rotated away): whether the action started
		// is unknown, so it is settled the same way, and still counts.
		_, settled := outcomes[id] // an interrupted outcome journaled by an earlier settle
		e.interrupted(st, h, key, id, settled, rep, now, x)
	}
}

// journalOutcomes reads the journal's outcome records of the IDs wanted,
// streamed: only those are kept, whatever the journal's size.
func (e *Engine) journalOutcomes(wanted map[string]bool) (map[string]journal.Record, error) {
	outcomes := map[string]journal.Record{}
	err := journal.Walk(filepath.Dir(e.opts.Journal.Path()), func(r journal.Record) error {
		if r.Kind == journal.KindOutcome && wanted[r.ID] {
			outcomes[r.ID] = r
		}
		return nil
	})
	return outcomes, err
}

// adoptOutcome makes the state agree with the outcome the journal has for
// h: the state save after the action failed (a full disk), the journal
// append did not.
func (e *Engine) adoptOutcome(st *State, h *ActionRecord, key string, out journal.Record, rep *Report) {
	h.Outcome = out.Outcome
	e.opts.Log.Warn("state file did not record an action's outcome; taken from the journal",
		zap.String("rule", h.Rule), zap.String("target", h.Target), zap.String("outcome", out.Outcome), zap.String("id", out.ID))
	rep.Warnings = append(rep.Warnings, fmt.Sprintf("rule %s target %s: the outcome %q of the action at %s was in the journal but not in the state file (the state was not saved); taken from the journal",
		h.Rule, h.Target, out.Outcome, h.Time.UTC().Format(time.RFC3339)))
	ts, ok := st.Targets[key]
	if !ok || !actedPhase(ts.Phase) || ts.LastActed.After(h.Time) {
		return // the target's state moved on (or is gone): only the history was stale
	}
	var err error
	switch out.Outcome {
	case string(OutcomeExecuted):
	case string(OutcomeFailed):
		err = fmt.Errorf("%s", out.Error)
	default: // skipped: the action changed nothing; the target state stands
		return
	}
	at := out.Time
	if at.IsZero() || at.Before(h.Time) {
		at = h.Time
	}
	st.Targets[key] = Record(ts, ActOutcome{Err: err}, at, e.timing(h.Rule))
}

// interrupted settles h as interrupted (see settleUnfinished).
func (e *Engine) interrupted(st *State, h *ActionRecord, key, id string, alreadyJournaled bool, rep *Report, now time.Time, x *CycleExport) {
	h.Outcome = historyInterrupted
	msg := fmt.Sprintf("action %s on %s (rule %s), started %s, was interrupted: the daemon stopped before it returned (killed or crashed), so what it did is unknown; the finding is verified on this cycle and the rule decides again from that",
		h.Action, h.Target, h.Rule, h.Time.UTC().Format(time.RFC3339))
	e.opts.Log.Error("action interrupted by a daemon stop; settling it", zap.String("rule", h.Rule), zap.String("target", h.Target),
		zap.String("action", h.Action), zap.Time("started", h.Time), zap.String("id", id))
	x.Interrupted = append(x.Interrupted, RuleAction{h.Rule, h.Action})
	if !alreadyJournaled {
		e.journal(journal.Record{ID: id, Kind: journal.KindOutcome, Rule: h.Rule, Target: h.Target, Action: h.Action,
			Outcome: historyInterrupted, Summary: "interrupted: the daemon stopped before the action returned; verifying the finding now",
			Details: map[string]any{"started": h.Time.UTC().Format(time.RFC3339Nano)}}, rep)
	}
	rep.Findings = append(rep.Findings, ReportFinding{Rule: h.Rule, Finding: finding.Finding{
		Detector: SelfDetector, Target: "action/" + h.Rule, Severity: finding.Warning, Message: msg,
		Evidence: map[string]any{"actionType": h.Action, "target": h.Target, "journalID": id, "started": h.Time.UTC().Format(time.RFC3339Nano)},
	}})
	ts, ok := st.Targets[key]
	if !ok || !actedPhase(ts.Phase) || ts.LastActed.After(h.Time) {
		return
	}
	ts.LastActed = h.Time
	ts.Phase = PhaseVerifying
	ts.VerifyAt = now
	ts.LastError = interruptedPrefix
	st.Targets[key] = ts
}

// actedPhase: the phases a target is in when its action was committed
// (Step returned act) and the outcome never recorded.
func actedPhase(p Phase) bool { return p == PhaseFiring || p == PhaseFailed || p == PhasePending }

// timing is the Timing of the rule named name in the policy in force (zero
// when the rule is gone).
func (e *Engine) timing(name string) Timing {
	for _, rr := range e.rules {
		if r := rr.rule; r.Name == name {
			return Timing{For: r.For.Duration, VerifyAfter: r.VerifyAfter.Duration, MaxAttempts: r.MaxAttempts}
		}
	}
	return Timing{MaxAttempts: 1}
}
