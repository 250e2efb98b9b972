package action

import (
	"context"
	"fmt"
	"math"
	"net"
	"net/netip"
	"strings"

	"github.com/shirou/gopsutil/v3/common"
	"github.com/shirou/gopsutil/v3/mem"

	"github.com/remediate-dev/remediate/internal/conntrack"
	"github.com/remediate-dev/remediate/internal/finding"
	"github.com/remediate-dev/remediate/internal/node"
	"github.com/remediate-dev/remediate/policy"
)

// Registered names.
const (
	RaiseConntrackMaxName = "RaiseConntrackMax"
	FlushConntrackName    = "FlushConntrack"
)

// FlushConntrack reads the dead backend from the finding's typed
// reference, conntrack.BackendRef in Subject.Refs (set by
// IPVSUDPDeadBackend, IPVSStaleRealServer and, in iptables and nftables
// modes, ConntrackStaleServiceEntries; the same facts are in the evidence
// as backendIP, backendPort, protocol, for people):
//
//	Backend.IP    required: the dead backend's IP (v4 or v6).
//	Backend.Port  optional: its port; 0 = every port of that IP.
//	Protocol      optional: when set it must be "UDP" (case insensitive);
//	              a TCP finding is refused, never widened.
//
// An IP of this node (a hostNetwork backend) is refused without a port: by
// IP alone it would name every UDP conversation the node answers. Entries
// are matched on the reply source only (as `conntrack -D --reply-src`), so
// direct, un-NATed UDP flows to the dead pod IP go too; they are as stale.
//
// The backend is conntrack.BackendRef's encoding.

// RaiseConntrackMaxParams bound RaiseConntrackMax.
type RaiseConntrackMaxParams struct {
	// Factor multiplies the current nf_conntrack_max (used when Step is 0).
	Factor float64 `yaml:"factor"`
	// Step, when > 0, is added instead of multiplying (Factor is then
	// ignored).
	Step uint64 `yaml:"step"`
	// Ceiling is the absolute maximum ever written.
	Ceiling uint64 `yaml:"ceiling"`
	// MemoryFraction of node memory the table may use at BytesPerEntry per
	// entry: a second bound on the new maximum.
	MemoryFraction float64 `yaml:"memoryFraction"`
	// BytesPerEntry is the kernel memory one entry costs (~320 bytes).
	BytesPerEntry uint64 `yaml:"bytesPerEntry"`
	// RaiseHashsize also raises the nf_conntrack hashsize to max/4 (as
	// kube-proxy does), never lowering it.
	RaiseHashsize bool `yaml:"raiseHashsize"`
}

// SetDefaults sets the defaults of RaiseConntrackMax (registry.Defaulter).
func (p *RaiseConntrackMaxParams) SetDefaults() {
	*p = RaiseConntrackMaxParams{Factor: 2, Ceiling: 1 << 20, MemoryFraction: 0.05, BytesPerEntry: 320, RaiseHashsize: true}
}

// Validate implements policy.Validator.
func (p *RaiseConntrackMaxParams) Validate() []policy.FieldError {
	var errs []policy.FieldError
	if p.Step == 0 && !(p.Factor > 1 && p.Factor <= 16) {
		errs = append(errs, policy.FieldError{Field: "factor", Msg: "must be in (1, 16] (or set step)"})
	}
	if p.Ceiling < 1024 || p.Ceiling > math.MaxInt32 {
		errs = append(errs, policy.FieldError{Field: "ceiling", Msg: "must be in [1024, 2147483647]"})
	}
	if !(p.MemoryFraction > 0 && p.MemoryFraction <= 0.5) {
		errs = append(errs, policy.FieldError{Field: "memoryFraction", Msg: "must be in (0, 0.5]"})
	}
	if p.BytesPerEntry < 64 {
		errs = append(errs, policy.FieldError{Field: "bytesPerEntry", Msg: "must be >= 64"})
	}
	return errs
}

// FlushConntrackParams bound FlushConntrack.
type FlushConntrackParams struct {
	// MaxEntries is the most entries deleted in one run; the rest wait for
	// the next run (the finding persists while entries remain).
	MaxEntries int `yaml:"maxEntries"`
}

// Validate implements policy.Validator.
func (p *FlushConntrackParams) Validate() []policy.FieldError {
	if p.MaxEntries < 1 || p.MaxEntries > 1_000_000 {
		return []policy.FieldError{{Field: "maxEntries", Msg: "must be in [1, 1000000]"}}
	}
	return nil
}

func init() {
	Define(RaiseConntrackMaxName,
		"raise nf_conntrack_max by a factor or step (never lower; bounded by a ceiling and a share of node memory), optionally hashsize to max/4",
		newRaiseConntrackMax, ActsOn(finding.KindConntrackTable))
	Define(FlushConntrackName,
		"delete the UDP conntrack entries whose reply source is a dead backend (its IP[, port]), at most maxEntries per run",
		newFlushConntrack, NeedsAPI(), ActsOn(finding.KindConntrackBackend))
}

func newRaiseConntrackMax(p *RaiseConntrackMaxParams, n *node.Node) (Action, error) {
	return &raiseConntrackMax{p: *p, n: n, memTotal: hostMemTotal(n.ProcRoot)}, nil
}

// SetDefaults sets the defaults of FlushConntrack (registry.Defaulter).
func (p *FlushConntrackParams) SetDefaults() {
	*p = FlushConntrackParams{MaxEntries: 50_000}
}

func newFlushConntrack(p *FlushConntrackParams, n *node.Node) (Action, error) {
	return &flushConntrack{p: *p, n: n, isLocal: localAddr}, nil
}

// hostMemTotal reads MemTotal from <procRoot>/meminfo through gopsutil.
func hostMemTotal(procRoot string) func(ctx context.Context) (uint64, error) {
	return func(ctx context.Context) (uint64, error) {
		if procRoot != "" {
			ctx = context.WithValue(ctx, common.EnvKey, common.EnvMap{common.HostProcEnvKey: procRoot})
		}
		vm, err := mem.VirtualMemoryWithContext(ctx)
		if err != nil {
			return 0, fmt.Errorf("read node memory: %w", err)
		}
		return vm.Total, nil
	}
}

type raiseConntrackMax struct {
	p        RaiseConntrackMaxParams
	n        *node.Node
	memTotal func(ctx context.Context) (uint64, error)
}

// maxPlan is the computed change.
type maxPlan struct {
	Current, Target, New uint64
	Ceiling, MemoryBound uint64
	HashCurrent, HashNew uint64
	RaiseHash            bool
	Restore              bool // a drift finding: back to the recorded value
}

// planConntrackMax is the decision, a pure function. target is what the
// finding asks for (growth of cur, or the recorded value for drift); the
// result never lowers cur, never exceeds the ceiling or the memory bound.
// ok is false with a reason when there is nothing safe to do.
func planConntrackMax(p RaiseConntrackMaxParams, cur, target, memTotal, hashCur uint64) (mp maxPlan, reason string, ok bool) {
	mp = maxPlan{Current: cur, Target: target, Ceiling: p.Ceiling, HashCurrent: hashCur, HashNew: hashCur}
	mp.MemoryBound = uint64(float64(memTotal) * p.MemoryFraction / float64(p.BytesPerEntry))
	bound := min(p.Ceiling, mp.MemoryBound)
	mp.New = min(target, bound)
	if mp.New <= cur {
		return mp, fmt.Sprintf("nf_conntrack_max %d is already at or above what the bounds allow (%d: ceiling %d, %.0f%% of %d MiB memory at %d B/entry = %d)",
			cur, bound, p.Ceiling, p.MemoryFraction*100, memTotal>>20, p.BytesPerEntry, mp.MemoryBound), false
	}
	if p.RaiseHashsize && mp.New/4 > hashCur {
		mp.HashNew, mp.RaiseHash = mp.New/4, true
	}
	return mp, "", true
}

// growth is the target for a table finding.
func (a *raiseConntrackMax) growth(cur uint64) uint64 {
	if a.p.Step > 0 {
		return cur + a.p.Step
	}
	v := math.Ceil(float64(cur) * a.p.Factor)
	if v > math.MaxInt32 {
		return math.MaxInt32
	}
	return uint64(v)
}

func (a *raiseConntrackMax) compute(ctx context.Context, f finding.Finding) (maxPlan, error) {
	ct := a.n.Conntrack
	if ct == nil {
		return maxPlan{}, finding.Skip("%s", a.n.Why("conntrack"))
	}
	cur, err := ct.Max(ctx)
	if err != nil {
		return maxPlan{}, fmt.Errorf("read nf_conntrack_max: %w", err)
	}
	if cur == 0 {
		return maxPlan{}, finding.Skip("nf_conntrack_max reads 0: refusing to size from nothing")
	}
	var hash uint64
	if a.p.RaiseHashsize {
		if hash, err = ct.HashSize(ctx); err != nil {
			return maxPlan{}, fmt.Errorf("read conntrack hashsize: %w", err)
		}
	}
	memTotal, err := a.memTotal(ctx)
	if err != nil {
		return maxPlan{}, err
	}
	target, restore := a.growth(cur), false
	ref, hasRef := finding.RefOf[conntrack.TableRef](f.Subject)
	if f.Target == conntrack.DriftTarget {
		if !hasRef || ref.LastSetMax == 0 {
			return maxPlan{}, finding.Skip("drift finding without the value remediate last set (conntrack.TableRef.LastSetMax)")
		}
		target, restore = ref.LastSetMax, true
	} else if seen := ref.Max; hasRef && cur > seen {
		// Someone raised it since detection: the finding is stale.
		return maxPlan{}, finding.Skip("nf_conntrack_max changed since detection (%d -> %d): waiting for a fresh detection", seen, cur)
	}
	mp, reason, ok := planConntrackMax(a.p, cur, target, memTotal, hash)
	mp.Restore = restore
	if !ok {
		return mp, finding.Skip("%s", reason)
	}
	return mp, nil
}

func (mp maxPlan) summary(verb string) string {
	s := fmt.Sprintf("%s nf_conntrack_max from %d to %d", verb, mp.Current, mp.New)
	if mp.Restore {
		s += " (restoring the value remediate set before it was reset)"
	}
	if mp.New < mp.Target {
		s += fmt.Sprintf(" (capped: wanted %d, ceiling %d, memory bound %d)", mp.Target, mp.Ceiling, mp.MemoryBound)
	}
	if mp.RaiseHash {
		s += fmt.Sprintf("; hashsize from %d to %d", mp.HashCurrent, mp.HashNew)
	}
	return s
}

func (mp maxPlan) details() map[string]any {
	d := map[string]any{
		"previousMax": mp.Current,
		"newMax":      mp.New,
		"targetMax":   mp.Target,
		"ceiling":     mp.Ceiling,
		"memoryBound": mp.MemoryBound,
	}
	if mp.RaiseHash {
		d["previousHashSize"] = mp.HashCurrent
		d["newHashSize"] = mp.HashNew
	}
	return d
}

// Plan implements Action.
func (a *raiseConntrackMax) Plan(ctx context.Context, f finding.Finding) (Plan, error) {
	mp, err := a.compute(ctx, f)
	if err != nil {
		return Plan{}, err
	}
	return Plan{Summary: mp.summary("raise"), Details: mp.details()}, nil
}

// Execute implements Action: it re-reads the current values, writes the new
// max, reads it back, then the hashsize. A hashsize failure after the max
// was raised is reported in the result (the max change stands).
func (a *raiseConntrackMax) Execute(ctx context.Context, f finding.Finding) (Result, error) {
	mp, err := a.compute(ctx, f)
	if err != nil {
		return Result{}, err
	}
	ct := a.n.Conntrack
	if err := ct.SetMax(ctx, mp.New); err != nil {
		return Result{Details: mp.details()}, fmt.Errorf("write nf_conntrack_max %d (was %d): %w", mp.New, mp.Current, err)
	}
	got, err := ct.Max(ctx)
	if err != nil || got != mp.New {
		return Result{Details: mp.details()}, fmt.Errorf("nf_conntrack_max reads %d after writing %d: %v", got, mp.New, err)
	}
	res := Result{Summary: mp.summary("raised"), Details: mp.details()}
	if mp.RaiseHash {
		if err := ct.SetHashSize(ctx, mp.HashNew); err != nil {
			res.Summary += fmt.Sprintf(" (hashsize NOT changed: %v)", err)
			res.Details["hashSizeError"] = err.Error()
			delete(res.Details, "newHashSize")
		}
	}
	return res, nil
}

type flushConntrack struct {
	p FlushConntrackParams
	n *node.Node
	// isLocal reports whether an address is the node's own (interface
	// addresses of the daemon's network namespace, loopback).
	isLocal func(netip.Addr) (bool, error)
}

// localAddr is the real isLocal.
func localAddr(ip netip.Addr) (bool, error) {
	if ip.IsLoopback() {
		return true, nil
	}
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		return false, fmt.Errorf("list local addresses: %w", err)
	}
	for _, a := range addrs {
		if pfx, ok := a.(*net.IPNet); ok {
			if la, ok := netip.AddrFromSlice(pfx.IP); ok && la.Unmap() == ip {
				return true, nil
			}
		}
	}
	return false, nil
}

// backendOf reads the dead backend from a finding's typed reference
// (conntrack.BackendRef) and refuses anything but UDP: a TCP finding is
// refused, never widened.
func backendOf(f finding.Finding) (conntrack.Backend, error) {
	r, err := refOf[conntrack.BackendRef](f, "backend")
	if err == nil {
		err = r.Backend.Validate()
	}
	if err == nil && r.Protocol != "" && !strings.EqualFold(r.Protocol, "UDP") {
		err = fmt.Errorf("finding is about protocol %s: FlushConntrack only deletes UDP entries", r.Protocol)
	}
	return r.Backend, err
}

func (a *flushConntrack) backend(f finding.Finding) (conntrack.Interface, conntrack.Backend, error) {
	ct := a.n.Conntrack
	if ct == nil {
		return nil, conntrack.Backend{}, finding.Skip("%s", a.n.Why("conntrack"))
	}
	b, err := backendOf(f)
	if err != nil {
		return nil, b, finding.Skip("cannot name the dead backend: %v", err)
	}
	if b.Port == 0 {
		// A hostNetwork backend has the node's address: without a port,
		// "reply source = node IP" is every UDP conversation the node
		// answers, not one dead backend.
		local, err := a.isLocal(b.IP)
		if err != nil {
			return nil, b, err
		}
		if local {
			return nil, b, finding.Skip("backend %s is an address of this node: refusing to flush by IP alone (needs backendPort)", b.IP)
		}
	}
	return ct, b, nil
}

// Plan implements Action, deleting nothing. When the finding carries the
// count its detector took this cycle (Subject.Conntrack.Entries, from the
// same table), the plan uses it and does not dump the table a second time (the
// count was ~40% of the action's time on a 250k-entry table); otherwise it
// counts (streaming, kernel-filtered) what would be deleted. Execute
// reports what it really deleted either way.
func (a *flushConntrack) Plan(ctx context.Context, f finding.Finding) (Plan, error) {
	ct, b, err := a.backend(f)
	if err != nil {
		return Plan{}, err
	}
	if c := f.Subject.Conntrack; c != nil && c.Entries > 0 {
		seen := c.Entries
		d := map[string]any{"backend": b.String(), "seenByDetector": seen, "maxEntries": a.p.MaxEntries}
		s := fmt.Sprintf("delete the UDP conntrack entries with reply source %s (%d seen by %s this cycle; at most %d)", b, seen, f.Detector, a.p.MaxEntries)
		return Plan{Summary: s, Details: d}, nil
	}
	n, err := ct.CountUDPByReplySource(ctx, b, a.p.MaxEntries)
	if err != nil {
		return Plan{}, err
	}
	if n == 0 {
		return Plan{}, finding.Skip("no UDP conntrack entries with reply source %s", b)
	}
	d := map[string]any{"backend": b.String(), "matching": n, "maxEntries": a.p.MaxEntries}
	if n > a.p.MaxEntries {
		d["matching"] = fmt.Sprintf(">%d", a.p.MaxEntries)
		return Plan{Summary: fmt.Sprintf("delete %d UDP conntrack entries with reply source %s (more than %d match: the rest next run)", a.p.MaxEntries, b, a.p.MaxEntries), Details: d}, nil
	}
	return Plan{Summary: fmt.Sprintf("delete %d UDP conntrack entries with reply source %s", n, b), Details: d}, nil
}

// Execute implements Action.
func (a *flushConntrack) Execute(ctx context.Context, f finding.Finding) (Result, error) {
	ct, b, err := a.backend(f)
	if err != nil {
		return Result{}, err
	}
	res, err := ct.DeleteUDPByReplySource(ctx, b, a.p.MaxEntries)
	d := map[string]any{
		"backend":        b.String(),
		"matched":        res.Matched,
		"deleted":        res.Deleted,
		"vanished":       res.Vanished,
		"truncated":      res.Truncated,
		"kernelFiltered": res.KernelFiltered,
		"durationMs":     res.Duration.Milliseconds(),
		"maxEntries":     a.p.MaxEntries,
	}
	if err != nil {
		return Result{Details: d}, err
	}
	s := fmt.Sprintf("deleted %d UDP conntrack entries with reply source %s", res.Deleted, b)
	if res.Vanished > 0 {
		s += fmt.Sprintf(" (%d were already gone)", res.Vanished)
	}
	if res.Truncated {
		s += fmt.Sprintf("; more remain (limit %d per run)", a.p.MaxEntries)
	}
	return Result{Summary: s, Details: d}, nil
}
