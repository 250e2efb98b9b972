package detect

// Judged is optionally implemented by a Detector that can say, after a run
// with no finding, the one figure it judged: "conntrack 12% of max (max
// 262144)", "last sync 4s ago (syncPeriod 30s)". The report lists the check
// as ok with that figure, so "nothing found" reads differently from
// "nothing looked at". The engine calls Judged right after Detect returned
// no finding and no error, from the same goroutine; it must not block.
type Judged interface {
	Judged() string
}
