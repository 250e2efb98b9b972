package action

import (
	"context"
	"fmt"
	"net/netip"
	"sort"
	"strings"

	"github.com/remediate-dev/remediate/internal/conntrack"
	"github.com/remediate-dev/remediate/internal/finding"
	"github.com/remediate-dev/remediate/internal/ipvs"
	"github.com/remediate-dev/remediate/internal/node"
	"github.com/remediate-dev/remediate/internal/sysctl"
	"github.com/remediate-dev/remediate/policy"
)

// ClearIPVSUDPAffinityName is the registered name.
const ClearIPVSUDPAffinityName = "ClearIPVSUDPAffinity"

// expireNodestConnKey is the sysctl that makes IPVS expire a connection
// entry whose real server is gone on the entry's next packet, and schedule
// that packet anew.
const expireNodestConnKey = "net/ipv4/vs/expire_nodest_conn"

// ClearIPVSUDPAffinityParams bound ClearIPVSUDPAffinity, which frees UDP
// clients that IPVS keeps sending to a dead backend (finding
// IPVSUDPDeadBackend).
//
// IPVS remembers each UDP flow's real server in its own connection table,
// refreshed by every packet, so a client that keeps its socket (a resolver)
// stays pinned to a deleted pod for as long as it keeps asking. Measured on
// Debian's 6.1 kernel in the test VM (TestVMUDPAffinityRemedies, tools/vm):
// the pinned client's next three queries after its backend died, "-" = no
// answer, "live" = the other backend answered:
//
//	remedy                                                  answers          entry on dead backend
//	none (real server still programmed)                     - - -            yes
//	real server deleted, expire_nodest_conn=0 (the default) - - -            yes
//	conntrack -F (nf_conntrack in use, real server deleted) - - -            yes
//	expire_nodest_conn=1, real server still programmed      - - -            yes
//	weight 0 + expire_quiescent_template=1                  - - -            yes (persistent service too)
//	UDP timeout lowered to 2s, client asking every 0.3s     - - -            yes
//	real server deleted + expire_nodest_conn=1              live live live   no  (persistent service too)
//	the same with nf_conntrack in use (kube-proxy's setup)  (-|live) live live no
//
// Only the pair works: the real server gone from the virtual server and
// expire_nodest_conn=1; the entry then expires on its next packet, which
// is scheduled anew (or, with nf_conntrack in use, may be dropped, and the
// next one is). So the action, for the finding's dead backend, re-reads the
// connection table and the view, deletes the backend from every virtual
// server of a Service whose UDP entries are pinned to it (at most
// MaxPerCycle within CycleWindow; refusing on a stale view, a view with no
// endpoints for the port, or a backend that is expected or still serving
// now), and sets expire_nodest_conn to 1 when it is 0 (kube-proxy in IPVS
// mode sets 1 itself; 0 is the kernel default). The previous value and the
// restore commands are in the result, hence in the journal.
type ClearIPVSUDPAffinityParams struct {
	// MaxPerCycle is how many real servers may be deleted within
	// CycleWindow (default 1).
	MaxPerCycle int `yaml:"maxPerCycle"`
	// CycleWindow is the window MaxPerCycle counts over (default 1m).
	CycleWindow policy.Duration `yaml:"cycleWindow"`
	// SetExpireNodestConn allows setting net.ipv4.vs.expire_nodest_conn
	// to 1 when it is 0 (default true). Without it the action refuses on
	// a node where it is 0: deleting the real server alone frees no
	// client.
	SetExpireNodestConn bool `yaml:"setExpireNodestConn"`
}

// Validate implements policy.Validator.
func (p *ClearIPVSUDPAffinityParams) Validate() []policy.FieldError {
	return IPVSDeleteBounds{p.MaxPerCycle, p.CycleWindow}.validate()
}

// SetDefaults sets the defaults of ClearIPVSUDPAffinity (registry.Defaulter).
func (p *ClearIPVSUDPAffinityParams) SetDefaults() {
	b := defaultIPVSDeleteBounds()
	*p = ClearIPVSUDPAffinityParams{MaxPerCycle: b.MaxPerCycle, CycleWindow: b.CycleWindow, SetExpireNodestConn: true}
}

func init() {
	Define(ClearIPVSUDPAffinityName,
		"free UDP clients pinned by IPVS to a dead backend (from IPVSUDPDeadBackend): delete it from its virtual servers and set net.ipv4.vs.expire_nodest_conn=1, so each pinned entry expires on its next packet",
		newClearIPVSUDPAffinity, Disruptive(), NeedsAPI(), ActsOnDetectors("IPVSUDPDeadBackend"))
}

func newClearIPVSUDPAffinity(pp *ClearIPVSUDPAffinityParams, n *node.Node) (Action, error) {
	p := *pp
	return &clearIPVSUDPAffinity{p: p, n: n, sys: sysctl.New(n.ProcRoot),
		lim: &ipvsWindowLimiter{max: p.MaxPerCycle, window: p.CycleWindow.Duration}}, nil
}

type clearIPVSUDPAffinity struct {
	p   ClearIPVSUDPAffinityParams
	n   *node.Node
	sys sysctl.Interface
	lim *ipvsWindowLimiter
}

// affinityPlan is what the action found right before acting.
type affinityPlan struct {
	backend     netip.AddrPort
	pinned      int
	vss         []ipvs.VirtualServer // Services' virtual servers with entries pinned to backend
	deletes     []ipvs.VirtualServer // of those, the ones still holding backend as a real server
	weights     map[string]int
	nodest      string // current expire_nodest_conn
	setNodest   bool
	services    []string
	backendKind string
}

func (a *clearIPVSUDPAffinity) check(ctx context.Context, f finding.Finding) (*affinityPlan, error) {
	if a.n.IPVS == nil {
		return nil, finding.Skip("%s", a.n.Why("ipvs"))
	}
	ref, err := refOf[conntrack.BackendRef](f, "backend")
	if err == nil {
		err = ref.Backend.Validate()
	}
	if err != nil {
		return nil, fmt.Errorf("finding %s: %w", f.Target, err)
	}
	if ref.Protocol != "" && !strings.EqualFold(ref.Protocol, ipvs.UDP) {
		return nil, finding.Skip("finding %s is about %s, not UDP: not touching it", f.Target, ref.Protocol)
	}
	if ref.Backend.Port == 0 {
		return nil, fmt.Errorf("finding %s names no backend port: this action needs the exact backend", f.Target)
	}
	ip, port := ref.Backend.IP, ref.Backend.Port
	pl := &affinityPlan{backend: netip.AddrPortFrom(ip.Unmap(), port), weights: map[string]int{}}
	if err := ipvsViewGate(a.n); err != nil {
		return nil, err
	}
	desired := ipvs.NewDesired(a.n.Cluster, nil)

	// The connection table now: which Services' virtual servers still
	// have UDP entries pinned to the backend.
	vss := map[string]ipvs.VirtualServer{}
	services := map[string]bool{}
	err = a.n.IPVS.Connections(ctx, ipvs.UDP, func(c ipvs.Conn) error {
		if netip.AddrPortFrom(c.Dest.Addr().Unmap(), c.Dest.Port()) != pl.backend {
			return nil
		}
		vs := ipvs.VirtualServer{Address: c.Virtual.Addr().Unmap(), Protocol: ipvs.UDP, Port: c.Virtual.Port()}
		if _, ok := desired.Lookup(vs); !ok {
			return nil // not a Service's: not ours to judge
		}
		pl.pinned++
		vss[vs.Key()] = vs
		return nil
	})
	if err != nil {
		return nil, ipvsSkipOrErr("reading the IPVS connection table", err)
	}
	if pl.pinned == 0 {
		return nil, finding.Skip("no UDP IPVS entries of a Service are pinned to %s any more", pl.backend)
	}
	keys := make([]string, 0, len(vss))
	for k := range vss {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		vs := vss[k]
		fe, _ := desired.Lookup(vs)
		if len(fe.SP.Endpoints) == 0 {
			return nil, finding.Skip("the view has no endpoints at all for %s port %q: not trusting it to call %s dead",
				fe.SP.ServiceName(), fe.SP.Port.Name, pl.backend)
		}
		class := fe.SP.Classify(pl.backend)
		if !ipvs.Dead(class) {
			return nil, finding.Skip("%s is %s of %s now: not dead, keeping its clients", pl.backend, class, fe.SP.ServiceName())
		}
		pl.backendKind = class
		services[fe.SP.ServiceName()] = true
		pl.vss = append(pl.vss, vs)
		rss, err := a.n.IPVS.RealServers(ctx, vs)
		if isIPVSNotFound(err) {
			continue // the virtual server is gone: its entries have no destination either
		}
		if err != nil {
			return nil, ipvsSkipOrErr("listing real servers of "+vs.Key(), err)
		}
		for _, r := range rss {
			if r.AddrPort() == pl.backend {
				pl.deletes = append(pl.deletes, vs)
				pl.weights[vs.Key()] = r.Weight
			}
		}
	}
	for s := range services {
		pl.services = append(pl.services, s)
	}
	sort.Strings(pl.services)

	pl.nodest, err = a.sys.Get(expireNodestConnKey)
	if err != nil {
		return nil, fmt.Errorf("reading %s: %w", expireNodestConnKey, err)
	}
	if pl.nodest == "0" {
		if !a.p.SetExpireNodestConn {
			return nil, finding.Skip("net.ipv4.vs.expire_nodest_conn is 0 and setExpireNodestConn is false: deleting the real server alone frees no client (measured), leaving it")
		}
		pl.setNodest = true
	} else if pl.nodest != "1" {
		return nil, finding.Skip("net.ipv4.vs.expire_nodest_conn is %q, not 0 or 1: not touching it", pl.nodest)
	}
	if len(pl.deletes) == 0 && !pl.setNodest {
		return nil, finding.Skip("%s is no real server any more and expire_nodest_conn is 1: its %d entries expire on their next packet",
			pl.backend, pl.pinned)
	}
	return pl, nil
}

func (pl *affinityPlan) summary(done bool) string {
	del, set := "delete", "set"
	if done {
		del = "deleted"
	}
	var parts []string
	if len(pl.deletes) > 0 {
		keys := make([]string, len(pl.deletes))
		for i, vs := range pl.deletes {
			keys[i] = vs.Key()
		}
		parts = append(parts, fmt.Sprintf("%s real server %s from %s", del, pl.backend, strings.Join(keys, ", ")))
	}
	if pl.setNodest {
		parts = append(parts, set+" net.ipv4.vs.expire_nodest_conn 0 -> 1")
	}
	return fmt.Sprintf("%s: %d UDP entries of %s pinned to %s (%s) expire on their next packet", strings.Join(parts, " and "),
		pl.pinned, strings.Join(pl.services, ", "), pl.backend, pl.backendKind)
}

func (pl *affinityPlan) details(deleted []string) map[string]any {
	restore := []string{}
	if pl.setNodest {
		restore = append(restore, "sysctl -w net.ipv4.vs.expire_nodest_conn="+pl.nodest)
	}
	del := []string{}
	for _, vs := range pl.deletes {
		del = append(del, vs.Key())
		restore = append(restore, fmt.Sprintf("ipvsadm -a -u %s -r %s -m -w %d", ipvsAddrPort(vs), pl.backend, pl.weights[vs.Key()]))
	}
	d := map[string]any{
		"backend":                  pl.backend.String(),
		"reason":                   pl.backendKind,
		"pinnedEntries":            pl.pinned,
		"services":                 pl.services,
		"realServerIn":             del,
		"previousExpireNodestConn": pl.nodest,
		"restoreCommands":          restore,
	}
	if deleted != nil {
		d["deletedFrom"] = deleted
	}
	return d
}

// Plan implements Action.
func (a *clearIPVSUDPAffinity) Plan(ctx context.Context, f finding.Finding) (Plan, error) {
	pl, err := a.check(ctx, f)
	if err != nil {
		return Plan{}, err
	}
	if len(pl.deletes) > 0 {
		if err := a.lim.wouldAllow(ipvsClock(a.n).Now()); err != nil {
			return Plan{}, err
		}
	}
	return Plan{Summary: pl.summary(false), Details: pl.details(nil)}, nil
}

// Execute implements Action. The sysctl is set first: with the real server
// still programmed it changes nothing for the pinned entries (measured),
// and once it is deleted no entry can be left pinned by the order of the
// two steps.
func (a *clearIPVSUDPAffinity) Execute(ctx context.Context, f finding.Finding) (Result, error) {
	pl, err := a.check(ctx, f)
	if err != nil {
		return Result{}, err
	}
	if pl.setNodest {
		if err := a.sys.Set(expireNodestConnKey, "1"); err != nil {
			return Result{}, fmt.Errorf("setting %s=1 (was %s): %w", expireNodestConnKey, pl.nodest, err)
		}
		if v, err := a.sys.Get(expireNodestConnKey); err != nil || v != "1" {
			return Result{}, fmt.Errorf("%s did not take: reads %q, %v", expireNodestConnKey, v, err)
		}
	}
	deleted := []string{}
	var limited error
	for _, vs := range pl.deletes {
		if err := a.lim.take(ipvsClock(a.n).Now()); err != nil {
			limited = err
			break
		}
		err := a.n.IPVS.DeleteRealServer(ctx, vs, ipvs.RealServer{Address: pl.backend.Addr(), Port: pl.backend.Port()})
		if err != nil && !isIPVSNotFound(err) {
			return Result{Summary: "partial: " + pl.summary(true), Details: pl.details(deleted)},
				ipvsSkipOrErr(fmt.Sprintf("deleting real server %s of %s (expire_nodest_conn set: %v, deleted so far %v)", pl.backend, vs.Key(), pl.setNodest, deleted), err)
		}
		deleted = append(deleted, vs.Key())
	}
	d := pl.details(deleted)
	if limited != nil {
		d["leftForLaterCycles"] = len(pl.deletes) - len(deleted)
		if len(deleted) == 0 && !pl.setNodest {
			return Result{}, limited
		}
	}
	return Result{Summary: pl.summary(true), Details: d}, nil
}
