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

// KubeProxyRestoreFailuresParams are the thresholds of
// KubeProxyRestoreFailures.
type KubeProxyRestoreFailuresParams struct {
	// Window over which failures are counted. Default 0: 4 x syncPeriod
	// (a failing kube-proxy retries about once per syncPeriod).
	Window policy.Duration `yaml:"window"`
	// MaxFailures: a finding when more full iptables-restore failures than
	// this happen in the window (default 0: any). A failed full restore
	// leaves the rules as they were.
	MaxFailures int `yaml:"maxFailures"`
	// MaxPartialFailures: a finding when more partial-restore failures than
	// this happen in the window (default 2; kube-proxy falls back to a full
	// restore after one, so a few are tolerable). -1 ignores them.
	MaxPartialFailures int `yaml:"maxPartialFailures"`
}

// SetDefaults sets the defaults of KubeProxyRestoreFailures (registry.Defaulter).
func (p *KubeProxyRestoreFailuresParams) SetDefaults() {
	*p = KubeProxyRestoreFailuresParams{MaxPartialFailures: 2}
}

// Validate implements policy.Validator.
func (p *KubeProxyRestoreFailuresParams) Validate() []policy.FieldError {
	var errs []policy.FieldError
	if p.Window.Duration < 0 {
		errs = append(errs, policy.FieldError{Field: "window", Msg: "must not be negative (0 means 4 x syncPeriod)"})
	}
	if p.MaxFailures < 0 {
		errs = append(errs, policy.FieldError{Field: "maxFailures", Msg: "must not be negative"})
	}
	if p.MaxPartialFailures < -1 {
		errs = append(errs, policy.FieldError{Field: "maxPartialFailures", Msg: "must be -1 (ignore) or more"})
	}
	return errs
}

func init() {
	Define("KubeProxyRestoreFailures",
		"kube-proxy's iptables-restore (and partial restore) failures over a window exceed a threshold (per IP family)",
		newKubeProxyRestoreFailures, Targets(finding.KindKubeProxy), Windowed())
}

func newKubeProxyRestoreFailures(p *KubeProxyRestoreFailuresParams, n *node.Node) (Detector, error) {
	return &kubeProxyRestoreFailures{p: *p, n: n}, nil
}

type kubeProxyRestoreFailures struct {
	p KubeProxyRestoreFailuresParams
	n *node.Node

	mu sync.Mutex
	w  counterWindows
	judgement
}

func (d *kubeProxyRestoreFailures) Detect(ctx context.Context) ([]Finding, error) {
	kp, err := kubeProxyOf(d.n)
	if err != nil {
		return nil, err
	}
	// iptables and ipvs modes run iptables-restore (ipvs for its helper
	// chains); nftables mode does not.
	if mode, err := kp.ProxyMode(ctx); err == nil && mode != kubeproxy.ModeIPTables && mode != kubeproxy.ModeIPVS {
		return nil, Skip("kube-proxy runs in %s mode, which does not use iptables-restore", mode)
	}
	sc, err := kubeProxyScrape(ctx, d.n, kp)
	if err != nil {
		return nil, err
	}
	span := failureWindow(d.p.Window.Duration, kp)
	d.mu.Lock()
	defer d.mu.Unlock()
	out, err := d.w.findings(sc, span, restoreFailureCounters,
		func(f kubeproxy.Family, full, partial float64, covered time.Duration) *Finding {
			return restoreFailuresFinding(f, full, partial, covered, d.p)
		})
	if err == nil {
		d.set("no iptables-restore failure increase over the last %s", span)
	}
	return out, err
}

// restoreFailureCounters: iptables-restore full and partial failures. Only
// the full-failure series marks the counters as exported.
var restoreFailureCounters = failureCounters{
	get: func(fm *kubeproxy.FamilyMetrics) (*float64, *float64) {
		return fm.RestoreFailures, fm.PartialRestoreFailures
	},
	exported: func(fm *kubeproxy.FamilyMetrics) bool { return fm.RestoreFailures != nil },
	absent:   "kube-proxy does not export sync_proxy_rules_iptables_restore_failures_total (not iptables mode?)",
}

// restoreFailuresFinding is the decision on the failures counted over a
// window.
func restoreFailuresFinding(f kubeproxy.Family, full, partial float64, covered time.Duration, p KubeProxyRestoreFailuresParams) *Finding {
	fullBad := full > float64(p.MaxFailures)
	partialBad := p.MaxPartialFailures >= 0 && partial > float64(p.MaxPartialFailures)
	if !fullBad && !partialBad {
		return nil
	}
	sev := Warning
	if fullBad {
		sev = Critical
	}
	return &Finding{
		Detector: "KubeProxyRestoreFailures",
		Target:   f.Target(),
		Severity: sev,
		Message: fmt.Sprintf("kube-proxy %s: %g iptables-restore failures and %g partial-restore failures in the last %s (limits %d, %d)",
			f, full, partial, covered.Round(time.Second), p.MaxFailures, p.MaxPartialFailures),
		Evidence: map[string]any{
			"ipFamily":           string(f),
			"failures":           full,
			"partialFailures":    partial,
			"windowSeconds":      covered.Seconds(),
			"maxFailures":        p.MaxFailures,
			"maxPartialFailures": p.MaxPartialFailures,
		},
	}
}
