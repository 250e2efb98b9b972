package detect

import (
	"context"

	"github.com/remediate-dev/remediate/internal/kubeproxy"
	"github.com/remediate-dev/remediate/policy"
)

// KubeProxyNFTablesFailuresParams are the thresholds of
// KubeProxyNFTablesFailures, the nftables-mode counterpart of
// KubeProxyRestoreFailures.
type KubeProxyNFTablesFailuresParams struct {
	// Window over which failures are counted. Default 0: 4 x syncPeriod
	// (a failing kube-proxy retries about once per syncPeriod).
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

// SetDefaults implements registry.Defaulter.
func (p *KubeProxyNFTablesFailuresParams) SetDefaults() {
	*p = KubeProxyNFTablesFailuresParams{MaxCleanupFailures: 2}
}

// Validate implements policy.Validator.
func (p *KubeProxyNFTablesFailuresParams) Validate() []policy.FieldError {
	return nftFailures.validate(p.limits())
}

func (p *KubeProxyNFTablesFailuresParams) limits() failureLimits {
	return failureLimits{window: p.Window.Duration, major: p.MaxSyncFailures, minor: p.MaxCleanupFailures}
}

// nftFailures: nftables sync and stale-chain cleanup failures.
var nftFailures = &failureSpec{
	name: "KubeProxyNFTablesFailures",
	doc:  "kube-proxy's nftables sync and stale-chain cleanup failures over a window exceed a threshold (per IP family, nftables mode)",
	counters: failureCounters{
		get: func(fm *kubeproxy.FamilyMetrics) (*float64, *float64) {
			return fm.NFTablesSyncFailures, fm.NFTablesCleanupFailures
		},
		exported: func(fm *kubeproxy.FamilyMetrics) bool {
			return fm.NFTablesSyncFailures != nil || fm.NFTablesCleanupFailures != nil
		},
		absent: "kube-proxy does not export sync_proxy_rules_nftables_sync_failures_total (not nftables mode?)",
	},
	skip: func(ctx context.Context, kp kubeproxy.Interface) error {
		return skipUnlessMode(ctx, kp, kubeproxy.ModeNFTables, "KubeProxyNFTablesFailures")
	},
	majorParam: "maxSyncFailures", minorParam: "maxCleanupFailures",
	majorKey: "syncFailures", minorKey: "cleanupFailures",
	majorWhat: "nftables sync failures", minorWhat: "cleanup failures",
	majorWhy: "its nftables rules are not being updated (Service changes are not programmed)",
	minorWhy: "stale chains are not being deleted",
	judged:   "no nftables sync or cleanup failure increase over the last %s",
}

func init() { defineFailures[KubeProxyNFTablesFailuresParams](nftFailures) }
