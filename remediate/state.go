// Package remediate is the detect → guardrail → act engine.
//
// For every (rule, target) pair the engine keeps a small state machine:
//
//	OK → Pending (finding persists for `for`) → Firing → guardrails → Acting
//	   → Verifying (after verifyAfter, re-detect) → Resolved
//	                                 ↘ Failed → retry (Firing) … → Escalated
//
// Transitions are pure functions of (state, presence of the finding, now)
// in this file, table-tested. The engine (engine.go) runs detectors, feeds
// presence into Step, asks the guardrails (package guardrails) whether an action
// may run, journals intent and outcome (package journal), executes the
// action, records the outcome with Record and persists everything that
// guardrails depend on (store.go) so a restart cannot reset a limit.
package remediate

import (
	"fmt"
	"strings"
	"time"
)

// Phase of a (rule, target) state machine.
type Phase string

// Phases. OK targets are not stored.
const (
	PhaseOK        Phase = "OK"
	PhasePending   Phase = "Pending"
	PhaseFiring    Phase = "Firing"
	PhaseVerifying Phase = "Verifying"
	PhaseFailed    Phase = "Failed"
	PhaseResolved  Phase = "Resolved"
	PhaseEscalated Phase = "Escalated"
)

// TargetState is the persisted state of one (rule, target).
type TargetState struct {
	Phase Phase `json:"phase"`
	// Since is when the finding was first seen in the current episode.
	Since time.Time `json:"since"`
	// LastSeen is the last cycle the finding was present.
	LastSeen time.Time `json:"lastSeen"`
	// Attempts counts failed attempts in this episode (an action that
	// errored, or whose verification found the finding still present).
	Attempts int `json:"attempts,omitempty"`
	// LastActed is when the last action on this target was executed.
	LastActed time.Time `json:"lastActed,omitempty"`
	// VerifyAt is when a Verifying target is re-checked.
	VerifyAt time.Time `json:"verifyAt,omitempty"`
	// LastError is the most recent failure's message.
	LastError string `json:"lastError,omitempty"`
	// DryRunReported is set once a dry-run decision was journaled for this
	// episode, so audit mode journals each would-be action once.
	DryRunReported bool `json:"dryRunReported,omitempty"`
}

// Timing is the part of a rule the state machine needs.
type Timing struct {
	For         time.Duration
	VerifyAfter time.Duration
	MaxAttempts int
	// Once makes `for` count as met for this observation only: the
	// operator is asking now. The target stays Pending in the state, so a
	// daemon sharing the state dir still waits for `for`.
	Once bool
}

// Step advances a state machine by one observation. present says whether
// the rule's detector reported the target this cycle (callers must not call
// Step when the detector failed: unknown is not absent). It returns the next
// state and whether an action should be attempted now (subject to
// guardrails). A returned Phase of PhaseOK means the state can be dropped.
func Step(st TargetState, present bool, now time.Time, t Timing) (TargetState, bool) {
	switch st.Phase {
	case "", PhaseOK, PhaseResolved:
		if !present {
			return TargetState{Phase: PhaseOK}, false
		}
		st = TargetState{Phase: PhasePending, Since: now, LastSeen: now}
		if t.For <= 0 {
			st.Phase = PhaseFiring
			return st, true
		}
		// Once: due now, but the target stays Pending. The state dir may be
		// the daemon's, whose `for` must keep counting from Since: a
		// one-shot (dry) run must not make the daemon act early.
		return st, t.Once
	case PhasePending:
		if !present {
			return TargetState{Phase: PhaseOK}, false // flapped away: start over
		}
		st.LastSeen = now
		if now.Sub(st.Since) >= t.For {
			st.Phase = PhaseFiring
			return st, true
		}
		return st, t.Once // see above: due for --once, still Pending
	case PhaseFiring, PhaseFailed:
		if !present {
			// Cleared without (further) action.
			return TargetState{Phase: PhaseOK}, false
		}
		st.LastSeen = now
		return st, true
	case PhaseVerifying:
		if present {
			st.LastSeen = now
		}
		if now.Before(st.VerifyAt) {
			return st, false
		}
		if !present {
			st.Phase = PhaseResolved
			st.VerifyAt = time.Time{}
			return st, false
		}
		// Still there after verifyAfter: the attempt failed.
		st.Attempts++
		st.VerifyAt = time.Time{}
		if strings.HasPrefix(st.LastError, interruptedPrefix) {
			st.LastError = interruptedPrefix + "; the finding is still present"
		} else {
			st.LastError = fmt.Sprintf("finding still present %s after acting", t.VerifyAfter)
		}
		if st.Attempts >= max(t.MaxAttempts, 1) {
			st.Phase = PhaseEscalated
			return st, false
		}
		st.Phase = PhaseFailed
		return st, true
	case PhaseEscalated:
		if !present {
			return TargetState{Phase: PhaseOK}, false // clears only when the finding clears
		}
		st.LastSeen = now
		return st, false
	}
	// Unknown phase (a newer state file?): be safe, do not act.
	if !present {
		return TargetState{Phase: PhaseOK}, false
	}
	st.LastSeen = now
	return st, false
}

// ActOutcome is what happened when an action ran.
type ActOutcome struct {
	Err error
}

// Record folds the result of an executed action into the state: success
// moves to Verifying; an error counts an attempt and escalates at
// MaxAttempts.
func Record(st TargetState, o ActOutcome, now time.Time, t Timing) TargetState {
	st.LastActed = now
	if o.Err == nil {
		st.Phase = PhaseVerifying
		st.VerifyAt = now.Add(t.VerifyAfter)
		st.LastError = ""
		return st
	}
	st.Attempts++
	st.LastError = o.Err.Error()
	if st.Attempts >= max(t.MaxAttempts, 1) {
		st.Phase = PhaseEscalated
	} else {
		st.Phase = PhaseFailed
	}
	return st
}
