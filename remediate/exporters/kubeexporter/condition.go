package kubeexporter

import (
	"time"

	corev1 "k8s.io/api/core/v1"
)

// ConditionState is the reporter's view of the node condition, with the
// hysteresis timers.
type ConditionState struct {
	// Status is True (healthy), False (a problem persists) or Unknown
	// (never judged).
	Status corev1.ConditionStatus
	Reason string
	// Key names the problems behind a False condition (their rules and
	// targets, not their changing details): a new Key is rewritten at
	// once, a Message that changed under the same Key waits for the
	// heartbeat.
	Key     string
	Message string
	// Transition is when Status last changed.
	Transition time.Time
	// ProblemSince and ClearSince time the current run of cycles with and
	// without a problem (zero while the other run is on).
	ProblemSince time.Time
	ClearSince   time.Time
}

// Hysteresis bounds how fast the condition turns.
type Hysteresis struct {
	// ProblemAfter: a problem must persist this long before the condition
	// turns False.
	ProblemAfter time.Duration
	// ClearAfter: no problem for this long before it turns True again.
	ClearAfter time.Duration
}

// NextCondition is the pure transition: given the previous state, whether
// a problem is seen now (with reason, the key of the problems and the
// message), and now, it returns the new state and whether the condition on
// the Node must be rewritten now (status, reason or the problems changed).
// A message that changed alone (a finding's age, a count) is kept in the
// state and written with the next heartbeat: a persistent problem whose
// message carries a duration would otherwise patch the Node every cycle,
// on every sick node of the fleet at once. A never-judged condition
// becomes True at the first clear cycle (nothing to debounce), False only
// after ProblemAfter.
func NextCondition(prev ConditionState, problem bool, reason, key, message string, now time.Time, h Hysteresis) (ConditionState, bool) {
	s := prev
	if problem {
		s.ClearSince = time.Time{}
		if s.ProblemSince.IsZero() {
			s.ProblemSince = now
		}
		switch {
		case s.Status == corev1.ConditionFalse:
			// Already False: a new reason or other problems now; the
			// message alone rides on the heartbeat.
			write := s.Reason != reason || s.Key != key
			s.Reason, s.Key, s.Message = reason, key, message
			return s, write
		case now.Sub(s.ProblemSince) >= h.ProblemAfter:
			s.Status, s.Reason, s.Key, s.Message, s.Transition = corev1.ConditionFalse, reason, key, message, now
			return s, true
		}
		return s, false
	}
	s.ProblemSince = time.Time{}
	if s.ClearSince.IsZero() {
		s.ClearSince = now
	}
	switch {
	case s.Status == corev1.ConditionTrue:
		return s, false
	case s.Status == corev1.ConditionFalse && now.Sub(s.ClearSince) < h.ClearAfter:
		return s, false
	}
	s.Status, s.Reason, s.Key, s.Message, s.Transition = corev1.ConditionTrue, ReasonHealthy, "", MessageHealthy, now
	return s, true
}

// Reason and message of the healthy condition.
const (
	ReasonHealthy  = "KubeProxyDataplaneHealthy"
	MessageHealthy = "remediate sees no kube-proxy data plane problem on this node"
)
