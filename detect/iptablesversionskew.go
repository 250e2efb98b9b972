package detect

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/remediate-dev/remediate/internal/finding"
	"github.com/remediate-dev/remediate/internal/iptables"
	"github.com/remediate-dev/remediate/internal/kubeproxy"
	"github.com/remediate-dev/remediate/internal/node"
	"github.com/remediate-dev/remediate/policy"
)

// IPTablesVersionSkewParams configure IPTablesVersionSkew.
type IPTablesVersionSkewParams struct {
	// ProxyMode is kube-proxy's mode, as for IPTablesRules: in nftables
	// mode kube-proxy does not use iptables and the detector skips; "auto"
	// asks kube-proxy.
	ProxyMode string `yaml:"proxyMode"`
	// CNIAgents are the process names (argv[0] basename) of CNI agents
	// whose iptables is compared with kube-proxy's and the host's.
	CNIAgents []string `yaml:"cniAgents"`
	// VersionSkew is the smallest version difference reported: "minor"
	// (1.8 vs 1.6), "patch" (1.8.9 vs 1.8.4; the nft backend's rule
	// encoding changed between 1.8 patch releases) or "off". A backend
	// difference (nft vs legacy) is always reported.
	VersionSkew string `yaml:"versionSkew"`
	// CheckKubeRulesBackend compares kube-proxy's iptables backend with
	// the backend whose tables hold KUBE-* rules (one save per backend,
	// shared with IPTablesRules, never the xtables lock).
	CheckKubeRulesBackend bool `yaml:"checkKubeRulesBackend"`
	// Families whose saves the KUBE-* backend check reads.
	Families []string `yaml:"families"`
	// SaveTimeout bounds each save of the KUBE-* backend check.
	SaveTimeout policy.Duration `yaml:"saveTimeout"`
}

// DefaultCNIAgents are the process names of common CNI agents that
// program iptables: Calico, Cilium, Flannel, AWS VPC CNI, Antrea,
// kube-router, Weave Net, kindnet.
var DefaultCNIAgents = []string{"calico-node", "cilium-agent", "flanneld", "aws-k8s-agent", "antrea-agent", "kube-router", "weaver", "kindnetd"}

// SetDefaults implements registry.Defaulter.
func (p *IPTablesVersionSkewParams) SetDefaults() {
	*p = IPTablesVersionSkewParams{
		ProxyMode:             "iptables",
		CNIAgents:             append([]string(nil), DefaultCNIAgents...),
		VersionSkew:           "minor",
		CheckKubeRulesBackend: true,
		Families:              []string{"IPv4", "IPv6"},
		SaveTimeout:           policy.D(8 * time.Second),
	}
}

// Validate implements policy.Validator.
func (p *IPTablesVersionSkewParams) Validate() []policy.FieldError {
	var errs []policy.FieldError
	errs = append(errs, validateProxyMode(p.ProxyMode)...)
	switch p.VersionSkew {
	case "minor", "patch", "off":
	default:
		errs = append(errs, policy.FieldError{Field: "versionSkew", Msg: fmt.Sprintf("must be minor, patch or off, not %q", p.VersionSkew)})
	}
	for i, n := range p.CNIAgents {
		if n == "" || strings.ContainsAny(n, "/ ") {
			errs = append(errs, policy.FieldError{Field: fmt.Sprintf("cniAgents[%d]", i), Msg: fmt.Sprintf("must be a process name (argv[0] basename), not %q", n)})
		}
	}
	errs = append(errs, validateFamilies(p.Families)...)
	errs = append(errs, validateSaveTimeout(p.SaveTimeout)...)
	return errs
}

func init() {
	Define("IPTablesVersionSkew",
		"iptables version or backend skew between the host, kube-proxy and the CNI agent (each read from its own root, nothing executed), and kube-proxy's backend vs the one holding KUBE-* rules",
		newIPTablesVersionSkew, Targets(finding.KindIPTablesRules))
}

type iptablesVersionSkew struct {
	p IPTablesVersionSkewParams
	n *node.Node
	// installs remembers the binaries and package databases read, so
	// that an unchanged one is not scanned again every cycle.
	installs *iptables.InstallReader
	judgement
}

func newIPTablesVersionSkew(p *IPTablesVersionSkewParams, n *node.Node) (Detector, error) {
	return &iptablesVersionSkew{p: *p, n: n, installs: iptables.NewInstallReader(iptables.DefaultInstallMemo, n.Clock)}, nil
}

func (d *iptablesVersionSkew) Detect(ctx context.Context) ([]finding.Finding, error) {
	if why, off := d.n.Unavailable[node.SubsystemHostRoot]; off {
		return nil, finding.Skip("%s", why)
	}
	mode := resolveProxyMode(ctx, d.n, d.p.ProxyMode)
	if mode.mode == string(kubeproxy.ModeNFTables) {
		return nil, finding.Skip("kube-proxy runs in nftables mode (%s): it does not use iptables", mode.note)
	}
	host, kp, cni, notes := readIPTablesParties(ctx, d.n, d.installs, d.p.CNIAgents)
	var out []finding.Finding
	var compared []string
	pair := func(a, b iptablesParty) {
		if !a.known() || !b.known() {
			return
		}
		compared = append(compared, a.Who+"/"+b.Who)
		out = append(out, d.compare(a, b, notes)...)
	}
	if kp != nil {
		pair(host, *kp)
		for _, c := range cni {
			pair(*kp, c)
		}
	}
	for _, c := range cni {
		pair(host, c)
	}
	if d.p.CheckKubeRulesBackend && kp != nil && kp.known() {
		f, note := d.kubeRulesBackend(ctx, *kp, mode)
		if f != nil {
			out = append(out, *f)
		}
		if note != "" {
			notes = append(notes, note)
		}
	}
	all := []iptablesParty{host}
	if kp != nil {
		all = append(all, *kp)
	}
	var parties []string
	for _, p := range append(all, cni...) {
		if p.known() {
			parties = append(parties, p.Who+": "+p.In.Describe())
		} else {
			parties = append(parties, p.Who+": "+p.Err.Error())
		}
	}
	if len(compared) == 0 && len(out) == 0 {
		return nil, finding.Skip("nothing to compare: %s", strings.Join(append(parties, notes...), "; "))
	}
	d.set("%s", strings.Join(append(parties, notes...), "; "))
	return out, nil
}

// compare reports a backend or version skew between a and b.
func (d *iptablesVersionSkew) compare(a, b iptablesParty, notes []string) []finding.Finding {
	ev := func() map[string]any {
		m := map[string]any{a.Who: a.evidence(), b.Who: b.evidence(), "parties": []string{a.Who, b.Who}}
		if len(notes) > 0 {
			m["notes"] = notes
		}
		return m
	}
	var out []finding.Finding
	ab, bb := a.In.Backend, b.In.Backend
	if ab != "" && bb != "" && ab != bb {
		out = append(out, finding.Finding{
			Detector: "IPTablesVersionSkew",
			Target:   "iptables/versions/" + a.Who + "/" + b.Who + "/backend",
			Severity: finding.Critical,
			Message: fmt.Sprintf("%s's iptables uses the %s backend, %s's the %s backend: their rules live in different kernel tables, each blind to the other's (%s: %s; %s: %s)",
				a.Who, ab, b.Who, bb, a.Who, a.In.Describe(), b.Who, b.In.Describe()),
			Evidence: ev(),
		})
	}
	if d.p.VersionSkew != "off" && a.In.Version != "" && b.In.Version != "" {
		if level := versionSkew(a.In.Version, b.In.Version); level != "" && (level != "patch" || d.p.VersionSkew == "patch") {
			e := ev()
			e["skew"] = level
			out = append(out, finding.Finding{
				Detector: "IPTablesVersionSkew",
				Target:   "iptables/versions/" + a.Who + "/" + b.Who + "/version",
				Severity: finding.Warning,
				Message: fmt.Sprintf("iptables %s on %s and %s on %s (%s skew): one saving and restoring rules the other wrote can drop match conditions it does not decode (the version-skew corruption IPTablesRules looks for)",
					a.In.Version, a.Who, b.In.Version, b.Who, level),
				Evidence: e,
			})
		}
	}
	return out
}

// versionSkew returns "major", "minor", "patch" or "" (same, or not
// comparable).
func versionSkew(a, b string) string {
	am, an, ap, ok1 := iptables.VersionParts(a)
	bm, bn, bp, ok2 := iptables.VersionParts(b)
	switch {
	case !ok1 || !ok2:
		return ""
	case am != bm:
		return "major"
	case an != bn:
		return "minor"
	case ap != bp:
		return "patch"
	}
	return ""
}

// kubeRulesBackend compares kube-proxy's backend with the backends whose
// saves hold KUBE-* rules.
func (d *iptablesVersionSkew) kubeRulesBackend(ctx context.Context, kp iptablesParty, mode proxyMode) (*finding.Finding, string) {
	if d.n.IPTables == nil {
		return nil, "KUBE-* backend not checked: " + d.n.Why("iptables")
	}
	if kp.In.Backend == "" {
		return nil, "KUBE-* backend not checked: kube-proxy's iptables backend is unknown or undecided"
	}
	holding := map[iptables.Backend]int{}
	var mu sync.Mutex
	var wg sync.WaitGroup
	var errs []string
	for _, fs := range d.p.Families {
		for _, be := range []iptables.Backend{iptables.Legacy, iptables.NFT} {
			wg.Add(1)
			go func(f iptables.Family, be iptables.Backend) {
				defer wg.Done()
				sctx, cancel := context.WithTimeout(ctx, d.p.SaveTimeout.Duration)
				defer cancel()
				s, err := d.n.IPTables.Save(sctx, f, be)
				mu.Lock()
				defer mu.Unlock()
				switch {
				case errors.Is(err, iptables.ErrUnavailable):
				case err != nil:
					errs = append(errs, err.Error())
				default:
					holding[be] += s.Rules.KubeRuleCount()
				}
			}(iptables.Family(fs), be)
		}
	}
	wg.Wait()
	if len(errs) > 0 {
		return nil, "KUBE-* backend not checked: " + strings.Join(errs, "; ")
	}
	if holding[kp.In.Backend] > 0 || holding[iptables.Legacy]+holding[iptables.NFT] == 0 {
		return nil, ""
	}
	other := iptables.Legacy
	if kp.In.Backend == iptables.Legacy {
		other = iptables.NFT
	}
	return &finding.Finding{
		Detector: "IPTablesVersionSkew",
		Target:   "iptables/versions/kube-proxy/kube-rules/backend",
		Severity: finding.Critical,
		Message: fmt.Sprintf("kube-proxy's iptables writes the %s backend, but the KUBE-* rules (%d) are in %s only: the rules the kernel runs are not the ones kube-proxy maintains (%s)",
			kp.In.Backend, holding[other], other, kp.In.Describe()),
		Evidence: map[string]any{
			"kube-proxy": kp.evidence(), "kubeRulesBackend": string(other), "kubeRules": holding[other],
			"kubeProxyBackend": string(kp.In.Backend), "proxyMode": mode.mode, "proxyModeSource": mode.note,
		},
	}, ""
}
