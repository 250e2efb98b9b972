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

// SetIPVSTimeoutsParams bound SetIPVSTimeouts.
type SetIPVSTimeoutsParams struct {
	// UDPTimeout is the UDP timeout to lower to (default 30s, at least
	// 1s). A lower current value is left alone: this action never raises
	// the UDP timeout.
	UDPTimeout policy.Duration `yaml:"udpTimeout"`
	// TCPTimeout, when set, is applied too; 0 (default) leaves it as is.
	TCPTimeout policy.Duration `yaml:"tcpTimeout"`
	// TCPFinTimeout, when set, is applied too; 0 (default) leaves it as is.
	TCPFinTimeout policy.Duration `yaml:"tcpFinTimeout"`
}

// SetDefaults sets the defaults of SetIPVSTimeouts (registry.Defaulter).
func (p *SetIPVSTimeoutsParams) SetDefaults() {
	*p = SetIPVSTimeoutsParams{UDPTimeout: policy.D(30 * time.Second)}
}

// Validate implements policy.Validator.
func (p *SetIPVSTimeoutsParams) Validate() []policy.FieldError {
	var errs []policy.FieldError
	check := func(field string, d time.Duration, min time.Duration, optional bool) {
		switch {
		case optional && d == 0:
		case d < min:
			errs = append(errs, policy.FieldError{Field: field, Msg: fmt.Sprintf("must be at least %s", min)})
		case d%time.Second != 0:
			errs = append(errs, policy.FieldError{Field: field, Msg: "must be a whole number of seconds"})
		case d > 24*time.Hour:
			errs = append(errs, policy.FieldError{Field: field, Msg: "must be at most 24h"})
		}
	}
	check("udpTimeout", p.UDPTimeout.Duration, ipvs.MinUDPTimeout, false)
	check("tcpTimeout", p.TCPTimeout.Duration, time.Second, true)
	check("tcpFinTimeout", p.TCPFinTimeout.Duration, time.Second, true)
	return errs
}

func init() {
	Define("SetIPVSTimeouts",
		"lower the IPVS UDP timeout (never below 1s; TCP and TCP-FIN only if set), journaling the previous values",
		newSetIPVSTimeouts, ActsOn(finding.KindIPVSTimeouts))
}

type setIPVSTimeouts struct {
	p SetIPVSTimeoutsParams
	n *node.Node
}

func newSetIPVSTimeouts(p *SetIPVSTimeoutsParams, n *node.Node) (Action, error) {
	return &setIPVSTimeouts{p: *p, n: n}, nil
}

// IPVSTimeoutChange decides the SetTimeouts call for the current timeouts
// and the parameters: zero fields are left unchanged; the UDP timeout is
// only ever lowered and never below 1s. ok is false when nothing changes.
func IPVSTimeoutChange(cur ipvs.Timeouts, p SetIPVSTimeoutsParams) (set ipvs.Timeouts, ok bool) {
	if udp := p.UDPTimeout.Duration; udp >= ipvs.MinUDPTimeout && cur.UDP > udp {
		set.UDP = udp
	}
	if tcp := p.TCPTimeout.Duration; tcp >= time.Second && tcp != cur.TCP {
		set.TCP = tcp
	}
	if fin := p.TCPFinTimeout.Duration; fin >= time.Second && fin != cur.TCPFin {
		set.TCPFin = fin
	}
	return set, set != (ipvs.Timeouts{})
}

func ipvsDescribeTimeoutChange(cur, set ipvs.Timeouts) string {
	part := func(name string, from, to time.Duration) string {
		if to == 0 {
			return fmt.Sprintf("%s %s unchanged", name, from)
		}
		return fmt.Sprintf("%s %s -> %s", name, from, to)
	}
	return fmt.Sprintf("IPVS timeouts: %s, %s, %s", part("UDP", cur.UDP, set.UDP), part("TCP", cur.TCP, set.TCP), part("TCP-FIN", cur.TCPFin, set.TCPFin))
}

func ipvsSecs(d time.Duration) int { return int(d / time.Second) }

func (a *setIPVSTimeouts) current(ctx context.Context) (ipvs.Timeouts, ipvs.Timeouts, error) {
	if a.n.IPVS == nil {
		return ipvs.Timeouts{}, ipvs.Timeouts{}, finding.Skip("%s", a.n.Why("ipvs"))
	}
	cur, err := a.n.IPVS.Timeouts(ctx)
	if err != nil {
		return ipvs.Timeouts{}, ipvs.Timeouts{}, ipvsSkipOrErr("reading IPVS timeouts", err)
	}
	set, ok := IPVSTimeoutChange(cur, a.p)
	if !ok {
		return cur, set, finding.Skip("IPVS timeouts already within bounds (UDP %s <= %s)", cur.UDP, a.p.UDPTimeout.Duration)
	}
	return cur, set, nil
}

// Plan implements Action.
func (a *setIPVSTimeouts) Plan(ctx context.Context, _ finding.Finding) (Plan, error) {
	cur, set, err := a.current(ctx)
	if err != nil {
		return Plan{}, err
	}
	return Plan{
		Summary: "set " + ipvsDescribeTimeoutChange(cur, set),
		Details: ipvsTimeoutDetails(cur, set),
	}, nil
}

func ipvsTimeoutDetails(cur, set ipvs.Timeouts) map[string]any {
	return map[string]any{
		"previousUDPSeconds":    ipvsSecs(cur.UDP),
		"previousTCPSeconds":    ipvsSecs(cur.TCP),
		"previousTCPFinSeconds": ipvsSecs(cur.TCPFin),
		"setUDPSeconds":         ipvsSecs(set.UDP),
		"setTCPSeconds":         ipvsSecs(set.TCP),
		"setTCPFinSeconds":      ipvsSecs(set.TCPFin),
		"restoreCommand":        fmt.Sprintf("ipvsadm --set %d %d %d", ipvsSecs(cur.TCP), ipvsSecs(cur.TCPFin), ipvsSecs(cur.UDP)),
	}
}

// Execute implements Action: it re-reads the timeouts, sets only what
// changes, and reads them back to prove the kernel took them.
func (a *setIPVSTimeouts) Execute(ctx context.Context, _ finding.Finding) (Result, error) {
	cur, set, err := a.current(ctx)
	if err != nil {
		return Result{}, err
	}
	if err := a.n.IPVS.SetTimeouts(ctx, set); err != nil {
		return Result{}, ipvsSkipOrErr("setting IPVS timeouts", err)
	}
	after, err := a.n.IPVS.Timeouts(ctx)
	if err != nil {
		return Result{}, fmt.Errorf("reading IPVS timeouts back after setting them (previous %+v): %w", cur, err)
	}
	if (set.UDP != 0 && after.UDP != set.UDP) || (set.TCP != 0 && after.TCP != set.TCP) || (set.TCPFin != 0 && after.TCPFin != set.TCPFin) {
		return Result{}, fmt.Errorf("IPVS timeouts did not take: asked %+v, kernel reports %+v (previous %+v)", set, after, cur)
	}
	d := ipvsTimeoutDetails(cur, set)
	d["udpSeconds"] = ipvsSecs(after.UDP)
	d["tcpSeconds"] = ipvsSecs(after.TCP)
	d["tcpFinSeconds"] = ipvsSecs(after.TCPFin)
	return Result{Summary: "set " + ipvsDescribeTimeoutChange(cur, set), Details: d}, nil
}
