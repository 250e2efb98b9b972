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

// KubeProxyNFTablesFailuresParams are the thresholds of
// KubeProxyNFTablesFailures, the nftables-mode counterpart of
// KubeProxyRestoreFailures.
type KubeProxyNFTablesFailuresParams struct {
	// Window over which failures are counted. Default 0: 4 x syncPeriod.
	Window policy.Duration `yaml:"window"`
	// MaxSyncFailures: a critical finding when more nft sync transactions
	// than this fail in the window (default 0: any). A failed transaction
	// changes nothing: the table keeps its previous (now stale) state, or
	// stays missing if someone deleted it.
	MaxSyncFailures int `yaml:"maxSyncFailures"`
	// MaxCleanupFailures: a warning when more stale-chain cleanups than
	// this fail in the window (default 2; stale chains cost memory, not
	// correctness). -1 ignores them.
	MaxCleanupFailures int `yaml:"maxCleanupFailures"`
}

// Validate implements policy.Validator.
func (p *KubeProxyNFTablesFailuresParams) Validate() []policy.FieldError {
	var errs []policy.FieldError
	if p.Window.Duration < 0 {
		errs = append(errs, policy.FieldError{Field: "window", Msg: "must not be negative (0 means 4 x syncPeriod)"})
	}
	if p.MaxSyncFailures < 0 {
		errs = append(errs, policy.FieldError{Field: "maxSyncFailures", Msg: "must not be negative"})
	}
	if p.MaxCleanupFailures < -1 {
		errs = append(errs, policy.FieldError{Field: "maxCleanupFailures", Msg: "must be -1 (ignore) or more"})
	}
	return errs
}

// SetDefaults implements registry.Defaulter.
func (p *KubeProxyNFTablesFailuresParams) SetDefaults() {
	*p = KubeProxyNFTablesFailuresParams{MaxCleanupFailures: 2}
}

func init() {
	Define("KubeProxyNFTablesFailures",
		"kube-proxy's nftables sync and stale-chain cleanup failures over a window exceed a threshold (per IP family, nftables mode)",
		newKubeProxyNFTablesFailures, Targets(finding.KindKubeProxy), Windowed())
}

func newKubeProxyNFTablesFailures(p *KubeProxyNFTablesFailuresParams, n *node.Node) (Detector, error) {
	return &kubeProxyNFTablesFailures{p: *p, n: n}, nil
}

type kubeProxyNFTablesFailures struct {
	p KubeProxyNFTablesFailuresParams
	n *node.Node

	mu sync.Mutex
	w  counterWindows
}

func (d *kubeProxyNFTablesFailures) Detect(ctx context.Context) ([]Finding, error) {
	kp, err := kubeProxyOf(d.n)
	if err != nil {
		return nil, err
	}
	if err := skipUnlessMode(ctx, kp, kubeproxy.ModeNFTables, "KubeProxyNFTablesFailures"); err != nil {
		return nil, err
	}
	sc, err := kubeProxyScrape(ctx, d.n, kp)
	if err != nil {
		return nil, err
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.w.findings(sc, failureWindow(d.p.Window.Duration, kp), nftFailureCounters,
		func(f kubeproxy.Family, syncs, cleanups float64, covered time.Duration) *Finding {
			return nftFailuresFinding(f, syncs, cleanups, covered, d.p)
		})
}

// nftFailureCounters: nftables sync and stale-chain cleanup failures.
var nftFailureCounters = failureCounters{
	get: func(fm *kubeproxy.FamilyMetrics) (*float64, *float64) {
		return fm.NFTablesSyncFailures, fm.NFTablesCleanupFailures
	},
	exported: func(fm *kubeproxy.FamilyMetrics) bool {
		return fm.NFTablesSyncFailures != nil || fm.NFTablesCleanupFailures != nil
	},
	absent: "kube-proxy does not export sync_proxy_rules_nftables_sync_failures_total (not nftables mode?)",
}

// nftFailuresFinding is the decision on the failures counted over a
// window.
func nftFailuresFinding(f kubeproxy.Family, syncs, cleanups float64, covered time.Duration, p KubeProxyNFTablesFailuresParams) *Finding {
	syncBad := syncs > float64(p.MaxSyncFailures)
	cleanupBad := p.MaxCleanupFailures >= 0 && cleanups > float64(p.MaxCleanupFailures)
	if !syncBad && !cleanupBad {
		return nil
	}
	sev, what := Warning, "stale chains are not being deleted"
	if syncBad {
		sev, what = Critical, "its nftables rules are not being updated (Service changes are not programmed)"
	}
	return &Finding{
		Detector: "KubeProxyNFTablesFailures",
		Target:   f.Target(),
		Severity: sev,
		Message: fmt.Sprintf("kube-proxy %s: %g nftables sync failures and %g cleanup failures in the last %s (limits %d, %d): %s",
			f, syncs, cleanups, covered.Round(time.Second), p.MaxSyncFailures, p.MaxCleanupFailures, what),
		Evidence: map[string]any{
			"ipFamily":           string(f),
			"syncFailures":       syncs,
			"cleanupFailures":    cleanups,
			"windowSeconds":      covered.Seconds(),
			"maxSyncFailures":    p.MaxSyncFailures,
			"maxCleanupFailures": p.MaxCleanupFailures,
		},
	}
}
