package action

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"time"

	"github.com/remediate-dev/remediate/internal/finding"
	"github.com/remediate-dev/remediate/internal/ipvs"
	"github.com/remediate-dev/remediate/internal/kubeproxy"
	"github.com/remediate-dev/remediate/internal/node"
	"github.com/remediate-dev/remediate/policy"
)

// DeleteIPVSVirtualServerParams bound DeleteIPVSVirtualServer.
type DeleteIPVSVirtualServerParams struct {
	// MaxPerCycle is how many virtual servers may be deleted within
	// CycleWindow (default 1).
	MaxPerCycle int `yaml:"maxPerCycle"`
	// CycleWindow is the window MaxPerCycle counts over (default 1m).
	CycleWindow policy.Duration `yaml:"cycleWindow"`
	// ManagedCIDRs are kube-proxy's address ranges (Service CIDRs,
	// external/load-balancer pools); a virtual server outside them and
	// NodeIPs is never deleted. Default 10.96.0.0/12.
	ManagedCIDRs []string `yaml:"managedCIDRs"`
	// NodeIPs are this node's addresses (NodePort virtual servers).
	NodeIPs []string `yaml:"nodeIPs"`
}

// SetDefaults sets the defaults of DeleteIPVSVirtualServer (registry.Defaulter).
func (p *DeleteIPVSVirtualServerParams) SetDefaults() {
	b := defaultIPVSDeleteBounds()
	*p = DeleteIPVSVirtualServerParams{MaxPerCycle: b.MaxPerCycle, CycleWindow: b.CycleWindow,
		ManagedCIDRs: []string{"10.96.0.0/12"}}
}

// Validate implements policy.Validator.
func (p *DeleteIPVSVirtualServerParams) Validate() []policy.FieldError {
	errs := IPVSDeleteBounds{p.MaxPerCycle, p.CycleWindow}.validate()
	for i, s := range p.ManagedCIDRs {
		if _, err := netip.ParsePrefix(s); err != nil {
			errs = append(errs, policy.FieldError{Field: fmt.Sprintf("managedCIDRs[%d]", i), Msg: fmt.Sprintf("%q is not a CIDR", s)})
		}
	}
	for i, s := range p.NodeIPs {
		if _, err := netip.ParseAddr(s); err != nil {
			errs = append(errs, policy.FieldError{Field: fmt.Sprintf("nodeIPs[%d]", i), Msg: fmt.Sprintf("%q is not an IP address", s)})
		}
	}
	return errs
}

func init() {
	Define("DeleteIPVSVirtualServer",
		"delete a stale IPVS virtual server (from IPVSStaleVirtualServer) after re-checking that no Service in a fresh view wants it and that it is outside kube-proxy's /configz ipvs.excludeCIDRs (refuses when /configz cannot be read)",
		newDeleteIPVSVirtualServer, Disruptive(), NeedsAPI(), ActsOn(finding.KindIPVSVirtualServer))
}

type deleteIPVSVirtualServer struct {
	p       DeleteIPVSVirtualServerParams
	n       *node.Node
	lim     *ipvsWindowLimiter
	cidrs   []netip.Prefix
	nodeIPs []netip.Addr
}

func newDeleteIPVSVirtualServer(pp *DeleteIPVSVirtualServerParams, n *node.Node) (Action, error) {
	p := *pp
	a := &deleteIPVSVirtualServer{p: p, n: n, lim: &ipvsWindowLimiter{max: p.MaxPerCycle, window: p.CycleWindow.Duration}}
	for _, s := range p.ManagedCIDRs {
		pr, err := netip.ParsePrefix(s)
		if err != nil {
			return nil, fmt.Errorf("managedCIDRs: %w", err)
		}
		a.cidrs = append(a.cidrs, pr.Masked())
	}
	for _, s := range p.NodeIPs {
		ip, err := netip.ParseAddr(s)
		if err != nil {
			return nil, fmt.Errorf("nodeIPs: %w", err)
		}
		a.nodeIPs = append(a.nodeIPs, ip.Unmap())
	}
	return a, nil
}

func isIPVSNotFound(err error) bool { return errors.Is(err, ipvs.ErrNotFound) }

func ipvsAddrPort(vs ipvs.VirtualServer) string {
	return netip.AddrPortFrom(vs.Address, vs.Port).String()
}

// check re-reads the kernel and the view right before acting.
func (a *deleteIPVSVirtualServer) check(ctx context.Context, f finding.Finding, now time.Time) (ipvs.VirtualServer, []ipvs.RealServer, error) {
	if a.n.IPVS == nil {
		return ipvs.VirtualServer{}, nil, finding.Skip("%s", a.n.Why("ipvs"))
	}
	ref, err := refOf[ipvs.VirtualRef](f, "IPVS virtual server")
	if err != nil {
		return ipvs.VirtualServer{}, nil, fmt.Errorf("finding %s: %w", f.Target, err)
	}
	vs := ref.VS
	if err := ipvsViewGate(a.n); err != nil {
		return vs, nil, err
	}
	desired := ipvs.NewDesired(a.n.Cluster, a.nodeIPs)
	if desired.Empty() {
		return vs, nil, finding.Skip("the cluster view has no Services at all (not even default/kubernetes): refusing to delete against it")
	}
	if fe, ok := desired.Lookup(vs); ok {
		return vs, nil, finding.Skip("the cluster view says %s should exist (%s of %s): not deleting it", vs.Key(), fe.Kind, fe.SP.ServiceName())
	}
	if !ipvs.Managed(vs.Address, a.cidrs, a.nodeIPs, desired) {
		return vs, nil, finding.Skip("%s is outside managedCIDRs and nodeIPs: not kube-proxy's, not deleting it", vs.Key())
	}
	// kube-proxy's ipvs.excludeCIDRs (kubernetes/kubernetes#134147): its
	// own cleanup never deletes a virtual server there, nor does this.
	// Without them, what kube-proxy was told to leave alone is unknown:
	// refuse rather than guess.
	excl, err := kubeproxy.IPVSExcludeCIDRs(ctx, a.n.KubeProxy)
	if err != nil {
		return vs, nil, finding.Skip("kube-proxy's ipvs.excludeCIDRs are unknown (%v): refusing to delete %s, which they may cover", err, vs.Key())
	}
	if p, ok := ipvs.Excluded(vs.Address, excl); ok {
		return vs, nil, finding.Skip("%s is inside kube-proxy's ipvs.excludeCIDRs (%s): kube-proxy leaves it alone, not deleting it", vs.Key(), p)
	}
	vss, err := a.n.IPVS.VirtualServers(ctx)
	if err != nil {
		return vs, nil, ipvsSkipOrErr("listing IPVS virtual servers", err)
	}
	found := false
	for _, v := range vss {
		if v.Same(vs) {
			vs, found = v, true
		}
	}
	if !found {
		return vs, nil, finding.Skip("virtual server %s no longer exists", vs.Key())
	}
	rss, err := a.n.IPVS.RealServers(ctx, vs)
	if err != nil {
		if isIPVSNotFound(err) {
			return vs, nil, finding.Skip("virtual server %s no longer exists", vs.Key())
		}
		return vs, nil, ipvsSkipOrErr("listing real servers of "+vs.Key(), err)
	}
	return vs, rss, nil
}

func ipvsVSDetails(vs ipvs.VirtualServer, rss []ipvs.RealServer) map[string]any {
	list := make([]string, 0, len(rss))
	for _, r := range rss {
		list = append(list, fmt.Sprintf("%s weight %d", r.AddrPort(), r.Weight))
	}
	sched := vs.Scheduler
	if sched == "" {
		sched = "rr"
	}
	return map[string]any{
		"virtualServer":  vs.Key(),
		"scheduler":      vs.Scheduler,
		"realServers":    list,
		"restoreCommand": fmt.Sprintf("ipvsadm -A %s %s -s %s (then ipvsadm -a for each real server)", ipvsadmFlag(vs.Protocol), ipvsAddrPort(vs), sched),
	}
}

// Plan implements Action.
func (a *deleteIPVSVirtualServer) Plan(ctx context.Context, f finding.Finding) (Plan, error) {
	now := ipvsClock(a.n).Now()
	vs, rss, err := a.check(ctx, f, now)
	if err != nil {
		return Plan{}, err
	}
	if err := a.lim.wouldAllow(now); err != nil {
		return Plan{}, err
	}
	return Plan{
		Summary: fmt.Sprintf("delete IPVS virtual server %s and its %d real servers", vs.Key(), len(rss)),
		Details: ipvsVSDetails(vs, rss),
	}, nil
}

// Execute implements Action.
func (a *deleteIPVSVirtualServer) Execute(ctx context.Context, f finding.Finding) (Result, error) {
	now := ipvsClock(a.n).Now()
	vs, rss, err := a.check(ctx, f, now)
	if err != nil {
		return Result{}, err
	}
	if err := a.lim.take(now); err != nil {
		return Result{}, err
	}
	if err := a.n.IPVS.DeleteVirtualServer(ctx, vs); err != nil {
		if isIPVSNotFound(err) {
			return Result{}, finding.Skip("virtual server %s vanished before deletion: %v", vs.Key(), err)
		}
		return Result{}, ipvsSkipOrErr("deleting virtual server "+vs.Key(), err)
	}
	return Result{
		Summary: fmt.Sprintf("deleted IPVS virtual server %s and its %d real servers", vs.Key(), len(rss)),
		Details: ipvsVSDetails(vs, rss),
	}, nil
}
