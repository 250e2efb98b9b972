package detect

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/remediate-dev/remediate/internal/finding"
	"github.com/remediate-dev/remediate/internal/iptables"
	"github.com/remediate-dev/remediate/internal/kubeproxy"
)

// IPTablesRules' flush check: kube-proxy runs in iptables (or IPVS) mode
// and has programmed the family, but no backend has its nat KUBE-SERVICES
// chain. That is a flushed firewall (rancher/rke2#10469: firewalld's
// reload with FlushAllOnReload; `iptables -F; iptables -X` by hand): until
// kube-proxy notices through its canary chain and resyncs, no Service
// works on the node, and the hostPort DNAT rules the CNI portmap plugin
// wrote when each pod's sandbox was created stay gone for good. Before
// this check such a node looked kube-proxy-free (no KUBE-* chain, nothing
// to check) and the detector said nothing.

// flushTarget is the finding's target for a family: one per family,
// whatever the backends.
func flushTarget(f iptables.Family) string { return "iptables/" + string(f) + "/kube-chains-absent" }

// chainsAbsence is what the check remembers per family across cycles:
// whether it has seen kube-proxy's KUBE-SERVICES chain, and since when it
// has been absent.
type chainsAbsence struct {
	mu    sync.Mutex
	seen  map[iptables.Family]bool
	since map[iptables.Family]time.Time
}

// observe records this cycle's presence of the chain in fam and returns
// whether it was ever seen before and since when it is absent (zero when
// present).
func (a *chainsAbsence) observe(fam iptables.Family, present bool, now time.Time) (seenBefore bool, since time.Time) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.seen == nil {
		a.seen, a.since = map[iptables.Family]bool{}, map[iptables.Family]time.Time{}
	}
	seenBefore = a.seen[fam]
	if present {
		a.seen[fam] = true
		delete(a.since, fam)
		return seenBefore, time.Time{}
	}
	s, ok := a.since[fam]
	if !ok || now.Before(s) {
		s = now
		a.since[fam] = s
	}
	return seenBefore, s
}

// chainsAbsent returns the critical finding of fam when kube-proxy's
// chains are absent from every backend saved this cycle (complete: no
// save failed or timed out, a backend not installed counts as saved and
// empty) while kube-proxy itself says (/proxyMode) it runs in iptables
// or IPVS mode, and either its own metrics show it has programmed the
// family (sync_proxy_rules_last_timestamp_seconds) or this detector saw
// the chain before. A mode known only from the policy, or unknown, is
// never judged: a node without kube-proxy, or whose kube-proxy was
// removed, is never reported.
func (d *iptablesRules) chainsAbsent(ctx context.Context, fam iptables.Family, snaps map[iptables.Backend]*iptables.Snapshot, complete bool, mode proxyMode, now time.Time) *finding.Finding {
	present := false
	var backends []string
	for be, s := range snaps {
		backends = append(backends, string(be))
		if s.Rules.Table("nat").Chain("KUBE-SERVICES") != nil {
			present = true
		}
	}
	sort.Strings(backends)
	if len(snaps) == 0 || (!present && !complete) {
		return nil // nothing to judge this cycle: keep what was remembered
	}
	seenBefore, since := d.absence.observe(fam, present, now)
	if present || (mode.mode != "iptables" && mode.mode != "ipvs") {
		return nil
	}
	fromKubeProxy := strings.HasPrefix(mode.note, "from kube-proxy")
	if !fromKubeProxy {
		// Only kube-proxy saying, now, that it programs iptables makes
		// absent chains a flush: a mode from the policy also fits a node
		// whose kube-proxy was removed (and cleaned up after itself).
		return nil
	}
	var lastSync *float64
	if fromKubeProxy && d.n.KubeProxy != nil {
		if sc, err := d.n.KubeProxy.Metrics(ctx); err == nil && sc != nil && sc.Metrics != nil {
			fm := sc.Metrics.Families[kubeproxy.Family(fam)]
			if fm == nil {
				fm = sc.Metrics.Families[kubeproxy.Unlabelled]
			}
			if fm != nil && fm.LastSync != nil && *fm.LastSync > 0 {
				lastSync = fm.LastSync
			}
		}
	}
	if !seenBefore && lastSync == nil {
		return nil
	}
	absent := now.Sub(since)
	ev := map[string]any{
		"family":          string(fam),
		"backendsSaved":   backends,
		"proxyMode":       mode.mode,
		"proxyModeSource": mode.note,
		"absentSince":     since.UTC().Format(time.RFC3339),
		"absentSeconds":   durSeconds(absent),
		"seenBefore":      seenBefore,
	}
	why := "this detector saw them before"
	if lastSync != nil {
		t := time.Unix(int64(*lastSync), 0).UTC()
		ev["kubeProxyLastSync"] = t.Format(time.RFC3339)
		why = "kube-proxy last programmed " + string(fam) + " at " + t.Format(time.RFC3339)
		if seenBefore {
			why += ", and this detector saw them before"
		}
	}
	return &finding.Finding{
		Detector: "IPTablesRules",
		Target:   flushTarget(fam),
		Severity: finding.Critical,
		Message: fmt.Sprintf("kube-proxy runs in %s mode (%s) but no backend has its nat KUBE-SERVICES chain (%s, saved: %s), absent for %s; %s: "+
			"the node's firewall was flushed (a firewall reload such as firewalld's FlushAllOnReload, or iptables -F/-X): no Service works here until kube-proxy resyncs, "+
			"and the hostPort DNAT rules of the CNI portmap plugin stay gone until their pods' sandboxes are recreated",
			mode.mode, mode.note, fam, strings.Join(backends, ", "), absent.Round(time.Second), why),
		Evidence: ev,
	}
}
