package action

import (
	"context"
	"fmt"
	"time"

	"github.com/remediate-dev/remediate/internal/finding"
	"github.com/remediate-dev/remediate/internal/ipvs"
	"github.com/remediate-dev/remediate/internal/node"
	"github.com/remediate-dev/remediate/policy"
)

// DeleteIPVSRealServerParams bound DeleteIPVSRealServer.
type DeleteIPVSRealServerParams struct {
	// MaxPerCycle is how many real servers may be deleted within
	// CycleWindow (default 1).
	MaxPerCycle int `yaml:"maxPerCycle"`
	// CycleWindow is the window MaxPerCycle counts over (default 1m; set
	// it to the policy's interval for "per cycle").
	CycleWindow policy.Duration `yaml:"cycleWindow"`
	// DeleteDraining allows deleting a TCP/SCTP real server that
	// kube-proxy is draining (weight 0 with connections). Default false.
	DeleteDraining bool `yaml:"deleteDraining"`
}

// SetDefaults sets the defaults of DeleteIPVSRealServer (registry.Defaulter).
func (p *DeleteIPVSRealServerParams) SetDefaults() {
	b := defaultIPVSDeleteBounds()
	*p = DeleteIPVSRealServerParams{MaxPerCycle: b.MaxPerCycle, CycleWindow: b.CycleWindow}
}

// Validate implements policy.Validator.
func (p *DeleteIPVSRealServerParams) Validate() []policy.FieldError {
	return IPVSDeleteBounds{p.MaxPerCycle, p.CycleWindow}.validate()
}

func init() {
	Define("DeleteIPVSRealServer",
		"delete a stale IPVS real server (from IPVSStaleRealServer) after re-checking it against a fresh cluster view",
		newDeleteIPVSRealServer, Disruptive(), NeedsAPI(), ActsOn(finding.KindIPVSRealServer))
}

type deleteIPVSRealServer struct {
	p   DeleteIPVSRealServerParams
	n   *node.Node
	lim *ipvsWindowLimiter
}

func newDeleteIPVSRealServer(pp *DeleteIPVSRealServerParams, n *node.Node) (Action, error) {
	p := *pp
	return &deleteIPVSRealServer{p: p, n: n, lim: &ipvsWindowLimiter{max: p.MaxPerCycle, window: p.CycleWindow.Duration}}, nil
}

// check re-reads the kernel and the view and returns the real server as the
// kernel has it now, with its classification, or a skip saying why it must
// not be deleted.
func (a *deleteIPVSRealServer) check(ctx context.Context, f finding.Finding, now time.Time) (ipvs.VirtualServer, ipvs.RealServer, string, error) {
	var vs ipvs.VirtualServer
	var rs ipvs.RealServer
	if a.n.IPVS == nil {
		return vs, rs, "", finding.Skip("%s", a.n.Why("ipvs"))
	}
	ref, err := refOf[ipvs.RealRef](f, "IPVS real server")
	if err != nil {
		return vs, rs, "", fmt.Errorf("finding %s: %w", f.Target, err)
	}
	vs, want := ref.VS, ref.RS
	if err := ipvsViewGate(a.n); err != nil {
		return vs, rs, "", err
	}
	rss, err := a.n.IPVS.RealServers(ctx, vs)
	if err != nil {
		if isIPVSNotFound(err) {
			return vs, rs, "", finding.Skip("virtual server %s no longer exists", vs.Key())
		}
		return vs, rs, "", ipvsSkipOrErr("listing real servers of "+vs.Key(), err)
	}
	found := false
	for _, r := range rss {
		if r.AddrPort() == want.AddrPort() {
			rs, found = r, true
		}
	}
	if !found {
		return vs, rs, "", finding.Skip("real server %s of %s no longer exists", want.AddrPort(), vs.Key())
	}
	fe, ok := ipvs.NewDesired(a.n.Cluster, nil).Lookup(vs)
	if !ok {
		return vs, rs, "", finding.Skip("virtual server %s matches no Service in the view now: not editing it", vs.Key())
	}
	if len(fe.SP.Endpoints) == 0 {
		return vs, rs, "", finding.Skip("the view has no endpoints at all for %s port %q: not trusting it to delete %s",
			fe.SP.ServiceName(), fe.SP.Port.Name, rs.AddrPort())
	}
	class := fe.SP.Classify(rs.AddrPort())
	if class == ipvs.BackendExpected {
		return vs, rs, class, finding.Skip("%s is now an expected endpoint of %s: keeping it", rs.AddrPort(), fe.SP.ServiceName())
	}
	if ipvs.Draining(vs, rs) && !a.p.DeleteDraining {
		return vs, rs, class, finding.Skip("%s is draining (weight 0, %d connections): kube-proxy removes it when drained",
			rs.AddrPort(), rs.ActiveConns+rs.InactiveConns)
	}
	if !ipvs.Dead(class) {
		// The backend still answers (terminating but serving): delete it
		// only if an expected endpoint is programmed to take over.
		covered := false
		for _, r := range rss {
			if _, ok := fe.SP.Expected[r.AddrPort()]; ok {
				covered = true
			}
		}
		if !covered {
			return vs, rs, class, finding.Skip("%s still serves and no expected endpoint of %s is programmed in %s: deleting it would black-hole traffic",
				rs.AddrPort(), fe.SP.ServiceName(), vs.Key())
		}
	}
	return vs, rs, class, nil
}

// Plan implements Action.
func (a *deleteIPVSRealServer) Plan(ctx context.Context, f finding.Finding) (Plan, error) {
	now := ipvsClock(a.n).Now()
	vs, rs, class, err := a.check(ctx, f, now)
	if err != nil {
		return Plan{}, err
	}
	if err := a.lim.wouldAllow(now); err != nil {
		return Plan{}, err
	}
	return Plan{
		Summary: fmt.Sprintf("delete real server %s from IPVS %s (%s)", rs.AddrPort(), vs.Key(), class),
		Details: ipvsRSDetails(vs, rs, class),
	}, nil
}

func ipvsRSDetails(vs ipvs.VirtualServer, rs ipvs.RealServer, class string) map[string]any {
	return map[string]any{
		"virtualServer": vs.Key(),
		"realServer":    rs.AddrPort().String(),
		"reason":        class,
		"weight":        rs.Weight,
		"activeConns":   rs.ActiveConns,
		"inactiveConns": rs.InactiveConns,
		"restoreCommand": fmt.Sprintf("ipvsadm -a %s %s -r %s -m -w %d",
			ipvsadmFlag(vs.Protocol), ipvsAddrPort(vs), rs.AddrPort(), rs.Weight),
	}
}

// Execute implements Action.
func (a *deleteIPVSRealServer) Execute(ctx context.Context, f finding.Finding) (Result, error) {
	now := ipvsClock(a.n).Now()
	vs, rs, class, err := a.check(ctx, f, now)
	if err != nil {
		return Result{}, err
	}
	if err := a.lim.take(now); err != nil {
		return Result{}, err
	}
	if err := a.n.IPVS.DeleteRealServer(ctx, vs, rs); err != nil {
		if isIPVSNotFound(err) {
			return Result{}, finding.Skip("real server %s of %s vanished before deletion: %v", rs.AddrPort(), vs.Key(), err)
		}
		return Result{}, ipvsSkipOrErr(fmt.Sprintf("deleting real server %s of %s", rs.AddrPort(), vs.Key()), err)
	}
	return Result{
		Summary: fmt.Sprintf("deleted real server %s from IPVS %s (%s)", rs.AddrPort(), vs.Key(), class),
		Details: ipvsRSDetails(vs, rs, class),
	}, nil
}
