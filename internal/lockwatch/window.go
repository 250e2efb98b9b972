package lockwatch

import (
	"context"
	"fmt"
	"sort"
	"time"

	"github.com/remediate-dev/remediate/internal/causes"
)

// WindowOf summarises the holds of the last window for the likely causes
// (causes.LockWindow): one LockHolder per holder program (and kube-proxy's
// or not), with its count of holds, longest hold and latest pid, and the
// most waiters seen at once. Unsampled uses (no holder known, well under
// a millisecond) are left out.
func WindowOf(holds []Hold, now time.Time, window time.Duration) *causes.LockWindow {
	out := &causes.LockWindow{Window: window}
	idx := map[HistKey]int{}
	for _, h := range holds {
		if h.Unsampled || !h.End.IsZero() && h.End.Before(now.Add(-window)) {
			continue
		}
		out.Waiters = max(out.Waiters, h.MaxWaiting)
		k := HistKey{Program: h.Program(), KubeProxy: h.KubeProxy()}
		i, ok := idx[k]
		if !ok {
			i = len(out.Holders)
			idx[k] = i
			out.Holders = append(out.Holders, causes.LockHolder{Program: k.Program, KubeProxy: k.KubeProxy})
		}
		lh := &out.Holders[i]
		lh.Holds++
		lh.Longest = max(lh.Longest, h.Duration(now))
		if len(h.Holders) > 0 {
			lh.PID = h.Holders[0].Pid
		} else if len(h.LockPIDs) > 0 {
			lh.PID = h.LockPIDs[0]
		}
	}
	sort.SliceStable(out.Holders, func(i, j int) bool { return out.Holders[i].Longest > out.Holders[j].Longest })
	return out
}

// LockWindow implements causes.LockSource: the holds the watcher measured
// in the last window (or since it started, when that is shorter). It
// starts the watcher if needed; right after the start it has seen nothing
// yet and says so.
func (w *Watcher) LockWindow(_ context.Context, window time.Duration) (*causes.LockWindow, error) {
	if err := w.Start(); err != nil {
		return nil, err
	}
	now := time.Now()
	st := w.Status()
	if st.Samples == 0 {
		return nil, fmt.Errorf("the xtables lock watcher has just started: holds are known from the next cycle")
	}
	if since := now.Sub(st.Since); since < window {
		window = since
	}
	return WindowOf(w.Holds(now.Add(-window)), now, window), nil
}

var _ causes.LockSource = (*Watcher)(nil)
