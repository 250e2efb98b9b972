package remediate

import (
	"github.com/remediate-dev/remediate/policy"
)

// recorder is an Exporter that totals what the engine exported, as the
// /metrics counters do (remediate/exporters/prometheusexporter).
type recorder struct {
	cycles      int
	last        *CycleExport
	clamped     int
	interrupted map[RuleAction]int
}

func (r *recorder) ExportPolicy(*policy.Policy, []string) {}
func (r *recorder) ExportReload(bool)                     {}
func (r *recorder) ExportCycle(x *CycleExport) {
	r.cycles++
	r.last = x
	r.clamped += x.ClockClamped
	if r.interrupted == nil {
		r.interrupted = map[RuleAction]int{}
	}
	for _, ia := range x.Interrupted {
		r.interrupted[ia]++
	}
}

// exported is what the harness's engines exported so far.
func (h *harness) exported() *recorder { return h.opts.Exporters[0].(*recorder) }
