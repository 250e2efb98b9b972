package detect

import (
	"context"
	"fmt"
	"strings"

	"github.com/remediate-dev/remediate/internal/finding"
	"github.com/remediate-dev/remediate/internal/kubeproxy"
	"github.com/remediate-dev/remediate/internal/node"
	"github.com/remediate-dev/remediate/policy"
)

// KubeProxyRuleBloatParams are the thresholds of KubeProxyRuleBloat.
type KubeProxyRuleBloatParams struct {
	// Table is the iptables table counted (default "nat", where the
	// per-service and per-endpoint rules live).
	Table string `yaml:"table"`
	// MaxRules: a finding when kube-proxy owns more rules than this in
	// Table (default 100000; every full iptables-restore rewrites them
	// all, so syncs slow down as the count grows).
	MaxRules int `yaml:"maxRules"`
}

// SetDefaults sets the defaults of KubeProxyRuleBloat (registry.Defaulter).
func (p *KubeProxyRuleBloatParams) SetDefaults() {
	*p = KubeProxyRuleBloatParams{Table: "nat", MaxRules: 100000}
}

// Validate implements policy.Validator.
func (p *KubeProxyRuleBloatParams) Validate() []policy.FieldError {
	var errs []policy.FieldError
	switch p.Table {
	case "nat", "filter", "mangle", "raw":
	default:
		errs = append(errs, policy.FieldError{Field: "table", Msg: "must be nat, filter, mangle or raw"})
	}
	if p.MaxRules < 1 {
		errs = append(errs, policy.FieldError{Field: "maxRules", Msg: "must be at least 1"})
	}
	return errs
}

func init() {
	Define("KubeProxyRuleBloat",
		"kube-proxy owns more iptables rules in a table (sync_proxy_rules_iptables_total) than a limit (per IP family, iptables mode)",
		newKubeProxyRuleBloat, Targets(finding.KindKubeProxy))
}

type kubeProxyRuleBloat struct {
	p KubeProxyRuleBloatParams
	n *node.Node
	judgement
}

func newKubeProxyRuleBloat(p *KubeProxyRuleBloatParams, n *node.Node) (Detector, error) {
	return &kubeProxyRuleBloat{p: *p, n: n}, nil
}

func (d *kubeProxyRuleBloat) Detect(ctx context.Context) ([]finding.Finding, error) {
	kp, err := kubeProxyOf(d.n)
	if err != nil {
		return nil, err
	}
	if err := skipUnlessMode(ctx, kp, kubeproxy.ModeIPTables, "KubeProxyRuleBloat"); err != nil {
		return nil, err
	}
	_, sc, err := kubeProxyScrape(ctx, d.n)
	if err != nil {
		return nil, err
	}
	out, exported := ruleBloatFindings(sc.Metrics, d.p)
	d.set("%s", ruleCounts(sc.Metrics, d.p))
	if !exported {
		return nil, finding.Skip("kube-proxy does not export sync_proxy_rules_iptables_total{table=%q} (not iptables mode, or no sync yet)", d.p.Table)
	}
	return out, nil
}

// ruleBloatFindings is the decision; exported is false when no family has
// the series.
func ruleBloatFindings(m *kubeproxy.Metrics, p KubeProxyRuleBloatParams) (out []finding.Finding, exported bool) {
	for _, f := range m.FamilyNames() {
		n, ok := m.Families[f].RulesTotal[p.Table]
		if !ok {
			continue
		}
		exported = true
		if n <= float64(p.MaxRules) {
			continue
		}
		out = append(out, finding.Finding{
			Detector: "KubeProxyRuleBloat",
			Target:   f.Target(),
			Severity: finding.Warning,
			Message:  fmt.Sprintf("kube-proxy %s owns %g rules in the %s table (limit %d)", f, n, p.Table, p.MaxRules),
			Evidence: map[string]any{"ipFamily": string(f), "table": p.Table, "rules": n, "maxRules": p.MaxRules},
		})
	}
	return out, exported
}

// ruleCounts is "IPv4 1200 nat rules, IPv6 800 (limit 100000)".
func ruleCounts(m *kubeproxy.Metrics, p KubeProxyRuleBloatParams) string {
	var parts []string
	for _, f := range m.FamilyNames() {
		if n, ok := m.Families[f].RulesTotal[p.Table]; ok {
			parts = append(parts, fmt.Sprintf("%s %g", f, n))
		}
	}
	return fmt.Sprintf("%s rules in the %s table (limit %d)", strings.Join(parts, ", "), p.Table, p.MaxRules)
}
