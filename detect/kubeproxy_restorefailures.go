package detect

import (
	"context"

	"github.com/remediate-dev/remediate/internal/finding"
	"github.com/remediate-dev/remediate/internal/kubeproxy"
	"github.com/remediate-dev/remediate/policy"
)

// KubeProxyRestoreFailuresParams are the thresholds of
// KubeProxyRestoreFailures.
type KubeProxyRestoreFailuresParams struct {
	// Window over which failures are counted. Default 0: 4 x syncPeriod
	// (a failing kube-proxy retries about once per syncPeriod).
	Window policy.Duration `yaml:"window"`
	// MaxFailures: a critical finding when more full iptables-restore
	// failures than this happen in the window (default 0: any). A failed
	// full restore leaves the rules as they were.
	MaxFailures int `yaml:"maxFailures"`
	// MaxPartialFailures: a warning when more partial-restore failures than
	// this happen in the window (default 2; kube-proxy falls back to a full
	// restore after one, so a few are tolerable). -1 ignores them.
	MaxPartialFailures int `yaml:"maxPartialFailures"`
}

// SetDefaults implements registry.Defaulter.
func (p *KubeProxyRestoreFailuresParams) SetDefaults() {
	*p = KubeProxyRestoreFailuresParams{MaxPartialFailures: 2}
}

// Validate implements policy.Validator.
func (p *KubeProxyRestoreFailuresParams) Validate() []policy.FieldError {
	return restoreFailures.validate(p.limits())
}

func (p *KubeProxyRestoreFailuresParams) limits() failureLimits {
	return failureLimits{window: p.Window.Duration, major: p.MaxFailures, minor: p.MaxPartialFailures}
}

// restoreFailures: iptables-restore full and partial failures. Only the
// full-failure series marks the counters as exported.
var restoreFailures = &failureSpec{
	name: "KubeProxyRestoreFailures",
	doc:  "kube-proxy's iptables-restore (and partial restore) failures over a window exceed a threshold (per IP family)",
	counters: failureCounters{
		get: func(fm *kubeproxy.FamilyMetrics) (*float64, *float64) {
			return fm.RestoreFailures, fm.PartialRestoreFailures
		},
		exported: func(fm *kubeproxy.FamilyMetrics) bool { return fm.RestoreFailures != nil },
		absent:   "kube-proxy does not export sync_proxy_rules_iptables_restore_failures_total (not iptables mode?)",
	},
	// iptables and ipvs modes run iptables-restore (ipvs for its helper
	// chains); nftables mode does not.
	skip: func(ctx context.Context, kp kubeproxy.Interface) error {
		if mode, err := kp.ProxyMode(ctx); err == nil && mode != kubeproxy.ModeIPTables && mode != kubeproxy.ModeIPVS {
			return finding.Skip("kube-proxy runs in %s mode, which does not use iptables-restore", mode)
		}
		return nil
	},
	majorParam: "maxFailures", minorParam: "maxPartialFailures",
	majorKey: "failures", minorKey: "partialFailures",
	majorWhat: "iptables-restore failures", minorWhat: "partial-restore failures",
	judged:    "no iptables-restore failure increase over the last %s",
	logCauses: true,
}

func init() { defineFailures[KubeProxyRestoreFailuresParams](restoreFailures) }
