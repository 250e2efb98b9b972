package detect

import (
	"context"
	"fmt"
	"time"

	"github.com/remediate-dev/remediate/internal/kubeproxy"
	"github.com/remediate-dev/remediate/internal/node"
	"github.com/remediate-dev/remediate/policy"
)

// KubeProxySyncStaleParams are the thresholds of KubeProxySyncStale.
type KubeProxySyncStaleParams struct {
	// Factor: stale when the last successful sync is older than Factor x
	// kube-proxy's syncPeriod (default 2, kube-proxy's own health timeout).
	Factor float64 `yaml:"factor"`
	// RequireQueued (default true) also requires a sync queued after the
	// last successful one, i.e. work waiting that never completed. false
	// flags any sync older than the limit.
	RequireQueued bool `yaml:"requireQueued"`
}

// Validate implements policy.Validator.
func (p *KubeProxySyncStaleParams) Validate() []policy.FieldError {
	if p.Factor < 1 || p.Factor > 100 {
		return []policy.FieldError{{Field: "factor", Msg: "must be between 1 and 100 (times syncPeriod)"}}
	}
	return nil
}

func init() {
	Register(Type{
		Name:      "KubeProxySyncStale",
		Doc:       "kube-proxy has not completed a sync for factor x syncPeriod although one is queued (per IP family)",
		NewParams: func() any { return &KubeProxySyncStaleParams{Factor: 2, RequireQueued: true} },
		New: func(params any, n *node.Node) (Detector, error) {
			return &kubeProxySyncStale{p: *params.(*KubeProxySyncStaleParams), n: n}, nil
		},
	})
}

type kubeProxySyncStale struct {
	p KubeProxySyncStaleParams
	n *node.Node
}

func (d *kubeProxySyncStale) Detect(ctx context.Context) ([]Finding, error) {
	kp, err := kubeProxyOf(d.n)
	if err != nil {
		return nil, err
	}
	sc, err := kubeProxyScrape(ctx, kp)
	if err != nil {
		return nil, err
	}
	limit := time.Duration(d.p.Factor * float64(kp.SyncPeriod()))
	return staleSyncFindings(sc.Metrics, d.n.Clock.Now(), limit, kp.SyncPeriod(), d.p.RequireQueued), nil
}

// staleSyncFindings is the decision: one finding per family whose last
// successful sync is older than limit (and, with requireQueued, has a sync
// queued after it). A family that never synced counts from its first queued
// sync.
func staleSyncFindings(m *kubeproxy.Metrics, now time.Time, limit, syncPeriod time.Duration, requireQueued bool) []Finding {
	var out []Finding
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
		since := last
		if since.IsZero() {
			since = queued // never synced: waiting since the first queued sync
		}
		age := now.Sub(since)
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
		if !queued.IsZero() {
			ev["lastQueued"] = rfc3339(queued)
		}
		msg := fmt.Sprintf("kube-proxy %s rules last synced %s ago (limit %s)", f, age.Round(time.Second), limit)
		if last.IsZero() {
			msg = fmt.Sprintf("kube-proxy %s rules never synced; a sync has been queued for %s (limit %s)", f, age.Round(time.Second), limit)
		}
		if pending {
			msg += fmt.Sprintf("; a sync queued at %s has not completed", rfc3339(queued))
		}
		out = append(out, Finding{
			Detector: "KubeProxySyncStale",
			Target:   f.Target(),
			Severity: Critical,
			Message:  msg,
			Evidence: ev,
		})
	}
	return out
}
