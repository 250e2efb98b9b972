package detect

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/remediate-dev/remediate/internal/finding"
	"github.com/remediate-dev/remediate/internal/node"
	"github.com/remediate-dev/remediate/internal/procs"
)

// Judging progress, not age: a process is hung only when it used no CPU
// time (utime+stime of /proc/<pid>/stat, readable without ptrace) over the
// window and was not running (state R) at either read. kube-proxy's nft
// at tens of thousands of Services runs for minutes, busy
// (kubernetes/kubernetes#135639, #139513): old, not hung.
//
// The window is from the reading remembered at the last cycle (the
// interval, 30 s by default) to now. A process seen for the first time
// (the daemon's first cycle with it, or --once) is read again
// progressProbe later: a process waiting on a lock or stuck in the kernel
// uses no CPU at all, and a busy one (an nft or restore working through a
// large rule set uses a whole CPU) shows ticks within a second. A
// process that uses less than a tick (10 ms) in that second is judged by
// it all the same, and the next cycle judges it again over the interval
// (before any kill, KillProcess re-reads its CPU time).

// progressProbe is how long after a first read a process with no reading
// remembered is read again (a variable: tests shorten it).
var progressProbe = time.Second

// progress is a process's CPU time over a window.
type progress struct {
	// cur is the latest read of the process.
	cur procs.Process
	// used is the CPU time used over window; how says which window
	// ("since the last cycle", "over a second read").
	used   uint64
	window time.Duration
	how    string
	// running: state R at either read.
	running bool
}

// advancing reports whether the process made progress over the window.
func (pr progress) advancing() bool { return pr.used > 0 || pr.running }

// String is "1.20 s of CPU in 30 s (since the last cycle)".
func (pr progress) String() string {
	s := fmt.Sprintf("%.2f s of CPU in %s (%s)", float64(pr.used)/procs.TicksPerSecond, pr.window.Round(10*time.Millisecond), pr.how)
	if pr.running {
		s += ", running (state R)"
	}
	return s
}

// evidence records the progress in ev and returns the typed subject
// facts KillProcess re-checks.
func (pr progress) evidence(ev map[string]any, sp *finding.Process) {
	ev["cpuSeconds"] = float64(pr.cur.CPUTicks) / procs.TicksPerSecond
	ev["cpuSecondsInWindow"] = float64(pr.used) / procs.TicksPerSecond
	ev["progressWindowSeconds"] = durSeconds(pr.window)
	ev["progressWindow"] = pr.how
	ev["progress"] = pr.String()
	if sp != nil {
		sp.ProgressChecked = true
		sp.CPUTicks = pr.cur.CPUTicks
		sp.ProgressWindowSeconds = durSeconds(pr.window)
	}
}

// cpuReading is what the watch remembers of a process.
type cpuReading struct {
	ticks uint64
	at    time.Time
}

// progressWatch remembers each process's CPU time across a detector's
// cycles.
type progressWatch struct {
	mu   sync.Mutex
	seen map[procs.Ref]cpuReading
}

// judge returns the progress of each process of ps (read this cycle),
// reading again after progressProbe those with no reading remembered, and
// remembers the latest reading of each (forgetting the processes not in
// ps). A process that exited or whose PID was reused meanwhile is left
// out.
func (w *progressWatch) judge(ctx context.Context, n *node.Node, ps []procs.Process) ([]progress, error) {
	now := n.Clock.Now()
	w.mu.Lock()
	prev := w.seen
	w.mu.Unlock()
	out := make([]progress, 0, len(ps))
	var probe []int
	for _, p := range ps {
		pr := progress{cur: p, running: p.State == "R"}
		if r, ok := prev[p.Ref()]; ok && now.After(r.at) {
			pr.window, pr.how = now.Sub(r.at), "since the last cycle"
			if p.CPUTicks > r.ticks {
				pr.used = p.CPUTicks - r.ticks
			}
		} else {
			probe = append(probe, len(out))
		}
		out = append(out, pr)
	}
	if len(probe) > 0 {
		start := time.Now()
		wait := progressProbe
		if dl, ok := ctx.Deadline(); ok {
			// Within the detector's deadline: half of what is left.
			wait = min(wait, time.Until(dl)/2)
		}
		t := time.NewTimer(max(wait, 0))
		select {
		case <-ctx.Done():
			t.Stop()
			return nil, fmt.Errorf("reading CPU time again: %w", ctx.Err())
		case <-t.C:
		}
		took := time.Since(start)
		for _, i := range probe {
			first := out[i].cur
			cur, err := n.Procs.Get(ctx, first.Pid)
			if errors.Is(err, procs.ErrNotFound) || err == nil && cur.CreateTimeMs != first.CreateTimeMs {
				out[i].cur.Pid = 0 // gone
				continue
			}
			if err != nil {
				return nil, fmt.Errorf("reading pid %d's CPU time again: %w", first.Pid, err)
			}
			out[i].cur, out[i].window, out[i].how = cur, took, "over a second read"
			out[i].running = out[i].running || cur.State == "R"
			if cur.CPUTicks > first.CPUTicks {
				out[i].used = cur.CPUTicks - first.CPUTicks
			}
		}
	}
	seen := make(map[procs.Ref]cpuReading, len(out))
	kept := out[:0]
	for _, pr := range out {
		if pr.cur.Pid == 0 {
			continue
		}
		seen[pr.cur.Ref()] = cpuReading{ticks: pr.cur.CPUTicks, at: now}
		kept = append(kept, pr)
	}
	w.mu.Lock()
	w.seen = seen
	w.mu.Unlock()
	return kept, nil
}

// forget drops every remembered reading (no process to watch).
func (w *progressWatch) forget() {
	w.mu.Lock()
	w.seen = nil
	w.mu.Unlock()
}

// splitBusy names the processes of judged that made progress ("pid 12:
// 1.20 s of CPU in 30 s (since the last cycle)"): old, not hung; and
// returns the latest read of the others.
func splitBusy(judged []progress) (busy []string, stalled []procs.Process) {
	for _, pr := range judged {
		if pr.advancing() {
			busy = append(busy, fmt.Sprintf("pid %d: %s", pr.cur.Pid, pr))
			continue
		}
		stalled = append(stalled, pr.cur)
	}
	return busy, stalled
}
