package guardrails

import "time"

// Ledger is what the node guardrails read of the engine's persisted state:
// escalated targets and the action history. The engine's State implements
// it; the guardrails never write it.
type Ledger interface {
	// Escalated says whether the (rule, target) key (Request.Key) is
	// escalated, after how many failed attempts and with which last error.
	Escalated(key string) (attempts int, lastError string, escalated bool)
	// UnknownHistorySince is when the history became unknown (a corrupt
	// state file was quarantined), or the zero time.
	UnknownHistorySince() time.Time
	// Attempts is the recorded action history, oldest first.
	Attempts() []Attempt
}

// Attempt is one recorded action attempt.
type Attempt struct {
	Time   time.Time
	Rule   string
	Target string
	// Changed is false for attempts known not to have changed anything
	// (refused at execution, journal intent not written); pending ones
	// (a crash mid-action) count as changed.
	Changed bool
}

// countSince counts changed attempts at or after since matching keep, and
// returns the oldest such attempt's time.
func countSince(h []Attempt, since time.Time, keep func(Attempt) bool) (int, time.Time) {
	n := 0
	var oldest time.Time
	for i := len(h) - 1; i >= 0 && !h[i].Time.Before(since); i-- {
		if h[i].Changed && keep(h[i]) {
			n++
			oldest = h[i].Time
		}
	}
	return n, oldest
}
