package detect

import (
	"context"
	"fmt"
	"sort"
	"strings"

	"github.com/remediate-dev/remediate/internal/finding"
	"github.com/remediate-dev/remediate/internal/kubeproxy"
	"github.com/remediate-dev/remediate/internal/nftables"
	"github.com/remediate-dev/remediate/internal/node"
	"github.com/remediate-dev/remediate/policy"
)

// NFTablesShadowingParams configure NFTablesShadowing.
type NFTablesShadowingParams struct {
	// ProxyMode is kube-proxy's mode: "auto" (default) asks kube-proxy's
	// /proxyMode each cycle and skips when it cannot answer; "nftables"
	// trusts the policy.
	ProxyMode string `yaml:"proxyMode"`
	// Families kube-proxy serves (IPv4, IPv6). Empty (default): the
	// families kube-proxy's metrics show a completed sync for (1.33+),
	// else IPv4.
	Families []string `yaml:"families"`
}

func (p *NFTablesShadowingParams) mode() NFTablesModeParams {
	return NFTablesModeParams{ProxyMode: p.ProxyMode, Families: p.Families}
}

// Validate implements policy.Validator.
func (p *NFTablesShadowingParams) Validate() []policy.FieldError { return p.mode().validate() }

// SetDefaults implements registry.Defaulter.
func (p *NFTablesShadowingParams) SetDefaults() { *p = NFTablesShadowingParams{ProxyMode: "auto"} }

func init() {
	Define("NFTablesShadowing",
		"another nftables table's base chain on one of kube-proxy's hooks, at an earlier priority, with a drop policy or an unconditional drop/reject (a host firewall shadowing Services; nftables mode)",
		newNFTablesShadowing, Targets(finding.KindNFTablesChain))
}

func newNFTablesShadowing(p *NFTablesShadowingParams, n *node.Node) (Detector, error) {
	return &nftablesShadowing{p: *p, n: n}, nil
}

type nftablesShadowing struct {
	p NFTablesShadowingParams
	n *node.Node
}

func (d *nftablesShadowing) Detect(ctx context.Context) ([]finding.Finding, error) {
	mode, modeSource, err := kubeProxyMode(ctx, d.n, d.p.ProxyMode)
	if err != nil {
		return nil, err
	}
	if mode != kubeproxy.ModeNFTables {
		return nil, finding.Skip("kube-proxy runs in %s mode (%s); NFTablesShadowing applies to nftables mode only", mode, modeSource)
	}
	fams, _, err := servedFamilies(ctx, d.n, d.p.mode())
	if err != nil {
		return nil, err
	}
	s, err := listRuleset(ctx, d.n)
	if err != nil {
		return nil, blindSkip(err)
	}
	return shadowingFindings(s.Ruleset, fams), nil
}

// shadowHooks are the hooks kube-proxy's Service traffic passes, with the
// priority kube-proxy's chains use there when its table is missing (its
// nat chains at dstnat, its filter chains at filter).
var shadowHooks = map[string]int{"prerouting": -100, "output": 0, "input": 0, "forward": 0}

// shadowingFindings is the decision: for each served family, every base
// chain of another table that sees that family's packets, sits on one of
// kube-proxy's hooks at a priority before kube-proxy's last chain there,
// and refuses packets (policy drop, or a drop/reject rule without a
// condition).
func shadowingFindings(rs *nftables.Ruleset, fams []kubeproxy.Family) []finding.Finding {
	seen := map[string]bool{}
	var out []finding.Finding
	for _, f := range fams {
		nf := nftFamily(f)
		kpTable := rs.Table(nf, nftables.KubeProxyTableName)
		for _, c := range rs.BaseChains() {
			if c.Table == nftables.KubeProxyTableName && (c.Family == nftables.FamilyIP || c.Family == nftables.FamilyIP6) {
				continue
			}
			if (f == "IPv4" && !c.Family.CoversIPv4()) || (f == "IPv6" && !c.Family.CoversIPv6()) {
				continue
			}
			def, ok := shadowHooks[c.Hook.Hook]
			if !ok {
				continue
			}
			ref, refChain := def, ""
			if kpTable != nil {
				first := true
				for _, k := range kpTable.Chains {
					if k.Hook != nil && k.Hook.Hook == c.Hook.Hook && (first || k.Hook.Priority > ref) {
						ref, refChain, first = k.Hook.Priority, k.Name, false
					}
				}
			}
			if c.Hook.Priority >= ref {
				continue
			}
			var drops []string
			accepts := 0
			for _, r := range c.Rules {
				if r.UnconditionalRefusal() {
					drops = append(drops, r.Text)
				}
				if r.Verdict != nil && r.Verdict.Kind == nftables.Accept {
					accepts++
				}
			}
			if c.Hook.Policy != "drop" && len(drops) == 0 {
				continue
			}
			target := nftTarget(c.Family, c.Table) + "/" + c.Name
			if seen[target] {
				continue
			}
			seen[target] = true
			why := "has policy drop: it drops every packet none of its rules accepts"
			if len(drops) > 0 {
				why = fmt.Sprintf("drops every packet reaching its rule %q", drops[0])
			}
			before := fmt.Sprintf("kube-proxy's %s (priority %d)", refChain, ref)
			if refChain == "" {
				before = fmt.Sprintf("where kube-proxy's chain belongs (priority %d; its table %s %s is missing)", ref, nf, nftables.KubeProxyTableName)
			}
			ev := map[string]any{
				"table": c.Table, "chain": c.Name, "family": string(c.Family), "hook": c.Hook.Hook, "type": c.Hook.Type,
				"priority": c.Hook.Priority, "policy": c.Hook.Policy, "kubeProxyChain": refChain, "kubeProxyPriority": ref,
				"acceptRules": accepts, "unconditionalRefusals": drops, "ipFamilies": coveredFamilies(c.Family, fams),
				"confirm": fmt.Sprintf("nft list chain %s %s %s", c.Family, c.Table, c.Name),
			}
			out = append(out, finding.Finding{
				Detector: "NFTablesShadowing",
				Target:   target,
				Severity: finding.Warning,
				Message: fmt.Sprintf("table %s %s, chain %s (%s hook %s priority %d) runs before %s and %s: %s Service traffic may be dropped before kube-proxy handles it",
					c.Family, c.Table, c.Name, c.Hook.Type, c.Hook.Hook, c.Hook.Priority, before, why, strings.Join(coveredFamilies(c.Family, fams), "/")),
				Evidence: ev,
			})
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Target < out[j].Target })
	return out
}

// coveredFamilies lists the served families a table family sees.
func coveredFamilies(f nftables.Family, fams []kubeproxy.Family) []string {
	var out []string
	for _, k := range fams {
		if (k == "IPv4" && f.CoversIPv4()) || (k == "IPv6" && f.CoversIPv6()) {
			out = append(out, string(k))
		}
	}
	return out
}
