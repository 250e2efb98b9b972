package detect

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/remediate-dev/remediate/internal/dataplane"
	"github.com/remediate-dev/remediate/internal/finding"
	"github.com/remediate-dev/remediate/internal/kubeproxy"
	"github.com/remediate-dev/remediate/internal/node"
)

func init() {
	Define("DataplaneDrift",
		"a Service port whose programmed entries or backends (iptables rules, kube-proxy's nftables table, IPVS virtual and real servers) differ from what kube-proxy should program from the cluster view, for longer than graceSyncPeriods x syncPeriod since the objects last changed",
		func(p *DataplaneDriftParams, n *node.Node) (Detector, error) {
			return &dataplaneDrift{p: *p, n: n, firstSeen: map[string]time.Time{}}, nil
		}, Targets(finding.KindDataplanePort, finding.KindKubeProxy), UsesClusterView())
	Define("KubeProxyNotHearingAPI",
		"drift older than the grace while kube-proxy has nothing queued: kube-proxy is not receiving API updates (a silently dead watch connection); evidence from its own metrics",
		func(p *DataplaneDriftParams, n *node.Node) (Detector, error) {
			return &kubeProxyDeaf{p: *p, n: n}, nil
		}, Targets(finding.KindKubeProxy), UsesClusterView())
}

type dataplaneDrift struct {
	p DataplaneDriftParams
	n *node.Node

	mu        sync.Mutex
	firstSeen map[string]time.Time
}

func (d *dataplaneDrift) Detect(ctx context.Context) ([]finding.Finding, error) {
	obs, err := observeDataplane(ctx, d.n, d.p)
	if err != nil {
		return nil, err
	}
	var lastSync map[kubeproxy.Family]float64
	if d.n.KubeProxy != nil && obs.kubeProxyErr == nil {
		qctx, cancel := kubeProxyQueryCtx(ctx)
		sc, err := d.n.KubeProxy.Metrics(qctx)
		cancel()
		if err == nil {
			lastSync = map[kubeproxy.Family]float64{}
			for f, fm := range sc.Metrics.Families {
				if fm.LastSync != nil {
					lastSync[f] = *fm.LastSync
				}
			}
		}
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	return driftFindings(obs, d.p, d.n.Clock.Now(), d.firstSeen, lastSync), nil
}

// driftFindings is DataplaneDrift's decision: one finding per Service port
// whose differences are older than the grace, and a warning when
// kube-proxy's /configz syncPeriod differs from the policy's.
func driftFindings(obs *driftObservation, p DataplaneDriftParams, now time.Time, firstSeen map[string]time.Time, lastSync map[kubeproxy.Family]float64) []finding.Finding {
	grace := time.Duration(p.GraceSyncPeriods * float64(obs.syncPeriod))
	var out []finding.Finding
	for _, pd := range oldDrift(obs, grace, now, firstSeen) {
		sev := finding.Warning
		var parts []string
		for _, df := range pd.diffs {
			if df.Problem != dataplane.WrongVerdict || df.Want == dataplane.Forward {
				sev = finding.Critical
			}
			parts = append(parts, describeDiff(df))
		}
		ev := driftEvidence(pd, obs, grace, now)
		if ls, ok := lastSync[kubeproxy.Family(pd.family)]; ok {
			ev["kubeProxyLastSync"] = rfc3339(seconds(ls))
		} else if ls, ok := lastSync[kubeproxy.Unlabelled]; ok {
			ev["kubeProxyLastSync"] = rfc3339(seconds(ls))
		}
		msg := fmt.Sprintf("%s (%s) is not programmed as the cluster says, %s after its last change (grace %s): %s",
			pd.name, pd.family, now.Sub(pd.changed).Round(time.Second), grace, strings.Join(parts, "; "))
		if ls, ok := ev["kubeProxyLastSync"]; ok {
			msg += fmt.Sprintf("; kube-proxy last synced at %s", ls)
		}
		if obs.kubeProxyErr != nil {
			msg += fmt.Sprintf("; kube-proxy does not answer (see KubeProxyUnreachable): %s mode read from the %s", obs.mode, obs.modeSource)
		}
		out = append(out, finding.Finding{Detector: "DataplaneDrift", Target: "dataplane/" + string(pd.family) + "/" + pd.name.String(),
			Severity: sev, Message: msg, Evidence: ev})
	}
	if obs.configzSyncPeriod > 0 && obs.policySyncPeriod > 0 && obs.configzSyncPeriod != obs.policySyncPeriod {
		out = append(out, finding.Finding{Detector: "DataplaneDrift", Target: "kube-proxy/syncPeriod", Severity: finding.Warning,
			Message: fmt.Sprintf("kube-proxy's /configz says syncPeriod %s but the policy says %s: thresholds relative to syncPeriod use %s; fix kubeProxy.syncPeriod in the policy",
				obs.configzSyncPeriod, obs.policySyncPeriod, obs.configzSyncPeriod),
			Evidence: map[string]any{"configzSyncPeriod": obs.configzSyncPeriod.String(), "policySyncPeriod": obs.policySyncPeriod.String()}})
	}
	return out
}

func describeDiff(d dataplane.Diff) string {
	s := fmt.Sprintf("%s %s %s", d.Kind, d.Key, d.Problem)
	switch d.Problem {
	case dataplane.MissingEntry:
		s += fmt.Sprintf(" (want %s", d.Want)
		if len(d.Missing) > 0 {
			s += " to " + addrList(d.Missing, 5)
		}
		s += ")"
	case dataplane.MissingBackends:
		s += " " + addrList(d.Missing, 5)
		// A port can miss some backends and still forward to others
		// that no longer serve (a rollout kube-proxy did not follow,
		// the terminating fallback): name both.
		if len(d.Stale) > 0 {
			s += ", still forwarding to stale " + addrList(d.Stale, 5)
		}
	case dataplane.StaleBackends, dataplane.StaleEntry:
		s += " " + addrList(d.Stale, 5)
	case dataplane.WrongVerdict:
		s += fmt.Sprintf(" (want %s, programmed %s)", d.Want, d.Got)
	}
	return s
}

func addrList[T fmt.Stringer](as []T, max int) string {
	var ss []string
	for i, a := range as {
		if i == max {
			ss = append(ss, fmt.Sprintf("and %d more", len(as)-max))
			break
		}
		ss = append(ss, a.String())
	}
	return "[" + strings.Join(ss, " ") + "]"
}

func driftEvidence(pd portDrift, obs *driftObservation, grace time.Duration, now time.Time) map[string]any {
	var diffs []map[string]any
	for _, d := range pd.diffs {
		m := map[string]any{"kind": string(d.Kind), "entry": d.Key.String(), "problem": string(d.Problem), "want": string(d.Want), "programmed": string(d.Got)}
		if len(d.Missing) > 0 {
			m["missingBackends"] = strs(d.Missing)
		}
		if len(d.Stale) > 0 {
			m["staleBackends"] = strs(d.Stale)
		}
		diffs = append(diffs, m)
	}
	ev := map[string]any{
		"servicePort": pd.name.String(), "family": string(pd.family), "proxyMode": obs.mode, "proxyModeSource": obs.modeSource, "source": pd.source,
		"differences": diffs, "graceSeconds": grace.Seconds(), "syncPeriod": obs.syncPeriod.String(), "syncPeriodSource": obs.syncPeriodSource,
		"changeAgeSeconds": now.Sub(pd.changed).Round(time.Second).Seconds(),
	}
	if obs.kubeProxyErr != nil {
		ev["kubeProxyError"] = obs.kubeProxyErr.Error()
	}
	if pd.port != nil {
		ev["lastChange"] = rfc3339(pd.changed)
		ev["lastChangeSource"] = "API objects' managedFields/creationTimestamp"
		if !pd.port.Created.IsZero() {
			ev["serviceCreated"] = rfc3339(pd.port.Created)
			ev["serviceAgeSeconds"] = now.Sub(pd.port.Created).Round(time.Second).Seconds()
		}
		ev["endpointCount"] = pd.port.Endpoints
	} else {
		ev["firstSeenProgrammedWithoutService"] = rfc3339(pd.changed)
	}
	return ev
}

func strs[T fmt.Stringer](as []T) []string {
	out := make([]string, len(as))
	for i, a := range as {
		out[i] = a.String()
	}
	return out
}

type kubeProxyDeaf struct {
	p DataplaneDriftParams
	n *node.Node

	mu       sync.Mutex
	lastREST *restSample
}

type restSample struct {
	seq    uint64
	at     time.Time
	total  float64
	errors float64
}

func (d *kubeProxyDeaf) Detect(ctx context.Context) ([]finding.Finding, error) {
	if _, err := kubeProxyOf(d.n); err != nil {
		return nil, err
	}
	obs, err := observeDataplane(ctx, d.n, d.p)
	if err != nil {
		return nil, err
	}
	if obs.kubeProxyErr != nil {
		// Deaf is judged from kube-proxy's own metrics (nothing queued);
		// one that does not answer at all is not deaf but frozen or gone:
		// DataplaneDrift names the drift, KubeProxyUnreachable and
		// KubeProxyFrozen the cause.
		return nil, finding.Skip("kube-proxy does not answer (see KubeProxyUnreachable, KubeProxyFrozen; DataplaneDrift names the drift): %v", obs.kubeProxyErr)
	}
	qctx, cancel := kubeProxyQueryCtx(ctx)
	defer cancel()
	_, sc, err := kubeProxyScrape(qctx, d.n)
	if err != nil {
		return nil, err
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	prev := d.lastREST
	if sc.Metrics.RESTRequests != nil && (prev == nil || prev.seq != sc.Seq) {
		d.lastREST = &restSample{seq: sc.Seq, at: sc.At, total: sc.Metrics.RESTTotal(), errors: sc.Metrics.RESTErrors()}
	}
	return deafFindings(obs, d.p, sc.Metrics, prev, d.n.Clock.Now()), nil
}

// deafFindings is KubeProxyNotHearingAPI's decision: Service ports in the
// view whose differences are older than the grace while kube-proxy has
// nothing queued and no change pending. A kube-proxy that had heard of the
// change would have queued a sync (KubeProxySyncStale reports one that does
// not complete); with nothing queued it does not know.
func deafFindings(obs *driftObservation, p DataplaneDriftParams, m *kubeproxy.Metrics, prev *restSample, now time.Time) []finding.Finding {
	grace := time.Duration(p.GraceSyncPeriods * float64(obs.syncPeriod))
	var old []portDrift
	for _, pd := range oldDrift(obs, grace, now, nil) {
		if pd.port != nil { // dated by the API: kube-proxy should have heard
			old = append(old, pd)
		}
	}
	if len(old) == 0 {
		return nil
	}
	if pending := m.EndpointChangesPending; pending != nil && *pending > 0 {
		return nil
	}
	if pending := m.ServiceChangesPending; pending != nil && *pending > 0 {
		return nil
	}
	var families []string
	var lastSync, lastQueued float64
	for _, f := range m.FamilyNames() {
		fm := m.Families[f]
		if fm.LastSync == nil {
			return nil // cannot tell that kube-proxy syncs
		}
		if fm.LastQueued != nil && *fm.LastQueued > *fm.LastSync {
			return nil // work queued: KubeProxySyncStale's case
		}
		families = append(families, string(f))
		if *fm.LastSync > lastSync {
			lastSync = *fm.LastSync
		}
		if fm.LastQueued != nil && *fm.LastQueued > lastQueued {
			lastQueued = *fm.LastQueued
		}
	}
	if len(families) == 0 {
		return nil
	}
	sort.Slice(old, func(i, j int) bool { return old[i].changed.Before(old[j].changed) })
	var names []string
	var ports []map[string]any
	for i, pd := range old {
		if i == p.MaxPortsPerFinding {
			break
		}
		names = append(names, pd.name.String())
		var problems []string
		for _, d := range pd.diffs {
			problems = append(problems, describeDiff(d))
		}
		ports = append(ports, map[string]any{"servicePort": pd.name.String(), "family": string(pd.family), "lastChange": rfc3339(pd.changed),
			"changeAgeSeconds": now.Sub(pd.changed).Round(time.Second).Seconds(), "differences": problems})
	}
	ev := map[string]any{
		"driftedServicePorts": len(old), "servicePorts": ports, "graceSeconds": grace.Seconds(),
		"syncPeriod": obs.syncPeriod.String(), "syncPeriodSource": obs.syncPeriodSource, "proxyMode": obs.mode, "proxyModeSource": obs.modeSource,
		"kubeProxyLastSync": rfc3339(seconds(lastSync)), "kubeProxyFamilies": families,
		"lastQueuedBeforeOldestChange": lastQueued < float64(old[0].changed.Unix()),
	}
	if lastQueued > 0 {
		ev["kubeProxyLastQueued"] = rfc3339(seconds(lastQueued))
	}
	if m.RESTRequests != nil {
		byCode := map[string]float64{}
		for k, v := range m.RESTRequests {
			byCode[k] = v
		}
		ev["restClientRequestsByCode"] = byCode
		ev["restClientErrors"] = m.RESTErrors()
		if prev != nil {
			ev["restClientRequestsDelta"] = m.RESTTotal() - prev.total
			ev["restClientErrorsDelta"] = m.RESTErrors() - prev.errors
			ev["restClientDeltaSince"] = rfc3339(prev.at)
		}
	}
	more := ""
	if len(old) > len(names) {
		more = fmt.Sprintf(" and %d more", len(old)-len(names))
	}
	return []finding.Finding{{
		Detector: "KubeProxyNotHearingAPI",
		Target:   "kube-proxy/api-updates",
		Severity: finding.Critical,
		Message: fmt.Sprintf("kube-proxy is not receiving API updates: %s%s changed more than %s ago and is not programmed, while kube-proxy has nothing queued (last sync %s)",
			strings.Join(names, ", "), more, grace, rfc3339(seconds(lastSync))),
		Evidence: ev,
	}}
}
