package detect

import (
	"context"
	"errors"
	"fmt"
	"net/netip"

	"github.com/remediate-dev/remediate/internal/finding"
	"github.com/remediate-dev/remediate/internal/ipvs"
	"github.com/remediate-dev/remediate/internal/kubeproxy"
	"github.com/remediate-dev/remediate/internal/node"
	"github.com/remediate-dev/remediate/policy"
)

// IPVSStaleVirtualServerParams are the IPVSStaleVirtualServer thresholds.
type IPVSStaleVirtualServerParams struct {
	// RequireIPVSMode skips the detector unless kube-proxy runs in IPVS
	// mode: its /proxyMode says so or, when it cannot be asked, its
	// kube-ipvs0 interface exists (default true).
	RequireIPVSMode bool `yaml:"requireIPVSMode"`
	// ManagedCIDRs scope the detector to kube-proxy's addresses: the
	// Service CIDRs and the external/load-balancer IP pools. A virtual
	// server outside them (and not on NodeIPs) belongs to someone else
	// (keepalived, another load balancer) and is never reported. Default
	// the kubeadm Service CIDR 10.96.0.0/12.
	ManagedCIDRs []string `yaml:"managedCIDRs"`
	// NodeIPs are this node's addresses, where NodePort virtual servers
	// live; a virtual server on one of them whose port is no Service's
	// NodePort is reported. Optional.
	NodeIPs []string `yaml:"nodeIPs"`
	// MaxFindings bounds the findings of one run (default 50).
	MaxFindings int `yaml:"maxFindings"`
}

// SetDefaults sets the defaults of IPVSStaleVirtualServer (registry.Defaulter).
func (p *IPVSStaleVirtualServerParams) SetDefaults() {
	*p = IPVSStaleVirtualServerParams{RequireIPVSMode: true, ManagedCIDRs: []string{"10.96.0.0/12"}, MaxFindings: 50}
}

// Validate implements policy.Validator.
func (p *IPVSStaleVirtualServerParams) Validate() []policy.FieldError {
	_, errs := ipvsParsePrefixes("managedCIDRs", p.ManagedCIDRs)
	_, e2 := ipvsParseAddrs("nodeIPs", p.NodeIPs)
	errs = append(errs, e2...)
	return append(errs, ipvsMaxFindingsErr(p.MaxFindings)...)
}

func init() {
	Define("IPVSStaleVirtualServer",
		"IPVS virtual servers in kube-proxy's address ranges that match no Service ClusterIP, external IP, load-balancer IP or NodePort (never inside kube-proxy's /configz ipvs.excludeCIDRs)",
		newIPVSStaleVirtualServer, Targets(finding.KindIPVSVirtualServer), UsesClusterView())
}

type ipvsStaleVirtualServer struct {
	p       IPVSStaleVirtualServerParams
	n       *node.Node
	cidrs   []netip.Prefix
	nodeIPs []netip.Addr
	judgement
}

func newIPVSStaleVirtualServer(pp *IPVSStaleVirtualServerParams, n *node.Node) (Detector, error) {
	p := *pp
	cidrs, errs := ipvsParsePrefixes("managedCIDRs", p.ManagedCIDRs)
	ips, e2 := ipvsParseAddrs("nodeIPs", p.NodeIPs)
	if errs = append(errs, e2...); len(errs) > 0 {
		return nil, fmt.Errorf("%s: %s", errs[0].Field, errs[0].Msg)
	}
	return &ipvsStaleVirtualServer{p: p, n: n, cidrs: cidrs, nodeIPs: ips}, nil
}

func (d *ipvsStaleVirtualServer) Detect(ctx context.Context) ([]finding.Finding, error) {
	if err := ipvsPrecheck(ctx, d.n, d.p.RequireIPVSMode, true); err != nil {
		return nil, err
	}
	vss, err := d.n.IPVS.VirtualServers(ctx)
	if err != nil {
		return nil, ipvsErr("listing IPVS virtual servers", err)
	}
	desired := ipvs.NewDesired(d.n.Cluster, d.nodeIPs)
	if desired.Empty() {
		return nil, finding.Skip("the cluster view has no Services at all (not even default/kubernetes): not judging virtual servers against it")
	}
	// kube-proxy's ipvs.excludeCIDRs: it never cleans up virtual servers
	// there, nor is it reported here. When /configz cannot be read the
	// findings still come, each saying the exclusions were not checked
	// (DeleteIPVSVirtualServer refuses then).
	qctx, cancel := kubeProxyQueryCtx(ctx)
	excl, exclErr := kubeproxy.IPVSExcludeCIDRs(qctx, d.n.KubeProxy)
	cancel()
	excluded := 0
	var out []finding.Finding
	for _, vs := range vss {
		if vs.FWMark != 0 || !ipvs.Managed(vs.Address, d.cidrs, d.nodeIPs, desired) {
			continue
		}
		if _, ok := ipvs.Excluded(vs.Address, excl); ok && exclErr == nil {
			excluded++
			continue
		}
		if _, ok := desired.Lookup(vs); ok {
			continue
		}
		rss, err := d.n.IPVS.RealServers(ctx, vs)
		if errors.Is(err, ipvs.ErrNotFound) {
			continue // deleted since the list (kube-proxy is syncing)
		}
		if err != nil {
			return nil, ipvsErr("listing real servers of "+vs.Key(), err)
		}
		ref := ipvs.VirtualRef{VS: vs}
		ev := ref.Evidence()
		ev["realServers"] = len(rss)
		ev["reason"] = "matches no Service ClusterIP, external IP, load-balancer IP or NodePort"
		if exclErr != nil {
			ev["excludeCIDRs"] = "unknown: " + exclErr.Error() + " (not checked against kube-proxy's ipvs.excludeCIDRs; DeleteIPVSVirtualServer refuses until /configz answers)"
		} else {
			ev["excludeCIDRs"] = prefixStrings(excl)
		}
		out = append(out, finding.Finding{
			Detector: "IPVSStaleVirtualServer",
			Target:   ipvs.VirtualRef{VS: vs}.Target(),
			Severity: finding.Warning,
			Message:  fmt.Sprintf("IPVS virtual server %s (%d real servers) matches no Service", vs.Key(), len(rss)),
			Evidence: ev,
			Subject:  finding.Subject{Refs: []finding.Ref{ref}},
		})
		if len(out) >= d.p.MaxFindings {
			break
		}
	}
	if exclErr != nil {
		d.set("%d virtual servers, each matching a Service (kube-proxy's ipvs.excludeCIDRs unknown: %v)", len(vss), exclErr)
	} else {
		d.set("%d virtual servers, each matching a Service or inside kube-proxy's ipvs.excludeCIDRs %v (%d there)", len(vss), prefixStrings(excl), excluded)
	}
	return out, nil
}

func prefixStrings(ps []netip.Prefix) []string {
	out := make([]string, 0, len(ps))
	for _, p := range ps {
		out = append(out, p.String())
	}
	return out
}
