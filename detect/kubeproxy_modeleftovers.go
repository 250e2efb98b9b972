package detect

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/hashicorp/go-multierror"

	"github.com/remediate-dev/remediate/internal/finding"
	"github.com/remediate-dev/remediate/internal/iptables"
	"github.com/remediate-dev/remediate/internal/kubeproxy"
	"github.com/remediate-dev/remediate/internal/nftables"
	"github.com/remediate-dev/remediate/internal/node"
	"github.com/remediate-dev/remediate/policy"
)

// KubeProxyModeLeftoversParams configure KubeProxyModeLeftovers.
type KubeProxyModeLeftoversParams struct {
	// ProxyMode is kube-proxy's mode: "auto" (default) asks kube-proxy's
	// /proxyMode each cycle and skips when it cannot answer; iptables,
	// ipvs or nftables trust the policy.
	ProxyMode string `yaml:"proxyMode"`
	// Backends are the iptables backends searched for KUBE-* rules in
	// nftables mode and for iptables mode's rules in IPVS mode (default
	// both: kube-proxy cleans only the backend its own iptables binary
	// uses when it starts in nftables mode).
	Backends []string `yaml:"backends"`
	// SaveTimeout bounds each iptables save.
	SaveTimeout policy.Duration `yaml:"saveTimeout"`
	// ServiceCIDRs are the Service (and external/load-balancer) ranges:
	// in iptables and nftables modes an IPVS virtual server inside them,
	// or on a Service IP of the cluster view, is a leftover of IPVS mode;
	// others (keepalived, another balancer) are not. Default the kubeadm
	// Service CIDR 10.96.0.0/12.
	ServiceCIDRs []string `yaml:"serviceCIDRs"`
}

// Validate implements policy.Validator.
func (p *KubeProxyModeLeftoversParams) Validate() []policy.FieldError {
	var errs []policy.FieldError
	errs = append(errs, validateOneOf("proxyMode", p.ProxyMode, "auto", "iptables", "ipvs", "nftables")...)
	errs = append(errs, validateBackends(p.Backends)...)
	errs = append(errs, validateSaveTimeout(p.SaveTimeout)...)
	_, e := ipvsParsePrefixes("serviceCIDRs", p.ServiceCIDRs)
	return append(errs, e...)
}

// SetDefaults implements registry.Defaulter.
func (p *KubeProxyModeLeftoversParams) SetDefaults() {
	*p = KubeProxyModeLeftoversParams{ProxyMode: "auto", Backends: []string{"legacy", "nft"}, SaveTimeout: policy.D(8 * time.Second),
		ServiceCIDRs: []string{"10.96.0.0/12"}}
}

func init() {
	Define("KubeProxyModeLeftovers",
		"rules of another kube-proxy mode left after a mode switch: KUBE-* iptables rules (either backend) while kube-proxy runs in nftables mode, iptables mode's chains and REJECT rules while it runs in IPVS mode, its nftables table while it runs in iptables/ipvs mode, IPVS virtual servers on Service addresses and kube-ipvs0 while it runs in iptables/nftables mode",
		newKubeProxyModeLeftovers, Targets(finding.KindIPTablesRules, finding.KindNFTablesTable, finding.KindIPVSLeftovers))
}

func newKubeProxyModeLeftovers(p *KubeProxyModeLeftoversParams, n *node.Node) (Detector, error) {
	cidrs, errs := ipvsParsePrefixes("serviceCIDRs", p.ServiceCIDRs)
	if len(errs) > 0 {
		return nil, fmt.Errorf("%s: %s", errs[0].Field, errs[0].Msg)
	}
	return &kubeProxyModeLeftovers{p: *p, n: n, serviceCIDRs: cidrs}, nil
}

type kubeProxyModeLeftovers struct {
	p            KubeProxyModeLeftoversParams
	n            *node.Node
	serviceCIDRs []netip.Prefix
	judgement
}

func (d *kubeProxyModeLeftovers) Detect(ctx context.Context) ([]finding.Finding, error) {
	var (
		mode   kubeproxy.Mode
		source string
		err    error
	)
	if d.p.ProxyMode == "auto" {
		mode, source, err = kubeProxyMode(ctx, d.n, "auto")
		if err != nil {
			return nil, err
		}
	} else {
		mode, source = kubeproxy.Mode(d.p.ProxyMode), "from the policy"
	}
	var (
		out []finding.Finding
		ran bool // a part looked (whatever it found)
	)
	switch mode {
	case kubeproxy.ModeNFTables:
		out, err = d.iptablesLeftovers(ctx, source)
		ran = err == nil
	case kubeproxy.ModeIPTables, kubeproxy.ModeIPVS:
		var rs *nftables.Ruleset
		if rs, err = d.kubeProxyTables(ctx); err == nil {
			out, ran = nftLeftoverFindings(rs, mode, source), true
		}
		if mode == kubeproxy.ModeIPVS {
			// iptables mode's chains beside IPVS mode's (#102314).
			snaps, serr := d.saves(ctx)
			if serr == nil {
				out, ran = append(out, iptablesModeFindings(snaps, source)...), true
			}
			err = joinLeftoverErrs(ran, err, serr)
		}
	default:
		return nil, finding.Skip("kube-proxy runs in %s mode (%s): no mode-switch leftovers to look for", mode, source)
	}
	if mode == kubeproxy.ModeIPTables || mode == kubeproxy.ModeNFTables {
		// IPVS mode's virtual servers and kube-ipvs0. IPVS that cannot
		// be read (no privilege, netlink error) is said in the judgement
		// and does not hide the other part's answer.
		f, why, ierr := d.ipvsLeftovers(ctx, mode, source)
		if f != nil {
			out, ran = append(out, *f), true
		}
		if ierr != nil {
			why = "not read: " + ierr.Error()
		}
		d.set("kube-proxy runs in %s mode (%s); IPVS leftovers: %s", mode, source, why)
	} else {
		d.set("kube-proxy runs in %s mode (%s)", mode, source)
	}
	return out, joinLeftoverErrs(ran, err)
}

// joinLeftoverErrs combines the errors of the parts of one look: a part
// that could not run (a skip) does not hide what another part looked at
// (ran) or found; a real error is returned.
func joinLeftoverErrs(ran bool, errs ...error) error {
	var skips []string
	for _, e := range errs {
		if e == nil {
			continue
		}
		reason, ok := finding.IsSkip(e)
		if !ok {
			return e
		}
		skips = append(skips, reason)
	}
	if len(skips) == 0 || ran {
		return nil
	}
	return finding.Skip("%s", strings.Join(skips, "; "))
}

// kubeProxyTables lists only kube-proxy's two tables: in iptables mode
// with the nft backend the rest of the ruleset is iptables-nft's, which can
// be very large.
func (d *kubeProxyModeLeftovers) kubeProxyTables(ctx context.Context) (*nftables.Ruleset, error) {
	nft, err := nftOf(d.n)
	if err != nil {
		return nil, err
	}
	rs := &nftables.Ruleset{}
	for _, f := range []nftables.Family{nftables.FamilyIP, nftables.FamilyIP6} {
		s, err := nft.ListTable(ctx, f, nftables.KubeProxyTableName)
		switch {
		case errors.Is(err, nftables.ErrNoTable):
			continue
		case isUnavailable(err):
			return nil, finding.Skip("%v", err)
		case err != nil:
			return nil, fmt.Errorf("listing nftables table %s %s: %w", f, nftables.KubeProxyTableName, err)
		}
		rs.Tables = append(rs.Tables, s.Ruleset.Tables...)
		rs.NFTVersion = s.Ruleset.NFTVersion
	}
	return rs, nil
}

func (d *kubeProxyModeLeftovers) iptablesLeftovers(ctx context.Context, source string) ([]finding.Finding, error) {
	snaps, err := d.saves(ctx)
	if err != nil {
		return nil, err
	}
	out := iptablesLeftoverFindings(snaps)
	for i := range out {
		out[i].Evidence["proxyModeSource"] = source
	}
	return out, nil
}

// saves runs one save per family and backend of the policy, in parallel.
func (d *kubeProxyModeLeftovers) saves(ctx context.Context) ([]*iptables.Snapshot, error) {
	if d.n.IPTables == nil {
		return nil, finding.Skip("%s", d.n.Why("iptables"))
	}
	type res struct {
		snap *iptables.Snapshot
		err  error
	}
	results := map[string]*res{}
	var wg sync.WaitGroup
	for _, f := range []iptables.Family{iptables.IPv4, iptables.IPv6} {
		for _, b := range d.p.Backends {
			r := &res{}
			results[string(f)+"/"+b] = r
			wg.Add(1)
			go func(f iptables.Family, b iptables.Backend) {
				defer wg.Done()
				sctx, cancel := context.WithTimeout(ctx, d.p.SaveTimeout.Duration)
				defer cancel()
				r.snap, r.err = d.n.IPTables.Save(sctx, f, b)
			}(f, iptables.Backend(b))
		}
	}
	wg.Wait()
	var (
		snaps       []*iptables.Snapshot
		errs        *multierror.Error
		unavailable []string
	)
	keys := make([]string, 0, len(results))
	for k := range results {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		r := results[k]
		switch {
		case errors.Is(r.err, iptables.ErrUnavailable):
			unavailable = append(unavailable, k)
		case r.err != nil:
			errs = multierror.Append(errs, r.err)
		default:
			snaps = append(snaps, r.snap)
		}
	}
	if err := errs.ErrorOrNil(); err != nil {
		return nil, fmt.Errorf("saving iptables rules: %w", err)
	}
	if len(snaps) == 0 {
		return nil, finding.Skip("no iptables save command available (%s)", strings.Join(unavailable, ", "))
	}
	return snaps, nil
}

// kubeletChains are KUBE-* chains kubelet (not kube-proxy) creates; they
// are not kube-proxy leftovers.
var kubeletChains = map[string]bool{
	"KUBE-FIREWALL": true, "KUBE-MARK-DROP": true, "KUBE-KUBELET-CANARY": true, "KUBE-IPTABLES-HINT": true,
}

func isKubeProxyChain(name string) bool { return iptables.IsKube(name) && !kubeletChains[name] }

// iptablesLeftoverFindings is the decision in nftables mode: one finding per
// family and backend holding kube-proxy's KUBE-* rules (rules in its chains
// or jumping to them).
func iptablesLeftoverFindings(snaps []*iptables.Snapshot) []finding.Finding {
	var out []finding.Finding
	for _, s := range snaps {
		rules, chains := 0, map[string]bool{}
		var dataplane []string
		for _, t := range s.Rules.Tables {
			for _, c := range t.Chains {
				if isKubeProxyChain(c.Name) {
					chains[t.Name+"/"+c.Name] = true
					rules += len(c.Rules)
					continue
				}
				for _, r := range c.Rules {
					if isKubeProxyChain(r.Target) {
						rules++
						if t.Name == "nat" && r.Target == "KUBE-SERVICES" && (c.Name == "PREROUTING" || c.Name == "OUTPUT") {
							dataplane = append(dataplane, "nat "+c.Name+" -> KUBE-SERVICES")
						}
					}
				}
			}
		}
		if rules == 0 {
			continue
		}
		sev := finding.Warning
		what := "stale kube-proxy rules from iptables/ipvs mode"
		if len(dataplane) > 0 {
			sev = finding.Critical
			what = "stale Service DNAT rules still hooked into nat " + strings.Join(dataplane, ", ") + ": they compete with kube-proxy's nftables table and can send traffic to old backends"
		}
		names := make([]string, 0, len(chains))
		for c := range chains {
			names = append(names, c)
		}
		sort.Strings(names)
		shown := names
		if len(shown) > 10 {
			shown = shown[:10]
		}
		out = append(out, finding.Finding{
			Detector: "KubeProxyModeLeftovers",
			Target:   iptablesTarget(s.Family, s.Backend, "kube-proxy-leftovers"),
			Severity: sev,
			Message: fmt.Sprintf("kube-proxy runs in nftables mode, but %d KUBE-* iptables rules in %d chains remain in the %s backend (%s): %s; kube-proxy cleans up only the backend its own iptables uses, and only when it starts",
				rules, len(chains), s.Backend, s.Family, what),
			Evidence: map[string]any{
				"proxyMode": "nftables", "family": string(s.Family), "backend": string(s.Backend), "kubeRules": rules,
				"kubeChains": len(chains), "chains": shown, "dataplaneJumps": dataplane,
				"confirm": iptables.SaveCommand(s.Family, s.Backend) + " | grep KUBE-",
			},
		})
	}
	return out
}

// nftLeftoverFindings is the decision in iptables and ipvs modes: one
// finding per kube-proxy nftables table present.
func nftLeftoverFindings(rs *nftables.Ruleset, mode kubeproxy.Mode, source string) []finding.Finding {
	var out []finding.Finding
	for _, f := range []nftables.Family{nftables.FamilyIP, nftables.FamilyIP6} {
		t := rs.Table(f, nftables.KubeProxyTableName)
		if t == nil {
			continue
		}
		sev := finding.Warning
		what := "its chains and maps are stale"
		k, err := nftables.ParseKubeProxy(t)
		if err == nil && len(k.ServiceIPs) > 0 && (t.Chain(nftables.KubeProxyNATPrerouting).JumpsTo(nftables.KubeProxyServicesChain) ||
			t.Chain(nftables.KubeProxyNATOutput).JumpsTo(nftables.KubeProxyServicesChain)) {
			sev = finding.Critical
			what = fmt.Sprintf("its nat chains still DNAT %d service IP/ports to the backends of when it was written, competing with kube-proxy's %s rules", len(k.ServiceIPs), mode)
		}
		services := 0
		if k != nil {
			services = len(k.ServiceIPs)
		}
		out = append(out, finding.Finding{
			Detector: "KubeProxyModeLeftovers",
			Target:   nftTarget(f, nftables.KubeProxyTableName) + "/leftover",
			Severity: sev,
			Message: fmt.Sprintf("kube-proxy runs in %s mode (%s), but nftables table %s %s from its nftables mode remains: %s",
				mode, source, f, nftables.KubeProxyTableName, what),
			Evidence: map[string]any{
				"proxyMode": string(mode), "family": string(f), "table": nftables.KubeProxyTableName,
				"chains": len(t.Chains), "serviceIPs": services,
				"confirm": fmt.Sprintf("nft list table %s %s", f, nftables.KubeProxyTableName),
			},
		})
	}
	return out
}
