package detect

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/remediate-dev/remediate/internal/finding"
	"github.com/remediate-dev/remediate/internal/kubeproxy"
	"github.com/remediate-dev/remediate/internal/node"
	"github.com/remediate-dev/remediate/policy"
)

// KubeProxySyncStaleParams are the thresholds of KubeProxySyncStale.
type KubeProxySyncStaleParams struct {
	// Factor: stale when a sync queued after the last successful one has
	// waited more than Factor x kube-proxy's syncPeriod (default 1).
	// kube-proxy completes a queued sync within minSyncPeriod plus the
	// sync's duration and retries a failed one after syncPeriod, so a sync
	// pending longer than syncPeriod means at least one attempt failed.
	// kube-proxy's own /healthz turns 503 at 2 x syncPeriod
	// (KubeProxyUnhealthy).
	Factor float64 `yaml:"factor"`
	// RequireQueued (default true) judges the age of the pending sync.
	// false judges the age of the last successful sync alone, which is
	// only meaningful where kube-proxy resyncs periodically: in iptables
	// mode (1.28+) an idle kube-proxy does a full sync only hourly, so its
	// last sync is old while it is perfectly healthy.
	RequireQueued bool `yaml:"requireQueued"`
}

// SetDefaults sets the defaults of KubeProxySyncStale (registry.Defaulter).
func (p *KubeProxySyncStaleParams) SetDefaults() {
	*p = KubeProxySyncStaleParams{Factor: 1, RequireQueued: true}
}

// Validate implements policy.Validator.
func (p *KubeProxySyncStaleParams) Validate() []policy.FieldError {
	if p.Factor < 0.1 || p.Factor > 100 {
		return []policy.FieldError{{Field: "factor", Msg: "must be between 0.1 and 100 (times syncPeriod)"}}
	}
	return nil
}

func init() {
	Define("KubeProxySyncStale",
		"a kube-proxy sync queued after the last successful one has not completed for factor x syncPeriod (per IP family)",
		newKubeProxySyncStale, Targets(finding.KindKubeProxy))
}

// pendingSync remembers, for the last successful sync seen, the queued
// timestamp first seen after it: an estimate (never too early) of when the
// pending work was queued. The last_queued gauge alone moves with every new
// change, so it cannot tell how long work has been waiting.
type pendingSync struct {
	lastSync, since float64
}

func newKubeProxySyncStale(p *KubeProxySyncStaleParams, n *node.Node) (Detector, error) {
	return &kubeProxySyncStale{p: *p, n: n,
		pending: map[kubeproxy.Family]pendingSync{}}, nil
}

type kubeProxySyncStale struct {
	p KubeProxySyncStaleParams
	n *node.Node

	mu      sync.Mutex
	pending map[kubeproxy.Family]pendingSync
	judgement
	causes causeWatch
}

func (d *kubeProxySyncStale) Detect(ctx context.Context) ([]finding.Finding, error) {
	kp, sc, err := kubeProxyScrape(ctx, d.n)
	if err != nil {
		return nil, err
	}
	limit := time.Duration(d.p.Factor * float64(kp.SyncPeriod()))
	// Causes are judged over the stale limit, at least 2 x syncPeriod.
	span := max(limit, 2*kp.SyncPeriod())
	d.causes.observe(ctx, d.n, sc, span)
	out := d.findings(sc, limit, kp.SyncPeriod())
	d.causes.attach(ctx, d.n, sc, familyOfTarget, span, out)
	return out, nil
}

// findings tracks the pending syncs of the scrape and decides.
func (d *kubeProxySyncStale) findings(sc *kubeproxy.Scrape, limit, syncPeriod time.Duration) []finding.Finding {
	d.mu.Lock()
	defer d.mu.Unlock()
	since := map[kubeproxy.Family]float64{}
	for f, fm := range sc.Metrics.Families {
		if fm.LastQueued == nil {
			continue
		}
		var last float64
		if fm.LastSync != nil {
			last = *fm.LastSync
		}
		if *fm.LastQueued <= last {
			delete(d.pending, f)
			continue
		}
		p, ok := d.pending[f]
		if !ok || p.lastSync != last {
			p = pendingSync{lastSync: last, since: *fm.LastQueued}
			d.pending[f] = p
		}
		since[f] = p.since
	}
	d.set("%s (limit %s)", lastSyncAges(sc.Metrics.Families, d.n.Clock.Now()), limit)
	return staleSyncFindings(sc.Metrics, since, d.n.Clock.Now(), limit, syncPeriod, d.p.RequireQueued)
}

// staleSyncFindings is the decision. With requireQueued, a family is stale
// when work queued after its last successful sync has been pending (since
// pendingSince[family], else the scrape's last queued time) for more than
// limit. Without, when its last successful sync (or, if it never synced,
// its first queued one) is older than limit.
func staleSyncFindings(m *kubeproxy.Metrics, pendingSince map[kubeproxy.Family]float64, now time.Time, limit, syncPeriod time.Duration, requireQueued bool) []finding.Finding {
	var out []finding.Finding
	for _, f := range m.FamilyNames() {
		fm := m.Families[f]
		var last, queued time.Time
		if fm.LastSync != nil && *fm.LastSync > 0 {
			last = seconds(*fm.LastSync)
		}
		if fm.LastQueued != nil && *fm.LastQueued > 0 {
			queued = seconds(*fm.LastQueued)
		}
		if last.IsZero() && queued.IsZero() {
			continue // no sync information for this family
		}
		pending := !queued.IsZero() && queued.After(last)
		if requireQueued && !pending {
			continue
		}
		waiting := queued
		if s, ok := pendingSince[f]; ok && s > 0 {
			waiting = seconds(s)
		}
		from := waiting
		if !requireQueued && !last.IsZero() {
			from = last
		}
		age := now.Sub(from)
		if age <= limit {
			continue
		}
		ev := map[string]any{
			"ipFamily":          string(f),
			"ageSeconds":        age.Seconds(),
			"limitSeconds":      limit.Seconds(),
			"syncPeriodSeconds": syncPeriod.Seconds(),
			"syncQueued":        pending,
		}
		if !last.IsZero() {
			ev["lastSync"] = rfc3339(last)
		}
		if pending {
			ev["lastQueued"] = rfc3339(queued)
			ev["pendingSince"] = rfc3339(waiting)
		}
		var msg string
		switch {
		case pending && last.IsZero():
			msg = fmt.Sprintf("kube-proxy %s rules never synced; a sync has been pending for %s (limit %s)", f, now.Sub(waiting).Round(time.Second), limit)
		case pending:
			msg = fmt.Sprintf("kube-proxy %s: a sync pending since %s has not completed after %s (limit %s); rules last synced %s ago",
				f, rfc3339(waiting), now.Sub(waiting).Round(100*time.Millisecond), limit, now.Sub(last).Round(time.Second))
		default:
			msg = fmt.Sprintf("kube-proxy %s rules last synced %s ago (limit %s)", f, age.Round(time.Second), limit)
		}
		out = append(out, finding.Finding{
			Detector: "KubeProxySyncStale",
			Target:   f.Target(),
			Severity: finding.Critical,
			Message:  msg,
			Evidence: ev,
			Subject:  finding.Subject{AgeSeconds: age.Seconds()},
		})
	}
	return out
}
