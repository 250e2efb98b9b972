package detect

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/remediate-dev/remediate/internal/finding"
	"github.com/remediate-dev/remediate/internal/kubeproxy"
	"github.com/remediate-dev/remediate/internal/lockwatch"
)

// kpFailures is kube-proxy's restore-failure counters at one cycle.
type kpFailures struct {
	at       time.Time
	failures map[kubeproxy.Family]float64
}

// maxKPSamples bounds the kube-proxy samples kept (one per cycle).
const maxKPSamples = 64

// holderGroup is one holder (program, kube-proxy's or not, pod) of the
// repeated holds.
type holderGroup struct {
	Program   string  `json:"program"`
	KubeProxy bool    `json:"kubeProxy"`
	PodUID    string  `json:"podUID,omitempty"`
	Container string  `json:"container,omitempty"`
	PIDs      []int32 `json:"pids"`
	Count     int     `json:"count"`
	Longest   float64 `json:"longestSeconds"`
}

// repeated reports more than RepeatMax holds of at least RepeatHold in the
// last RepeatWindow, as the watcher measured them, naming the holders,
// their count and longest hold, and kube-proxy's restore failures and
// queued sync in the window. It also returns the judged figure.
func (d *xtablesLock) repeated(ctx context.Context, watch lockwatch.Reader, now time.Time) (*finding.Finding, string) {
	win := d.p.RepeatWindow.Duration
	var long []lockwatch.Hold
	all := watch.Holds(now.Add(-win))
	top := -1
	for i, h := range all {
		if h.Duration(now) >= d.p.RepeatHold.Duration {
			long = append(long, h)
		}
		if top < 0 || h.Duration(now) > all[top].Duration(now) {
			top = i
		}
	}
	// kube-proxy's counters are sampled while the lock is in use (a quiet
	// node costs no scrape here).
	var kpText string
	var kpEv map[string]any
	if len(all) > 0 {
		kpText, kpEv = d.kubeProxyWindow(ctx, now, win)
	}
	judged := fmt.Sprintf("; %d holds ≥ %s in the last %s (at most %d)", len(long), d.p.RepeatHold.Duration, win, d.p.RepeatMax)
	if top >= 0 {
		judged += fmt.Sprintf(", %d holds in all, longest %.1fs by %s", len(all), all[top].Duration(now).Seconds(), all[top].Program())
	}
	if st := watch.Status(); st.Err != "" {
		judged += "; lock watcher: " + st.Err
	}
	if len(long) <= d.p.RepeatMax {
		return nil, judged
	}
	groups := map[string]*holderGroup{}
	type waiterGroup struct {
		pids    map[int32]bool
		longest time.Duration
	}
	waiters := map[string]*waiterGroup{}
	var longest time.Duration
	atLeast := false
	for _, h := range long {
		var p lockwatch.Proc
		if len(h.Holders) > 0 {
			p = h.Holders[0]
		}
		prog := h.Program()
		k := fmt.Sprintf("%s|%v|%s", prog, h.KubeProxy(), p.PodUID)
		g := groups[k]
		if g == nil {
			g = &holderGroup{Program: prog, KubeProxy: h.KubeProxy(), PodUID: p.PodUID, Container: p.Container}
			groups[k] = g
		}
		g.Count++
		if p.Pid != 0 && len(g.PIDs) < 8 && !containsPID(g.PIDs, p.Pid) {
			g.PIDs = append(g.PIDs, p.Pid)
		}
		dur := h.Duration(now)
		if s := durSeconds(dur); s > g.Longest {
			g.Longest = s
		}
		if dur > longest {
			longest = dur
		}
		atLeast = atLeast || !h.Exact
		for _, w := range h.Waiters {
			prog := w.Program
			if prog == "" {
				prog = lockwatch.Unknown
			}
			wg := waiters[prog]
			if wg == nil {
				if len(waiters) >= 10 {
					continue
				}
				wg = &waiterGroup{pids: map[int32]bool{}}
				waiters[prog] = wg
			}
			if len(wg.pids) < 1000 {
				wg.pids[w.Pid] = true
			}
			wg.longest = max(wg.longest, w.Until.Sub(w.Since))
		}
	}
	var waiterNames []string
	waiterEv := map[string]int{}
	for prog, wg := range waiters {
		waiterEv[prog] = len(wg.pids)
		waiterNames = append(waiterNames, fmt.Sprintf("%s ×%d (longest seen waiting %.1fs)", prog, len(wg.pids), wg.longest.Seconds()))
	}
	sort.Strings(waiterNames)
	list := make([]holderGroup, 0, len(groups))
	for _, g := range groups {
		list = append(list, *g)
	}
	sort.Slice(list, func(i, j int) bool {
		if list[i].Count != list[j].Count {
			return list[i].Count > list[j].Count
		}
		return list[i].Program < list[j].Program
	})
	if len(list) > 10 {
		list = list[:10]
	}
	var names []string
	for _, g := range list {
		s := fmt.Sprintf("%s ×%d (longest %.1fs", g.Program, g.Count, g.Longest)
		if g.KubeProxy {
			s += ", kube-proxy's"
		}
		if len(g.PIDs) > 0 {
			s += fmt.Sprintf(", pid %d", g.PIDs[len(g.PIDs)-1])
		}
		if g.PodUID != "" {
			s += ", pod " + g.PodUID
		}
		names = append(names, s+")")
	}
	recent := make([]map[string]any, 0, 20)
	for i := max(0, len(long)-20); i < len(long); i++ {
		h := long[i]
		recent = append(recent, map[string]any{
			"start": h.Start.UTC().Format(time.RFC3339Nano), "seconds": durSeconds(h.Duration(now)), "exact": h.Exact,
			"program": h.Program(), "kubeProxy": h.KubeProxy(), "holders": h.Holders, "waiters": h.Waiters, "maxWaiting": h.MaxWaiting,
		})
	}
	msg := fmt.Sprintf("xtables lock %s held %d times for ≥ %s in the last %s (more than %d): %s",
		d.n.XtablesLock, len(long), d.p.RepeatHold.Duration, win, d.p.RepeatMax, strings.Join(names, ", "))
	if len(waiterNames) > 0 {
		msg += "; waiting meanwhile: " + strings.Join(waiterNames, ", ")
	}
	if kpText != "" {
		msg += "; kube-proxy in that window: " + kpText
	}
	ev := map[string]any{
		"xtablesLock":    d.n.XtablesLock,
		"holds":          len(long),
		"repeatHold":     d.p.RepeatHold.Duration.String(),
		"windowSeconds":  durSeconds(win),
		"longestSeconds": durSeconds(longest),
		"someStartsLate": atLeast,
		"holders":        list,
		"recentHolds":    recent,
		"waiters":        waiterEv,
	}
	for k, v := range kpEv {
		ev[k] = v
	}
	return &finding.Finding{Detector: "XtablesLockContention", Target: repeatedHolds, Severity: finding.Warning, Message: msg, Evidence: ev}, judged
}

func containsPID(ps []int32, p int32) bool {
	for _, x := range ps {
		if x == p {
			return true
		}
	}
	return false
}

// kubeProxyWindow records kube-proxy's restore-failure counters at this
// cycle (the scrape is shared with the kube-proxy detectors) and says how
// much they rose in the window and whether a sync is queued and not done.
func (d *xtablesLock) kubeProxyWindow(ctx context.Context, now time.Time, win time.Duration) (string, map[string]any) {
	if d.n.KubeProxy == nil {
		return "", nil
	}
	// The kube-proxy detectors' last scrape (a lock detector never waits
	// on kube-proxy); an adapter without one is asked (the fake).
	var sc *kubeproxy.Scrape
	if ls, ok := d.n.KubeProxy.(interface{ LastScrape() *kubeproxy.Scrape }); ok {
		sc = ls.LastScrape()
	} else {
		qctx, cancel := kubeProxyQueryCtx(ctx)
		if s, err := d.n.KubeProxy.Metrics(qctx); err == nil {
			sc = s
		}
		cancel()
	}
	if sc == nil || sc.Metrics == nil {
		return "", nil
	}
	cur := kpFailures{at: sc.At, failures: map[kubeproxy.Family]float64{}}
	if sc.At.IsZero() {
		cur.at = now
	}
	for f, fm := range sc.Metrics.Families {
		v := 0.0
		if fm.RestoreFailures != nil {
			v += *fm.RestoreFailures
		}
		if fm.PartialRestoreFailures != nil {
			v += *fm.PartialRestoreFailures
		}
		cur.failures[f] = v
	}
	d.mu.Lock()
	if n := len(d.kp); n == 0 || !d.kp[n-1].at.Equal(cur.at) { // a new scrape
		d.kp = append(d.kp, cur)
	}
	for len(d.kp) > 1 && (now.Sub(d.kp[0].at) > win || len(d.kp) > maxKPSamples) {
		d.kp = d.kp[1:]
	}
	first := d.kp[0]
	d.mu.Unlock()

	var parts []string
	ev := map[string]any{}
	fams := sc.Metrics.FamilyNames()
	for _, f := range fams {
		fm := sc.Metrics.Families[f]
		if v, ok := cur.failures[f]; ok && first.at.Before(now) {
			delta := v - first.failures[f]
			if delta < 0 { // restarted
				delta = v
			}
			ev["kubeProxyRestoreFailures"+string(f)] = delta
			parts = append(parts, fmt.Sprintf("%s %g restore failures in %s", f, delta, now.Sub(first.at).Round(time.Second)))
		}
		if fm.LastQueued != nil && fm.LastSync != nil && *fm.LastQueued > *fm.LastSync {
			q := now.Sub(time.Unix(0, int64(*fm.LastQueued*1e9)))
			ev["kubeProxyQueuedSeconds"+string(f)] = durSeconds(q)
			parts = append(parts, fmt.Sprintf("%s a sync queued %s ago not done", f, q.Round(time.Second)))
		}
	}
	return strings.Join(parts, ", "), ev
}
