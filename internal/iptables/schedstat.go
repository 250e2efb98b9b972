package iptables

import (
	"strconv"
	"strings"
	"time"

	"github.com/remediate-dev/remediate/internal/boundedfile"
	"github.com/remediate-dev/remediate/internal/procs"
)

// schedStat is a process's /proc/PID/schedstat: time on a CPU and time
// waiting on a run queue for one (Documentation/scheduler/sched-stats;
// the wait in progress is added only when the process runs again, so
// runDelay is a lower bound), and its state from /proc/PID/stat.
type schedStat struct {
	cpu, runDelay time.Duration
	ok            bool
	// runnable: state R (on a CPU or waiting for one), not sleeping or
	// blocked in the kernel.
	runnable bool
}

// starved reports whether a process that ran for wall spent it waiting
// for a CPU rather than on one or blocked: half of it counted as run-queue
// wait, or runnable now with less than a quarter of it on a CPU.
func (s schedStat) starved(wall time.Duration) bool {
	return s.ok && wall > 0 && (s.runDelay >= wall/2 || (s.runnable && s.cpu < wall/4))
}

// readSchedStat reads the schedstat and state of pid, a child of this
// process (so in this process's /proc). ok is false when the schedstat
// cannot be read or parsed.
func readSchedStat(pid int) schedStat {
	dir := "/proc/" + strconv.Itoa(pid)
	b, err := boundedfile.Read(dir+"/schedstat", 256)
	if err != nil {
		return schedStat{}
	}
	st := parseSchedStat(string(b))
	if b, err := boundedfile.Read(dir+"/stat", 4096); err == nil {
		state, err := procs.StatState(b)
		st.runnable = err == nil && state == "R"
	}
	return st
}

// parseSchedStat parses "cpu_ns run_delay_ns timeslices".
func parseSchedStat(s string) schedStat {
	f := strings.Fields(s)
	if len(f) < 2 {
		return schedStat{}
	}
	cpu, err1 := strconv.ParseUint(f[0], 10, 63)
	wait, err2 := strconv.ParseUint(f[1], 10, 63)
	if err1 != nil || err2 != nil {
		return schedStat{}
	}
	return schedStat{cpu: time.Duration(cpu), runDelay: time.Duration(wait), ok: true}
}
