package action

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/remediate-dev/remediate/internal/conntrack"
	"github.com/remediate-dev/remediate/internal/finding"
	"github.com/remediate-dev/remediate/internal/node"
	"github.com/remediate-dev/remediate/policy"
)

// SetConntrackTimeoutsName is the registered name.
const SetConntrackTimeoutsName = "SetConntrackTimeouts"

// Floors of SetConntrackTimeouts: no policy can ask for less.
//
//   - nf_conntrack_udp_timeout_stream >= 30 s and never below the node's
//     nf_conntrack_udp_timeout (unreplied, default 30 s): a conversation
//     that answered must not be forgotten sooner than a probe that did not.
//     UDP keepalives are commonly 20-25 s (WireGuard's persistent
//     keepalive 25 s, NAT keepalives); an entry that expires between two
//     packets of a Service flow is re-created and may be DNATed to another
//     backend mid-conversation.
//   - nf_conntrack_tcp_timeout_time_wait >= 30 s: the endpoints' own
//     TIME_WAIT is 60 s on Linux (TCP_TIMEWAIT_LEN), 2*MSL elsewhere; a
//     conntrack entry forgotten much earlier turns late segments of the old
//     connection into INVALID (or, with nf_conntrack_tcp_loose, a new
//     mid-stream entry). 30 s is the common tuning for busy NAT gateways.
//
// Kernel defaults: udp_timeout_stream 120 s (180 s before Linux 6.0),
// tcp_timeout_time_wait 120 s.
const (
	MinUDPStreamTimeout   = 30 * time.Second
	MinTCPTimeWaitTimeout = 30 * time.Second
)

// MinPartialBreakdown is the fewest entries a partial breakdown (dump
// stopped at its limit or deadline) must cover to be acted on: the dump
// walks the kernel's hash table, so its first entries are a sample
// unrelated to their class, and 10,000 of them put a share within about
// ±1.3 points (95%).
const MinPartialBreakdown = 10_000

// SetConntrackTimeoutsParams bound SetConntrackTimeouts.
type SetConntrackTimeoutsParams struct {
	// UDPStreamTimeout is what nf_conntrack_udp_timeout_stream is lowered
	// to when replied UDP entries (class udp/stream) fill the table
	// (default 60s; at least 30s and never below
	// nf_conntrack_udp_timeout). 0 never changes it.
	UDPStreamTimeout policy.Duration `yaml:"udpStreamTimeout"`
	// TCPTimeWaitTimeout is what nf_conntrack_tcp_timeout_time_wait is
	// lowered to when TIME_WAIT entries fill the table (default 60s; at
	// least 30s). 0 never changes it.
	TCPTimeWaitTimeout policy.Duration `yaml:"tcpTimeWaitTimeout"`
	// MinShare is the share of the table one class must hold before its
	// timeout is lowered (from the finding's breakdown: exact counts).
	MinShare float64 `yaml:"minShare"`
}

// SetDefaults sets the defaults of SetConntrackTimeouts
// (registry.Defaulter).
func (p *SetConntrackTimeoutsParams) SetDefaults() {
	*p = SetConntrackTimeoutsParams{
		UDPStreamTimeout:   policy.D(60 * time.Second),
		TCPTimeWaitTimeout: policy.D(60 * time.Second),
		MinShare:           0.5,
	}
}

// Validate implements policy.Validator.
func (p *SetConntrackTimeoutsParams) Validate() []policy.FieldError {
	var errs []policy.FieldError
	check := func(field string, d, floor time.Duration) {
		switch {
		case d == 0:
		case d < floor:
			errs = append(errs, policy.FieldError{Field: field, Msg: fmt.Sprintf("must be 0 (leave it) or at least %s", floor)})
		case d%time.Second != 0:
			errs = append(errs, policy.FieldError{Field: field, Msg: "must be a whole number of seconds"})
		case d > time.Hour:
			errs = append(errs, policy.FieldError{Field: field, Msg: "must be at most 1h"})
		}
	}
	check("udpStreamTimeout", p.UDPStreamTimeout.Duration, MinUDPStreamTimeout)
	check("tcpTimeWaitTimeout", p.TCPTimeWaitTimeout.Duration, MinTCPTimeWaitTimeout)
	if p.UDPStreamTimeout.Duration == 0 && p.TCPTimeWaitTimeout.Duration == 0 {
		errs = append(errs, policy.FieldError{Field: "udpStreamTimeout", Msg: "udpStreamTimeout and tcpTimeWaitTimeout are both 0: nothing to do"})
	}
	if !(p.MinShare >= 0.2 && p.MinShare <= 1) {
		errs = append(errs, policy.FieldError{Field: "minShare", Msg: "must be in [0.2, 1]"})
	}
	return errs
}

func init() {
	Define(SetConntrackTimeoutsName,
		"lower nf_conntrack_udp_timeout_stream / nf_conntrack_tcp_timeout_time_wait (never below 30s) when the breakdown of a full table shows replied UDP or TIME_WAIT entries dominate, journaling the previous values and the command that restores them",
		newSetConntrackTimeouts, ActsOnDetectors("ConntrackExhaustion"))
}

type setConntrackTimeouts struct {
	p SetConntrackTimeoutsParams
	n *node.Node
}

func newSetConntrackTimeouts(p *SetConntrackTimeoutsParams, n *node.Node) (Action, error) {
	return &setConntrackTimeouts{p: *p, n: n}, nil
}

// ConntrackTimeoutChange is the decision, a pure function of the table's
// breakdown, the current timeouts and the bounds. A class's timeout is
// lowered only when that class holds at least MinShare of the dumped
// entries (a partial dump must cover MinPartialBreakdown entries), only ever lowered, and never below its floor (for UDP streams
// also the node's unreplied UDP timeout). ok is false with the reason when
// nothing changes.
func ConntrackTimeoutChange(c conntrack.Composition, cur conntrack.Timeouts, p SetConntrackTimeoutsParams) (set conntrack.Timeouts, why string, ok bool) {
	if c.Total == 0 {
		return set, "the finding has no breakdown of the table (dump failed, empty, or breakdown off): cannot tell what fills it", false
	}
	if c.Truncated && c.Total < MinPartialBreakdown {
		return set, fmt.Sprintf("the breakdown is partial (the dump stopped after %d entries, fewer than %d): too small a sample to act on", c.Total, MinPartialBreakdown), false
	}
	var notes []string
	consider := func(class conntrack.Class, name string, want, floor, current time.Duration, out *time.Duration) {
		share := c.Share(class)
		switch {
		case want == 0:
			return
		case share < p.MinShare:
			notes = append(notes, fmt.Sprintf("%s holds %.0f%% of the table (below minShare %.0f%%)", class, 100*share, 100*p.MinShare))
			return
		}
		target := max(want, floor)
		if current <= target {
			notes = append(notes, fmt.Sprintf("%s holds %.0f%% but %s is already %s (<= %s)", class, 100*share, name, current, target))
			return
		}
		*out = target
	}
	consider(conntrack.ClassUDPStream, "nf_conntrack_udp_timeout_stream", p.UDPStreamTimeout.Duration, max(MinUDPStreamTimeout, cur.UDP), cur.UDPStream, &set.UDPStream)
	consider(conntrack.ClassTCPTimeWait, "nf_conntrack_tcp_timeout_time_wait", p.TCPTimeWaitTimeout.Duration, MinTCPTimeWaitTimeout, cur.TCPTimeWait, &set.TCPTimeWait)
	if set == (conntrack.Timeouts{}) {
		if len(notes) == 0 {
			notes = append(notes, "no timeout to change")
		}
		return set, "no class whose timeout this action tunes dominates: " + strings.Join(notes, "; "), false
	}
	return set, "", true
}

func describeTimeoutChange(cur, set conntrack.Timeouts) string {
	var parts []string
	if set.UDPStream > 0 {
		parts = append(parts, fmt.Sprintf("nf_conntrack_udp_timeout_stream %s -> %s", cur.UDPStream, set.UDPStream))
	}
	if set.TCPTimeWait > 0 {
		parts = append(parts, fmt.Sprintf("nf_conntrack_tcp_timeout_time_wait %s -> %s", cur.TCPTimeWait, set.TCPTimeWait))
	}
	return strings.Join(parts, ", ")
}

// previousOf keeps the current value of each field set changes: what the
// restore command sets back.
func previousOf(cur, set conntrack.Timeouts) conntrack.Timeouts {
	var prev conntrack.Timeouts
	if set.UDPStream > 0 {
		prev.UDPStream = cur.UDPStream
	}
	if set.TCPTimeWait > 0 {
		prev.TCPTimeWait = cur.TCPTimeWait
	}
	return prev
}

func timeoutDetails(cur, set conntrack.Timeouts, c conntrack.Composition) map[string]any {
	secs := func(d time.Duration) int64 { return int64(d / time.Second) }
	d := map[string]any{
		"previousUDPStreamSeconds":   secs(cur.UDPStream),
		"previousTCPTimeWaitSeconds": secs(cur.TCPTimeWait),
		"udpSeconds":                 secs(cur.UDP),
		"udpStreamShare":             round3(c.Share(conntrack.ClassUDPStream)),
		"tcpTimeWaitShare":           round3(c.Share(conntrack.ClassTCPTimeWait)),
		"restoreCommand":             previousOf(cur, set).RestoreCommand(),
	}
	if set.UDPStream > 0 {
		d["setUDPStreamSeconds"] = secs(set.UDPStream)
	}
	if set.TCPTimeWait > 0 {
		d["setTCPTimeWaitSeconds"] = secs(set.TCPTimeWait)
	}
	if len(c.TopDestinations) > 0 {
		d["topDestination"] = c.TopDestinations[0].Endpoint.String()
	}
	return d
}

func round3(v float64) float64 { return float64(int64(v*1000+0.5)) / 1000 }

// compute reads the finding's breakdown and the current timeouts and
// decides.
func (a *setConntrackTimeouts) compute(ctx context.Context, f finding.Finding) (conntrack.TimeoutTuner, conntrack.Composition, conntrack.Timeouts, conntrack.Timeouts, error) {
	var comp conntrack.Composition
	var cur, set conntrack.Timeouts
	if a.n.Conntrack == nil {
		return nil, comp, cur, set, finding.Skip("%s", a.n.Why("conntrack"))
	}
	tt, ok := a.n.Conntrack.(conntrack.TimeoutTuner)
	if !ok {
		return nil, comp, cur, set, finding.Skip("the conntrack adapter cannot set timeouts")
	}
	if f.Target != conntrack.TableTarget {
		return nil, comp, cur, set, finding.Skip("finding %s is not about the table filling up", f.Target)
	}
	if ref, ok := finding.RefOf[conntrack.TableRef](f.Subject); ok && ref.Composition != nil {
		comp = *ref.Composition
	}
	cur, err := tt.Timeouts(ctx)
	if err != nil {
		return nil, comp, cur, set, fmt.Errorf("read conntrack timeouts: %w", err)
	}
	set, why, ok := ConntrackTimeoutChange(comp, cur, a.p)
	if !ok {
		return nil, comp, cur, set, finding.Skip("%s", why)
	}
	return tt, comp, cur, set, nil
}

// Plan implements Action: it reads, decides and changes nothing.
func (a *setConntrackTimeouts) Plan(ctx context.Context, f finding.Finding) (Plan, error) {
	_, comp, cur, set, err := a.compute(ctx, f)
	if err != nil {
		return Plan{}, err
	}
	return Plan{Summary: "lower " + describeTimeoutChange(cur, set) + " (undo: " + previousOf(cur, set).RestoreCommand() + ")",
		Details: timeoutDetails(cur, set, comp)}, nil
}

// Execute implements Action: it re-reads the timeouts, decides again,
// writes only what changes and reads the values back.
func (a *setConntrackTimeouts) Execute(ctx context.Context, f finding.Finding) (Result, error) {
	tt, comp, cur, set, err := a.compute(ctx, f)
	if err != nil {
		return Result{}, err
	}
	d := timeoutDetails(cur, set, comp)
	if err := tt.SetTimeouts(ctx, set); err != nil {
		// A partial write is possible (UDP set, TIME_WAIT failed): the
		// restore command covers both.
		return Result{Details: d}, fmt.Errorf("set conntrack timeouts (%s; undo: %s): %w", describeTimeoutChange(cur, set), d["restoreCommand"], err)
	}
	after, err := tt.Timeouts(ctx)
	if err != nil {
		return Result{Details: d}, fmt.Errorf("read conntrack timeouts back after setting them (undo: %s): %w", d["restoreCommand"], err)
	}
	if (set.UDPStream > 0 && after.UDPStream != set.UDPStream) || (set.TCPTimeWait > 0 && after.TCPTimeWait != set.TCPTimeWait) {
		return Result{Details: d}, fmt.Errorf("conntrack timeouts did not take: asked %s, kernel reports udp_timeout_stream %s, tcp_timeout_time_wait %s",
			describeTimeoutChange(cur, set), after.UDPStream, after.TCPTimeWait)
	}
	d["udpStreamSeconds"] = int64(after.UDPStream / time.Second)
	d["tcpTimeWaitSeconds"] = int64(after.TCPTimeWait / time.Second)
	return Result{Summary: "lowered " + describeTimeoutChange(cur, set) + " (undo: " + previousOf(cur, set).RestoreCommand() + ")", Details: d}, nil
}
