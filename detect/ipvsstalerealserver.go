package detect

import (
	"context"
	"errors"
	"fmt"

	"github.com/remediate-dev/remediate/internal/conntrack"
	"github.com/remediate-dev/remediate/internal/finding"
	"github.com/remediate-dev/remediate/internal/ipvs"
	"github.com/remediate-dev/remediate/internal/node"
	"github.com/remediate-dev/remediate/policy"
)

// IPVSStaleRealServerParams are the IPVSStaleRealServer thresholds.
type IPVSStaleRealServerParams struct {
	// RequireIPVSMode skips the detector unless kube-proxy runs in IPVS
	// mode: its /proxyMode says so or, when it cannot be asked, its
	// kube-ipvs0 interface exists (default true).
	RequireIPVSMode bool `yaml:"requireIPVSMode"`
	// IncludeDraining also reports TCP/SCTP real servers at weight 0 that
	// still carry connections: kube-proxy keeps those on purpose while
	// they drain (graceful termination). Default false.
	IncludeDraining bool `yaml:"includeDraining"`
	// MaxFindings bounds the findings of one run (default 50).
	MaxFindings int `yaml:"maxFindings"`
}

// SetDefaults sets the defaults of IPVSStaleRealServer (registry.Defaulter).
func (p *IPVSStaleRealServerParams) SetDefaults() {
	*p = IPVSStaleRealServerParams{RequireIPVSMode: true, MaxFindings: 50}
}

// Validate implements policy.Validator.
func (p *IPVSStaleRealServerParams) Validate() []policy.FieldError {
	return ipvsMaxFindingsErr(p.MaxFindings)
}

func init() {
	Define("IPVSStaleRealServer",
		"IPVS real servers of a Service's virtual server that are not a serving endpoint of that Service",
		newIPVSStaleRealServer, Targets(finding.KindIPVSRealServer, finding.KindConntrackBackend), UsesClusterView())
}

type ipvsStaleRealServer struct {
	p IPVSStaleRealServerParams
	n *node.Node
	judgement
}

func newIPVSStaleRealServer(p *IPVSStaleRealServerParams, n *node.Node) (Detector, error) {
	return &ipvsStaleRealServer{p: *p, n: n}, nil
}

func (d *ipvsStaleRealServer) Detect(ctx context.Context) ([]finding.Finding, error) {
	if err := ipvsPrecheck(ctx, d.n, d.p.RequireIPVSMode, true); err != nil {
		return nil, err
	}
	vss, err := d.n.IPVS.VirtualServers(ctx)
	if err != nil {
		return nil, ipvsErr("listing IPVS virtual servers", err)
	}
	desired := ipvs.NewDesired(d.n.Cluster, nil)
	d.set("real servers of %d virtual servers all serving endpoints", len(vss))
	var out []finding.Finding
	for _, vs := range vss {
		fe, ok := desired.Lookup(vs)
		if !ok {
			continue // a stale virtual server: IPVSStaleVirtualServer's job
		}
		rss, err := d.n.IPVS.RealServers(ctx, vs)
		if errors.Is(err, ipvs.ErrNotFound) {
			continue // deleted since the list (kube-proxy is syncing)
		}
		if err != nil {
			return nil, ipvsErr("listing real servers of "+vs.Key(), err)
		}
		type stale struct {
			rs    ipvs.RealServer
			class string
		}
		var bad []stale
		for _, rs := range rss {
			class := fe.SP.Classify(rs.AddrPort())
			if class == ipvs.BackendExpected {
				continue
			}
			if ipvs.Draining(vs, rs) && !d.p.IncludeDraining {
				continue
			}
			bad = append(bad, stale{rs, class})
		}
		for _, b := range bad {
			sev := finding.Warning
			if len(bad) == len(rss) {
				sev = finding.Critical // every destination is stale: traffic is black-holed
			}
			rref := ipvs.RealRef{VS: vs, RS: b.rs}
			ev := rref.Evidence()
			// The backend too: FlushConntrack can act on a UDP one.
			bref := conntrack.BackendRef{Protocol: vs.Protocol, Backend: conntrack.Backend{IP: b.rs.Address, Port: b.rs.Port}}
			bref.PutEvidence(ev)
			ev["service"] = fe.SP.ServiceName()
			ev["portName"] = fe.SP.Port.Name
			ev["frontend"] = fe.Kind
			ev["reason"] = b.class
			ev["weight"] = b.rs.Weight
			ev["activeConns"] = b.rs.ActiveConns
			ev["inactiveConns"] = b.rs.InactiveConns
			ev["realServers"] = len(rss)
			ev["expectedEndpoints"] = ipvsExpectedList(fe.SP)
			out = append(out, finding.Finding{
				Detector: "IPVSStaleRealServer",
				Target:   ipvs.RealRef{VS: vs, RS: b.rs}.Target(),
				Severity: sev,
				Message: fmt.Sprintf("IPVS %s (%s %s) sends to %s, which is %s",
					vs.Key(), fe.SP.ServiceName(), fe.Kind, b.rs.AddrPort(), b.class),
				Evidence: ev,
				Subject:  finding.Subject{Refs: []finding.Ref{rref, bref}},
			})
			if len(out) >= d.p.MaxFindings {
				return out, nil
			}
		}
	}
	return out, nil
}
