package detect

import (
	"context"
	"fmt"
	"net/netip"

	"github.com/remediate-dev/remediate/internal/finding"
	"github.com/remediate-dev/remediate/internal/ipvs"
	"github.com/remediate-dev/remediate/internal/node"
	"github.com/remediate-dev/remediate/policy"
)

// IPVSMissingVirtualServerParams are the IPVSMissingVirtualServer thresholds.
type IPVSMissingVirtualServerParams struct {
	// RequireIPVSMode skips the detector unless kube-proxy runs in IPVS
	// mode: its /proxyMode says so or, when it cannot be asked, its
	// kube-ipvs0 interface exists (default true).
	RequireIPVSMode bool `yaml:"requireIPVSMode"`
	// NodeIPs are this node's addresses; when set, NodePort virtual
	// servers on them are expected too. Optional.
	NodeIPs []string `yaml:"nodeIPs"`
	// MaxFindings bounds the findings of one run (default 50).
	MaxFindings int `yaml:"maxFindings"`
}

// SetDefaults sets the defaults of IPVSMissingVirtualServer (registry.Defaulter).
func (p *IPVSMissingVirtualServerParams) SetDefaults() {
	*p = IPVSMissingVirtualServerParams{RequireIPVSMode: true, MaxFindings: 50}
}

// Validate implements policy.Validator.
func (p *IPVSMissingVirtualServerParams) Validate() []policy.FieldError {
	_, errs := ipvsParseAddrs("nodeIPs", p.NodeIPs)
	return append(errs, ipvsMaxFindingsErr(p.MaxFindings)...)
}

func init() {
	Define("IPVSMissingVirtualServer",
		"a Service with endpoints has no IPVS virtual server for one of its frontends",
		newIPVSMissingVirtualServer, Targets(finding.KindIPVSMissingVirtualServer), UsesClusterView())
}

type ipvsMissingVirtualServer struct {
	p       IPVSMissingVirtualServerParams
	n       *node.Node
	nodeIPs []netip.Addr
	judgement
}

func newIPVSMissingVirtualServer(pp *IPVSMissingVirtualServerParams, n *node.Node) (Detector, error) {
	p := *pp
	ips, errs := ipvsParseAddrs("nodeIPs", p.NodeIPs)
	if len(errs) > 0 {
		return nil, fmt.Errorf("%s: %s", errs[0].Field, errs[0].Msg)
	}
	return &ipvsMissingVirtualServer{p: p, n: n, nodeIPs: ips}, nil
}

// Detect reports frontends of Services that have expected endpoints but no
// virtual server. Only address families that have at least one virtual
// server are checked: a node whose kube-proxy programs no IPv6 at all is
// single-stack, not missing every IPv6 Service.
func (d *ipvsMissingVirtualServer) Detect(ctx context.Context) ([]finding.Finding, error) {
	if err := ipvsPrecheck(ctx, d.n, d.p.RequireIPVSMode, true); err != nil {
		return nil, err
	}
	vss, err := d.n.IPVS.VirtualServers(ctx)
	if err != nil {
		return nil, ipvsErr("listing IPVS virtual servers", err)
	}
	have := map[string]bool{}
	has4, has6 := false, false
	for _, vs := range vss {
		have[vs.Key()] = true
		if vs.FWMark != 0 {
			continue
		}
		if vs.Address.Unmap().Is4() {
			has4 = true
		} else {
			has6 = true
		}
	}
	var out []finding.Finding
	d.set("every Service frontend with endpoints has a virtual server (%d virtual servers)", len(vss))
	for _, fe := range ipvs.NewDesired(d.n.Cluster, d.nodeIPs).Frontends() {
		if have[fe.VS.Key()] || len(fe.SP.Expected) == 0 {
			continue
		}
		if (fe.VS.Address.Is4() && !has4) || (fe.VS.Address.Is6() && !has6) {
			continue
		}
		ev := ipvs.VirtualRef{VS: fe.VS}.Evidence()
		ev["service"] = fe.SP.ServiceName()
		ev["portName"] = fe.SP.Port.Name
		ev["frontend"] = fe.Kind
		ev["expectedEndpoints"] = ipvsExpectedList(fe.SP)
		out = append(out, finding.Finding{
			Detector: "IPVSMissingVirtualServer",
			Target:   ipvs.VirtualRef{VS: fe.VS}.Target(),
			Severity: finding.Critical,
			Message: fmt.Sprintf("no IPVS virtual server for %s %s of %s (%d endpoints): kube-proxy is not programming it",
				fe.Kind, fe.VS.Key(), fe.SP.ServiceName(), len(fe.SP.Expected)),
			Evidence: ev,
		})
		if len(out) >= d.p.MaxFindings {
			break
		}
	}
	return out, nil
}
