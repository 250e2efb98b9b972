package detect

import (
	"fmt"
	"sync"
)

// Judged is optionally implemented by a Detector that can say, after a run
// with no finding, the one figure it judged: "conntrack 12% of max (max
// 262144)", "last sync 4s ago (syncPeriod 30s)". The report lists the check
// as ok with that figure, so "nothing found" reads differently from
// "nothing looked at". The engine calls Judged right after Detect returned
// no finding and no error, from the same goroutine; it must not block.
type Judged interface {
	Judged() string
}

// judgement gives a detector Judged: embed it and call set in Detect once
// the figure is known (reset at the start of each run).
type judgement struct {
	mu sync.Mutex
	s  string
}

func (j *judgement) set(format string, args ...any) {
	j.mu.Lock()
	j.s = fmt.Sprintf(format, args...)
	j.mu.Unlock()
}

// Judged implements Judged.
func (j *judgement) Judged() string {
	j.mu.Lock()
	defer j.mu.Unlock()
	return j.s
}
