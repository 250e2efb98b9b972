package detect

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/remediate-dev/remediate/internal/finding"
	"github.com/remediate-dev/remediate/internal/kubeproxy"
	"github.com/remediate-dev/remediate/internal/nftables"
	"github.com/remediate-dev/remediate/internal/node"
	"github.com/remediate-dev/remediate/policy"
)

// KubeProxyNFTablesIntegrityParams configure KubeProxyNFTablesIntegrity.
type KubeProxyNFTablesIntegrityParams struct {
	// ProxyMode is kube-proxy's mode: "auto" (default) asks kube-proxy's
	// /proxyMode each cycle and skips when it cannot answer; "nftables"
	// trusts the policy.
	ProxyMode string `yaml:"proxyMode"`
	// Families kube-proxy serves (IPv4, IPv6). Empty (default): the
	// families kube-proxy's metrics show a completed sync for (1.33+),
	// else IPv4 (older versions do not label families).
	Families []string `yaml:"families"`
}

func (p *KubeProxyNFTablesIntegrityParams) mode() NFTablesModeParams {
	return NFTablesModeParams{ProxyMode: p.ProxyMode, Families: p.Families}
}

// Validate implements policy.Validator.
func (p *KubeProxyNFTablesIntegrityParams) Validate() []policy.FieldError { return p.mode().validate() }

// SetDefaults implements registry.Defaulter.
func (p *KubeProxyNFTablesIntegrityParams) SetDefaults() {
	*p = KubeProxyNFTablesIntegrityParams{ProxyMode: "auto"}
}

func init() {
	Define("KubeProxyNFTablesIntegrity",
		"kube-proxy's nftables table (ip/ip6 kube-proxy) missing for a family it serves, its base chains off their hooks/priorities, or nat-prerouting/nat-output not jumping to services (nftables mode)",
		newKubeProxyNFTablesIntegrity, Targets(finding.KindNFTablesTable))
}

func newKubeProxyNFTablesIntegrity(p *KubeProxyNFTablesIntegrityParams, n *node.Node) (Detector, error) {
	return &kubeProxyNFTablesIntegrity{p: *p, n: n}, nil
}

type kubeProxyNFTablesIntegrity struct {
	p KubeProxyNFTablesIntegrityParams
	n *node.Node
}

func (d *kubeProxyNFTablesIntegrity) Detect(ctx context.Context) ([]finding.Finding, error) {
	mode, modeSource, err := kubeProxyMode(ctx, d.n, d.p.ProxyMode)
	if err != nil {
		return nil, err
	}
	if mode != kubeproxy.ModeNFTables {
		return nil, finding.Skip("kube-proxy runs in %s mode (%s); KubeProxyNFTablesIntegrity applies to nftables mode only", mode, modeSource)
	}
	fams, famSource, err := servedFamilies(ctx, d.n, d.p.mode())
	if err != nil {
		return nil, err
	}
	if len(fams) == 0 {
		return nil, finding.Skip("kube-proxy has not completed a sync yet: no family to check")
	}
	s, err := listRuleset(ctx, d.n)
	if err != nil {
		return nil, err
	}
	out := nftIntegrityFindings(s.Ruleset, fams)
	for i := range out {
		out[i].Evidence["familiesSource"] = famSource
		out[i].Evidence["proxyModeSource"] = modeSource
		out[i].Evidence["listedAt"] = s.At.UTC().Format(time.RFC3339)
		out[i].Evidence["nftVersion"] = s.Ruleset.NFTVersion
	}
	return out, nil
}

// kube-proxy's nat base chains: the Service dataplane. Their priorities
// (dstnat -100, srcnat 100) have not changed since nftables mode appeared;
// the filter chains' have, so those are checked for hook and type only.
var kubeProxyNATChains = []struct {
	name, hook string
	priority   int
	jump       string
	critical   bool
}{
	{nftables.KubeProxyNATPrerouting, "prerouting", -100, nftables.KubeProxyServicesChain, true},
	{nftables.KubeProxyNATOutput, "output", -100, nftables.KubeProxyServicesChain, true},
	{nftables.KubeProxyNATPostrouting, "postrouting", 100, "masquerading", false},
}

// kubeProxyTableProblems checks one kube-proxy table. critical problems
// break the family's Service dataplane; warnings degrade it.
func kubeProxyTableProblems(t *nftables.Table) (critical, warnings []string) {
	for _, want := range kubeProxyNATChains {
		add := func(format string, args ...any) {
			if want.critical {
				critical = append(critical, fmt.Sprintf(format, args...))
			} else {
				warnings = append(warnings, fmt.Sprintf(format, args...))
			}
		}
		c := t.Chain(want.name)
		switch {
		case c == nil:
			add("base chain %s is missing", want.name)
			continue
		case c.Hook == nil:
			add("%s is not a base chain (not attached to the %s hook)", want.name, want.hook)
			continue
		case c.Hook.Type != "nat" || c.Hook.Hook != want.hook:
			add("%s is a %s chain on hook %s, want nat on %s", want.name, c.Hook.Type, c.Hook.Hook, want.hook)
		}
		if c.Hook.Priority != want.priority {
			warnings = append(warnings, fmt.Sprintf("%s has priority %d, want %d", want.name, c.Hook.Priority, want.priority))
		}
		if !c.JumpsTo(want.jump) {
			add("%s does not jump to %s", want.name, want.jump)
		}
	}
	for _, c := range t.Chains {
		if c.Hook == nil {
			continue
		}
		if c.Hook.Policy != "accept" {
			critical = append(critical, fmt.Sprintf("base chain %s has policy %s (kube-proxy sets accept): it refuses every packet no rule accepts", c.Name, c.Hook.Policy))
		}
		if typ, hook, ok := strings.Cut(c.Name, "-"); ok && typ == "filter" {
			hook, _, _ = strings.Cut(hook, "-")
			if c.Hook.Type != "filter" || c.Hook.Hook != hook {
				warnings = append(warnings, fmt.Sprintf("%s is a %s chain on hook %s, want filter on %s", c.Name, c.Hook.Type, c.Hook.Hook, hook))
			}
		}
	}
	for _, hook := range []string{"input", "forward", "output"} {
		found := false
		for _, c := range t.Chains {
			if c.Hook != nil && c.Hook.Type == "filter" && c.Hook.Hook == hook {
				found = true
			}
		}
		if !found {
			warnings = append(warnings, fmt.Sprintf("no filter base chain on hook %s: traffic to Services without endpoints is not rejected", hook))
		}
	}
	svc := t.Chain(nftables.KubeProxyServicesChain)
	switch {
	case svc == nil:
		critical = append(critical, "chain services is missing")
	case t.Set(nftables.KubeProxyServiceIPsMap) == nil:
		critical = append(critical, "map service-ips is missing")
	default:
		uses := false
		for _, r := range svc.Rules {
			if r.VMap != nil && r.VMap.Map == nftables.KubeProxyServiceIPsMap {
				uses = true
			}
		}
		if !uses {
			critical = append(critical, "chain services does not look up @service-ips")
		}
	}
	if k, err := nftables.ParseKubeProxy(t); err == nil {
		for _, m := range k.Missing {
			if m != nftables.KubeProxyServiceIPsMap {
				warnings = append(warnings, fmt.Sprintf("set or map %s is missing", m))
			}
		}
	}
	return critical, warnings
}

// nftIntegrityFindings is the decision: one finding per served family whose
// kube-proxy table is missing or damaged.
func nftIntegrityFindings(rs *nftables.Ruleset, fams []kubeproxy.Family) []finding.Finding {
	var out []finding.Finding
	for _, f := range fams {
		nf := nftFamily(f)
		cmd := fmt.Sprintf("nft list table %s %s", nf, nftables.KubeProxyTableName)
		ev := map[string]any{"ipFamily": string(f), "family": string(nf), "table": nftables.KubeProxyTableName, "confirm": cmd}
		t := rs.Table(nf, nftables.KubeProxyTableName)
		if t == nil {
			var present []string
			for _, o := range rs.Tables {
				present = append(present, string(o.Family)+" "+o.Name)
			}
			ev["tablesPresent"] = present
			out = append(out, finding.Finding{
				Detector: "KubeProxyNFTablesIntegrity",
				Target:   nftTarget(nf, nftables.KubeProxyTableName),
				Severity: finding.Critical,
				Message: fmt.Sprintf("kube-proxy runs in nftables mode and serves %s, but table %s %s is missing: every %s Service on this node is unreachable (deleted by a firewall reload or `nft flush ruleset`?); kube-proxy rebuilds it only on a full sync (restart)",
					f, nf, nftables.KubeProxyTableName, f),
				Evidence: ev,
			})
			continue
		}
		critical, warnings := kubeProxyTableProblems(t)
		if len(critical)+len(warnings) == 0 {
			continue
		}
		sev := finding.Warning
		if len(critical) > 0 {
			sev = finding.Critical
		}
		ev["critical"], ev["warnings"] = critical, warnings
		out = append(out, finding.Finding{
			Detector: "KubeProxyNFTablesIntegrity",
			Target:   nftTarget(nf, nftables.KubeProxyTableName),
			Severity: sev,
			Message:  fmt.Sprintf("kube-proxy's table %s %s is damaged: %s", nf, nftables.KubeProxyTableName, strings.Join(append(critical, warnings...), "; ")),
			Evidence: ev,
		})
	}
	return out
}
