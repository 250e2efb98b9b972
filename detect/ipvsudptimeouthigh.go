package detect

import (
	"context"
	"fmt"
	"time"

	"github.com/remediate-dev/remediate/internal/finding"
	"github.com/remediate-dev/remediate/internal/ipvs"
	"github.com/remediate-dev/remediate/internal/node"
	"github.com/remediate-dev/remediate/policy"
)

// IPVSUDPTimeoutHighParams are the IPVSUDPTimeoutHigh thresholds.
type IPVSUDPTimeoutHighParams struct {
	// RequireIPVSMode skips the detector unless kube-proxy runs in IPVS
	// mode: its /proxyMode says so or, when it cannot be asked, its
	// kube-ipvs0 interface exists (default true).
	RequireIPVSMode bool `yaml:"requireIPVSMode"`
	// Ceiling is the highest acceptable IPVS UDP timeout (default 60s;
	// the kernel's default is 300s, which keeps DNS clients pinned to a
	// deleted CoreDNS pod for minutes).
	Ceiling policy.Duration `yaml:"ceiling"`
}

// SetDefaults sets the defaults of IPVSUDPTimeoutHigh (registry.Defaulter).
func (p *IPVSUDPTimeoutHighParams) SetDefaults() {
	*p = IPVSUDPTimeoutHighParams{RequireIPVSMode: true, Ceiling: policy.D(60 * time.Second)}
}

// Validate implements policy.Validator.
func (p *IPVSUDPTimeoutHighParams) Validate() []policy.FieldError {
	if p.Ceiling.Duration < ipvs.MinUDPTimeout {
		return []policy.FieldError{{Field: "ceiling", Msg: "must be at least 1s (the kernel's minimum UDP timeout)"}}
	}
	return nil
}

func init() {
	Define("IPVSUDPTimeoutHigh",
		"the IPVS UDP timeout is above the policy's ceiling",
		newIPVSUDPTimeoutHigh, Targets(finding.KindIPVSTimeouts))
}

type ipvsUDPTimeoutHigh struct {
	p IPVSUDPTimeoutHighParams
	n *node.Node
	judgement
}

func newIPVSUDPTimeoutHigh(p *IPVSUDPTimeoutHighParams, n *node.Node) (Detector, error) {
	return &ipvsUDPTimeoutHigh{p: *p, n: n}, nil
}

func (d *ipvsUDPTimeoutHigh) Detect(ctx context.Context) ([]finding.Finding, error) {
	if err := ipvsPrecheck(ctx, d.n, d.p.RequireIPVSMode, false); err != nil {
		return nil, err
	}
	t, err := d.n.IPVS.Timeouts(ctx)
	if err != nil {
		return nil, ipvsErr("reading IPVS timeouts", err)
	}
	if t.UDP <= d.p.Ceiling.Duration {
		d.set("IPVS UDP timeout %s (ceiling %s)", t.UDP, d.p.Ceiling.Duration)
		return nil, nil
	}
	return []finding.Finding{{
		Detector: "IPVSUDPTimeoutHigh",
		Target:   ipvs.TimeoutsTarget,
		Severity: finding.Warning,
		Message:  fmt.Sprintf("IPVS UDP timeout is %s, above the ceiling of %s", t.UDP, d.p.Ceiling.Duration),
		Evidence: map[string]any{
			"udpTimeoutSeconds":    int(t.UDP / time.Second),
			"tcpTimeoutSeconds":    int(t.TCP / time.Second),
			"tcpFinTimeoutSeconds": int(t.TCPFin / time.Second),
			"ceilingSeconds":       int(d.p.Ceiling.Duration / time.Second),
		},
	}}, nil
}
