package action

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"syscall"
	"time"

	"go.uber.org/zap"

	"github.com/remediate-dev/remediate/internal/clip"
	"github.com/remediate-dev/remediate/internal/cluster"
	"github.com/remediate-dev/remediate/internal/finding"
	"github.com/remediate-dev/remediate/internal/node"
	"github.com/remediate-dev/remediate/internal/procident"
	"github.com/remediate-dev/remediate/internal/procs"
	"github.com/remediate-dev/remediate/policy"
)

// KillProcessParams bound KillProcess.
type KillProcessParams struct {
	// Names is the allowlist of argv[0] basenames that may be killed;
	// the process must still match immediately before every signal.
	Names []string `yaml:"names"`
	// GracePeriod is how long to wait after SIGTERM before SIGKILL.
	GracePeriod policy.Duration `yaml:"gracePeriod"`
	// KillWait is how long to wait for the process to be gone after
	// SIGKILL before reporting failure (a process in D state dies only
	// when it leaves the kernel).
	KillWait policy.Duration `yaml:"killWait"`
	// MinHoldTime applies to lock-holder findings (from
	// XtablesLockContention, the hold time it measured): the holder is
	// killed only when it has held the lock at least this long.
	MinHoldTime policy.Duration `yaml:"minHoldTime"`
	// Programs are the executables (basenames of /proc/<pid>/exe) a
	// target must run where its executable is readable (CAP_SYS_PTRACE: a
	// second opinion), checked immediately before every signal with its
	// identity (its cgroup: kube-proxy's or a CNI agent's pod on this node
	// per the API, or a host process), CAP_NET_ADMIN and its progress: a
	// target whose CPU time advanced since the detector judged it is
	// refused.
	Programs []string `yaml:"programs"`
	// Parents restricts programs by their parent: a process whose argv[0]
	// basename is a key may be killed only while its parent's command
	// name (comm) is one of the listed names and the parent passes the
	// identity checks of that program (for kube-proxy: this node's
	// kube-proxy by its pod's cgroup and the API, or a host process;
	// CAP_NET_ADMIN, the node's network namespace; where readable its
	// executable and Go build information), re-checked before every
	// signal.
	// Default {nft: [kube-proxy]}: a stuck nft of kube-proxy's sync may be
	// killed, an administrator's nft (or one under an impostor named
	// kube-proxy) never.
	Parents map[string][]string `yaml:"parents"`
}

// SetDefaults sets the defaults of KillProcess (registry.Defaulter).
func (p *KillProcessParams) SetDefaults() {
	*p = KillProcessParams{
		Names:       append(append([]string(nil), procs.RestoreNames...), "nft"),
		Parents:     map[string][]string{"nft": {"kube-proxy"}},
		GracePeriod: policy.D(5 * time.Second),
		KillWait:    policy.D(5 * time.Second),
		MinHoldTime: policy.D(30 * time.Second),
		Programs:    append([]string(nil), procs.NetfilterPrograms...),
	}
}

// Validate implements policy.Validator.
func (p *KillProcessParams) Validate() []policy.FieldError {
	var errs []policy.FieldError
	if len(p.Names) == 0 {
		errs = append(errs, policy.FieldError{Field: "names", Msg: "must allow at least one program name"})
	}
	for i, n := range p.Names {
		if n == "" || strings.ContainsRune(n, '/') {
			errs = append(errs, policy.FieldError{Field: fmt.Sprintf("names[%d]", i), Msg: "must be a program name (argv[0] basename), not empty or a path"})
		}
	}
	if len(p.Programs) == 0 {
		errs = append(errs, policy.FieldError{Field: "programs", Msg: "must name at least one executable"})
	}
	for i, n := range p.Programs {
		if n == "" || strings.ContainsRune(n, '/') {
			errs = append(errs, policy.FieldError{Field: fmt.Sprintf("programs[%d]", i), Msg: "must be an executable's basename, not empty or a path"})
		}
	}
	if p.GracePeriod.Duration <= 0 {
		errs = append(errs, policy.FieldError{Field: "gracePeriod", Msg: "must be > 0"})
	}
	if p.KillWait.Duration <= 0 {
		errs = append(errs, policy.FieldError{Field: "killWait", Msg: "must be > 0"})
	}
	if p.MinHoldTime.Duration < 0 {
		errs = append(errs, policy.FieldError{Field: "minHoldTime", Msg: "must be >= 0"})
	}
	for name, parents := range p.Parents {
		if len(parents) == 0 {
			errs = append(errs, policy.FieldError{Field: "parents." + name, Msg: "must list at least one parent command name (remove the entry to allow any parent)"})
		}
	}
	return errs
}

func init() {
	Define("KillProcess",
		"SIGTERM, grace period, SIGKILL a process target (hung iptables-restore, stuck xtables lock holder, kube-proxy's stuck nft), re-checking identity, allowlist and required parent before each signal",
		newKillProcess, ActsOn(finding.KindProcess),
		APIOptional("it names a process by its pod only through procident.PodsOf, which refuses a watch of this node's pods that is missing, unsynced or disconnected; a process in a pod's cgroup is then refused (whose pod it is cannot be told), a host process needs no view"))
}

type killProcess struct {
	p    KillProcessParams
	n    *node.Node
	poll time.Duration
}

func newKillProcess(p *KillProcessParams, n *node.Node) (Action, error) {
	return &killProcess{p: *p, n: n, poll: 50 * time.Millisecond}, nil
}

// target decodes the finding's process reference (once per Plan or
// Execute); a finding about anything else is a skip.
func (a *killProcess) target(f finding.Finding) (procs.Ref, error) {
	if a.n.Procs == nil {
		return procs.Ref{}, finding.Skip("%s", a.n.Why("procs"))
	}
	ref, err := procs.ParseRef(f.Target)
	if err != nil {
		return ref, finding.Skip("not a process target: %v", err)
	}
	return ref, nil
}

// check resolves the process reference to the live process and applies
// every refusal rule. It returns a finding.Skip error when the action must
// not (or need not) act. baseline is the CPU time (ticks) the process had
// at the last read judged (the finding's, then the one before the last
// signal): a process that used CPU since is making progress and is
// refused.
func (a *killProcess) check(ctx context.Context, ref procs.Ref, f finding.Finding, baseline uint64) (procs.Process, error) {
	if a.n.Procs == nil {
		return procs.Process{}, finding.Skip("%s", a.n.Why("procs"))
	}
	if err := a.n.Procs.CheckPIDNamespace(); err != nil {
		return procs.Process{}, finding.Skip("refusing to signal: %v", err)
	}
	pid, ct := ref.Pid, ref.CreateTimeMs
	if pid == 1 {
		return procs.Process{}, finding.Skip("refusing to signal pid 1")
	}
	if pid == a.n.Procs.Self() {
		return procs.Process{}, finding.Skip("refusing to signal remediate itself (pid %d)", pid)
	}
	if err := a.holdCheck(f); err != nil {
		return procs.Process{}, err
	}
	sp := f.Subject.Process
	switch {
	case sp == nil || !sp.ProgressChecked && !sp.MakingProgress:
		return procs.Process{}, finding.Skip("the finding did not judge pid %d's progress (CPU time over a window): not killed on age alone", pid)
	case sp.MakingProgress:
		return procs.Process{}, finding.Skip("pid %d was making progress (CPU time advancing) when the detector looked: at work, not hung", pid)
	}
	cur, err := a.n.Procs.Get(ctx, pid)
	if errors.Is(err, procs.ErrNotFound) {
		return procs.Process{}, finding.Skip("pid %d is gone", pid)
	}
	if err != nil {
		return procs.Process{}, fmt.Errorf("re-reading pid %d: %w", pid, err)
	}
	if cur.CreateTimeMs != ct {
		return procs.Process{}, finding.Skip("pid %d is now another process (created %d, finding was about %d)", pid, cur.CreateTimeMs, ct)
	}
	if cur.CPUTicks > baseline || cur.State == "R" {
		return procs.Process{}, finding.Skip("pid %d is making progress: %.2f s of CPU since the last read (state %s; the detector saw none in %.0f s): not hung",
			pid, float64(cur.CPUTicks-min(baseline, cur.CPUTicks))/procs.TicksPerSecond, cur.State, sp.ProgressWindowSeconds)
	}
	if !slices.Contains(a.p.Names, cur.Name()) {
		return procs.Process{}, finding.Skip("pid %d runs %q, which is not in the allowlist %v", pid, cur.Name(), a.p.Names)
	}
	pods := procident.PodsOf(a.n.Pods, a.n.Clock.Now())
	onLock := sp.HoldsXtablesLock || sp.WaitsOnXtablesLock
	id := procident.Target(cur, pods, procident.Agents(cluster.DefaultCNIAgents()), a.p.Programs, a.n.Procs.SelfNetKey(), onLock)
	if !id.OK() {
		return procs.Process{}, finding.Skip("pid %d (%s) is not a target: %s", pid, cur.Name(), id.Refused)
	}
	if parents, ok := a.p.Parents[cur.Name()]; ok {
		if !slices.Contains(parents, cur.ParentName) {
			return procs.Process{}, finding.Skip("pid %d (%s) has parent %q (pid %d), not one of %v", pid, cur.Name(), cur.ParentName, cur.PPid, parents)
		}
		if err := a.checkParent(ctx, cur, id, pods); err != nil {
			return procs.Process{}, err
		}
	}
	return cur, nil
}

// checkParent applies to a required parent the identity checks of a
// target: its name is only what it calls itself (a copy of bash named
// kube-proxy has it). The parent must be the process that started cur
// (created before it); a kube-proxy parent must be this node's kube-proxy
// (procident.KubeProxy: its pod's cgroup per the API, or a host process
// with CAP_NET_ADMIN), any other an agent's or a host process; a child in
// a pod's cgroup must be in its parent's pod; and the parent must pass
// procs.CheckProgram (CAP_NET_ADMIN, the node's network namespace; with
// CAP_SYS_PTRACE its executable and, for kube-proxy, the Go build
// information of kube-proxy's main package, as a second opinion).
// Re-checked before every signal, with the rest of check.
func (a *killProcess) checkParent(ctx context.Context, cur procs.Process, childID procident.Identity, pods procident.Pods) error {
	refuse := func(format string, args ...any) error {
		return finding.Skip("pid %d (%s): its parent %q (pid %d) is not a real %s: %s", cur.Pid, cur.Name(), cur.ParentName, cur.PPid, cur.ParentName, fmt.Sprintf(format, args...))
	}
	if cur.PPid <= 0 {
		return refuse("no parent visible")
	}
	pp, err := a.n.Procs.Get(ctx, cur.PPid)
	if errors.Is(err, procs.ErrNotFound) {
		return refuse("it is gone")
	}
	if err != nil {
		return fmt.Errorf("re-reading pid %d's parent %d: %w", cur.Pid, cur.PPid, err)
	}
	if pp.Comm != cur.ParentName || pp.CreateTimeMs > cur.CreateTimeMs {
		return refuse("pid %d is now another process (%q, created %d; the child was created %d)", pp.Pid, pp.Comm, pp.CreateTimeMs, cur.CreateTimeMs)
	}
	var parentID procident.Identity
	if cur.ParentName == cluster.KubeProxyAgent().Name {
		parentID = procident.KubeProxy(pp, pods, a.n.Procs.SelfNetKey())
	} else {
		parentID = procident.Of(pp, pods, procident.Agents(cluster.DefaultCNIAgents()))
	}
	if !parentID.OK() {
		return refuse("%s", parentID.Refused)
	}
	if childID.Method == procident.CgroupAPI && childID.PodUID != parentID.PodUID {
		return refuse("the child runs in pod %s's cgroup, its parent in %s", childID.PodUID, orUnknown(parentID.PodUID))
	}
	goMain, goErr := "", error(nil)
	if _, ok := procs.GoMainPackages[cur.ParentName]; ok && pp.Exe != "" {
		goMain, goErr = a.n.Procs.GoMain(ctx, pp.Pid)
	}
	if err := procs.CheckProgram(pp, cur.ParentName, a.n.Procs.SelfNetKey(), goMain, goErr); err != nil {
		return refuse("%v", err)
	}
	return nil
}

// holdsLock says the finding is about a holder of the xtables lock.
func holdsLock(f finding.Finding) bool {
	return f.Subject.Process != nil && f.Subject.Process.HoldsXtablesLock
}

func orUnknown(s string) string {
	if s == "" {
		return "unknown"
	}
	return s
}

// holdCheck applies MinHoldTime to lock-holder findings (the hold
// measured by XtablesLockContention).
func (a *killProcess) holdCheck(f finding.Finding) error {
	sp := f.Subject.Process
	if sp == nil || !sp.HoldMeasured {
		return nil
	}
	hold := sp.HoldSeconds
	if hold != hold {
		return finding.Skip("the lock hold time is not a number")
	}
	if d := time.Duration(hold * float64(time.Second)); d < a.p.MinHoldTime.Duration {
		return finding.Skip("lock held for %s, under minHoldTime %s", d.Round(time.Second), a.p.MinHoldTime.Duration)
	}
	return nil
}

func (a *killProcess) Plan(ctx context.Context, f finding.Finding) (Plan, error) {
	ref, err := a.target(f)
	if err != nil {
		return Plan{}, err
	}
	p, err := a.check(ctx, ref, f, f.Subject.Process.CPUTicksOr0())
	if err != nil {
		return Plan{}, err
	}
	return Plan{
		Summary: fmt.Sprintf("send SIGTERM to pid %d (%s), wait %s, then SIGKILL if it still runs", p.Pid, clip.Join(p.Cmdline, " ", clip.Max), a.p.GracePeriod.Duration),
		Details: details(p),
	}, nil
}

func details(p procs.Process) map[string]any {
	return map[string]any{
		"pid":          p.Pid,
		"createTimeMs": p.CreateTimeMs,
		"name":         p.Name(),
		"cmdline":      clip.Join(p.Cmdline, " ", clip.Max),
		"state":        p.State,
		"ppid":         p.PPid,
		"parentName":   p.ParentName,
	}
}

func (a *killProcess) Execute(ctx context.Context, f finding.Finding) (Result, error) {
	start := time.Now()
	ref, err := a.target(f)
	if err != nil {
		return Result{}, err
	}
	pid, ct := ref.Pid, ref.CreateTimeMs
	// The lock's holders before the first signal: after the kill, only
	// one of them still holding it makes the kill a failure (a waiter that
	// then takes the lock is the kill working).
	var heldBefore map[procs.Ref]bool
	if holdsLock(f) && a.n.XtablesLock != "" {
		if l, err := a.n.Procs.FileLocks(ctx, a.n.XtablesLock); err == nil {
			heldBefore = map[procs.Ref]bool{}
			for _, h := range l.Holders {
				heldBefore[procs.Ref{Pid: h.Pid, CreateTimeMs: h.CreateTimeMs}] = true
			}
		}
	}
	goneNow := func() bool {
		alive, err := procs.Alive(ctx, a.n.Procs, pid, ct)
		return err == nil && !alive
	}
	var sent []string
	baseline := f.Subject.Process.CPUTicksOr0()
	for _, step := range []struct {
		sig  syscall.Signal
		wait time.Duration
	}{{syscall.SIGTERM, a.p.GracePeriod.Duration}, {syscall.SIGKILL, a.p.KillWait.Duration}} {
		// Re-check identity and allowlist immediately before each signal.
		p, err := a.check(ctx, ref, f, baseline)
		if err != nil {
			if len(sent) == 0 {
				return Result{}, err
			}
			if goneNow() {
				return a.gone(ctx, ref, f, sent, start, heldBefore)
			}
			// Still there but no longer eligible (exec'd into another
			// program): a failure, not a skip.
			return Result{}, fmt.Errorf("not sending %s after %s: %v", signalName(step.sig), strings.Join(sent, ", "), err)
		}
		if err := a.n.Procs.Signal(ctx, p.Pid, p.CreateTimeMs, step.sig); err != nil {
			if errors.Is(err, procs.ErrNotFound) || errors.Is(err, procs.ErrNotSame) {
				if len(sent) > 0 {
					return a.gone(ctx, ref, f, sent, start, heldBefore)
				}
				return Result{}, finding.Skip("pid %d is gone: %v", p.Pid, err)
			}
			return Result{}, fmt.Errorf("sending %s to pid %d: %w", signalName(step.sig), p.Pid, err)
		}
		sent = append(sent, signalName(step.sig))
		baseline = p.CPUTicks
		if a.n.Log != nil {
			a.n.Log.Info("signalled process", zap.String("signal", signalName(step.sig)), zap.Int32("pid", p.Pid),
				zap.Int64("createTimeMs", p.CreateTimeMs), zap.String("cmdline", clip.Join(p.Cmdline, " ", clip.Max)))
		}
		if a.waitGone(ctx, p, step.wait) {
			r, err := a.gone(ctx, ref, f, sent, start, heldBefore)
			if err != nil {
				return r, err
			}
			r.Details["cmdline"] = clip.Join(p.Cmdline, " ", clip.Max)
			r.Details["name"] = p.Name()
			return r, nil
		}
		if ctx.Err() != nil {
			return Result{}, fmt.Errorf("pid %d still running after %s: %w", p.Pid, strings.Join(sent, ", "), ctx.Err())
		}
	}
	state := "?"
	if cur, err := a.n.Procs.Get(ctx, pid); err == nil {
		state = cur.State
	}
	return Result{}, fmt.Errorf("pid %d still running %s after SIGTERM and SIGKILL (state %s)", pid, a.p.KillWait.Duration, state)
}

// gone is the result once the process is gone. For a lock holder the kill
// worked only if the xtables lock is released too: a process that started
// before the kill and still holds it (flock's child, when the flock wrapper
// was killed) makes the attempt a failure, so it is retried and escalates.
func (a *killProcess) gone(ctx context.Context, ref procs.Ref, f finding.Finding, sent []string, start time.Time, heldBefore map[procs.Ref]bool) (Result, error) {
	pid, ct := ref.Pid, ref.CreateTimeMs
	if holdsLock(f) && a.n.XtablesLock != "" {
		if err := a.lockReleased(ctx, pid, start, heldBefore); err != nil {
			return Result{}, fmt.Errorf("pid %d is gone after %s, but %w", pid, strings.Join(sent, ", "), err)
		}
	}
	return Result{
		Summary: fmt.Sprintf("pid %d is gone after %s", pid, strings.Join(sent, ", ")),
		Details: map[string]any{
			"pid":          pid,
			"createTimeMs": ct,
			"signals":      sent,
			"goneAfterMs":  time.Since(start).Milliseconds(),
		},
	}, nil
}

// lockReleased checks that none of the lock's holders before the kill
// (heldBefore; when it could not be read, anybody that existed at start)
// still holds the xtables lock. A waiter that took the lock after the kill
// is not one of them: the lock moved on, which is what the kill was for.
func (a *killProcess) lockReleased(ctx context.Context, pid int32, start time.Time, heldBefore map[procs.Ref]bool) error {
	l, err := a.n.Procs.FileLocks(ctx, a.n.XtablesLock)
	if err != nil {
		return fmt.Errorf("whether the xtables lock was released is unknown: %w", err)
	}
	if !l.Held {
		return nil
	}
	var still []string
	for _, h := range l.Holders {
		before := h.CreateTimeMs <= start.UnixMilli()
		if heldBefore != nil {
			before = heldBefore[procs.Ref{Pid: h.Pid, CreateTimeMs: h.CreateTimeMs}]
		}
		if before {
			still = append(still, fmt.Sprintf("%s (pid %d)", h.Name(), h.Pid))
		}
	}
	if len(l.Holders) == 0 && slices.Contains(l.LockPIDs, pid) {
		still = append(still, fmt.Sprintf("a process not visible here (/proc/locks pid %d)", pid))
	}
	if len(still) == 0 {
		return nil
	}
	return fmt.Errorf("the xtables lock %s is still held by %s", a.n.XtablesLock, strings.Join(still, ", "))
}

// waitGone polls until the process is gone or d (or ctx) runs out.
func (a *killProcess) waitGone(ctx context.Context, p procs.Process, d time.Duration) bool {
	deadline := time.NewTimer(d)
	defer deadline.Stop()
	tick := time.NewTicker(a.poll)
	defer tick.Stop()
	for {
		if ok, err := procs.Alive(ctx, a.n.Procs, p.Pid, p.CreateTimeMs); err == nil && !ok {
			return true
		}
		select {
		case <-ctx.Done():
			return false
		case <-deadline.C:
			ok, err := procs.Alive(ctx, a.n.Procs, p.Pid, p.CreateTimeMs)
			return err == nil && !ok
		case <-tick.C:
		}
	}
}

func signalName(s syscall.Signal) string {
	switch s {
	case syscall.SIGTERM:
		return "SIGTERM"
	case syscall.SIGKILL:
		return "SIGKILL"
	}
	return s.String()
}
