package remediate

import (
	"time"

	"github.com/remediate-dev/remediate/remediate/guardrails"
)

// State is the guardrails' Ledger.
var _ guardrails.Ledger = (*State)(nil)

// Escalated implements guardrails.Ledger.
func (s *State) Escalated(key string) (int, string, bool) {
	ts, ok := s.Targets[key]
	if !ok || ts.Phase != PhaseEscalated {
		return 0, "", false
	}
	return ts.Attempts, ts.LastError, true
}

// UnknownHistorySince implements guardrails.Ledger.
func (s *State) UnknownHistorySince() time.Time { return s.UnknownHistoryAt }

// Attempts implements guardrails.Ledger.
func (s *State) Attempts() []guardrails.Attempt {
	out := make([]guardrails.Attempt, len(s.History))
	for i, h := range s.History {
		out[i] = guardrails.Attempt{Time: h.Time, Rule: h.Rule, Target: h.Target, Changed: h.changedSomething()}
	}
	return out
}

// changedSomething is false for attempts known not to have changed anything
// (the action refused at execution, or the journal intent could not be
// written). Pending attempts (a crash mid-action) count.
func (h ActionRecord) changedSomething() bool {
	return h.Outcome != string(OutcomeSkipped) && h.Outcome != historyNotRun
}
