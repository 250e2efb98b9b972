package detect

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/remediate-dev/remediate/internal/finding"
	"github.com/remediate-dev/remediate/internal/kubeproxy"
	"github.com/remediate-dev/remediate/internal/node"
	"github.com/remediate-dev/remediate/internal/procident"
	"github.com/remediate-dev/remediate/internal/procs"
	"github.com/remediate-dev/remediate/policy"
)

// KubeProxyFrozenParams configure KubeProxyFrozen.
type KubeProxyFrozenParams struct {
	// MinSilence is how long the same kube-proxy process (PID and start
	// time) must have answered nothing on both /metrics and /healthz, at
	// every probe, before it is reported frozen (default 2m; at least 10s).
	// The detector remembers it across cycles: `remediate --once` has no
	// such memory and never reports a frozen kube-proxy.
	MinSilence policy.Duration `yaml:"minSilence"`
	// MaxServicePorts bounds the drifted Service ports named in the
	// finding's evidence (default 10).
	MaxServicePorts int `yaml:"maxServicePorts"`
}

// SetDefaults sets the defaults (registry.Defaulter).
func (p *KubeProxyFrozenParams) SetDefaults() {
	*p = KubeProxyFrozenParams{MinSilence: policy.D(2 * time.Minute), MaxServicePorts: 10}
}

// Validate implements policy.Validator.
func (p *KubeProxyFrozenParams) Validate() []policy.FieldError {
	var errs []policy.FieldError
	if p.MinSilence.Duration < 10*time.Second {
		errs = append(errs, policy.FieldError{Field: "minSilence", Msg: "must be at least 10s (a frozen kube-proxy is judged over minutes)"})
	}
	if p.MaxServicePorts < 1 {
		errs = append(errs, policy.FieldError{Field: "maxServicePorts", Msg: "must be >= 1"})
	}
	return errs
}

func init() {
	Define("KubeProxyFrozen",
		"this node's kube-proxy process is alive (not exited, not traced) but has answered nothing on /metrics and /healthz (every request timed out) for minSilence: stopped, deadlocked or stuck in the kernel; the Service ports it left unprogrammed are the evidence",
		newKubeProxyFrozen, Targets(finding.KindKubeProxy))
}

// kubeProxyFrozenTarget is the finding's target: one per node, so the
// rule's cooldown holds across kube-proxy's restarts.
const kubeProxyFrozenTarget = "kube-proxy/frozen"

type kubeProxyFrozen struct {
	p KubeProxyFrozenParams
	n *node.Node
	judgement

	mu sync.Mutex
	// silent is the process that has answered nothing since since (zero
	// when the last probe got an answer).
	silent procs.Ref
	since  time.Time
	// ticks is the silent process's CPU time at since: a process that
	// used CPU since is working, not frozen.
	ticks uint64
}

func newKubeProxyFrozen(p *KubeProxyFrozenParams, n *node.Node) (Detector, error) {
	return &kubeProxyFrozen{p: *p, n: n}, nil
}

// noAnswer reports whether a failed read is silence: the request was sent
// (or the connection left pending) and nothing came back before the
// timeout. A refused or reset connection, or an answer of any kind, is not.
func noAnswer(err error) bool {
	if err == nil {
		return false
	}
	if e, ok := kubeproxy.AsError(err); !ok || e.Kind != kubeproxy.KindUnreachable {
		return false
	}
	var ne net.Error
	return errors.Is(err, context.DeadlineExceeded) || (errors.As(err, &ne) && ne.Timeout())
}

// processStates names the states of /proc/<pid>/stat.
var processStates = map[string]string{
	"R": "running", "S": "sleeping", "D": "uninterruptible sleep (stuck in the kernel)", "T": "stopped (SIGSTOP)",
	"t": "stopped by a tracer (debugger)", "Z": "zombie (exited)", "X": "dead", "I": "idle",
}

func (d *kubeProxyFrozen) Detect(ctx context.Context) ([]finding.Finding, error) {
	kp, err := kubeProxyOf(d.n)
	if err != nil {
		return nil, err
	}
	// Both endpoints, each bounded by the client's own timeout
	// (kubeProxy.scrapeTimeout) and shared with KubeProxyUnreachable's
	// reads of the cycle. Only that timeout counts as silence: the
	// detector's own deadline ending first is "cannot tell".
	_, merr := kp.Metrics(ctx)
	_, herr := kp.Healthz(ctx)
	if ctx.Err() != nil {
		return nil, fmt.Errorf("probing kube-proxy: %w", ctx.Err())
	}
	now := d.n.Clock.Now()
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, err := range []error{merr, herr} {
		if _, ok := kubeproxy.AsError(err); err != nil && !ok {
			// Our side (the shared read of another detector outlasted
			// this one's share): cannot tell, the memory stays.
			return nil, finding.Skip("cannot tell whether kube-proxy answers: %v", err)
		}
	}
	if !noAnswer(merr) || !noAnswer(herr) {
		d.silent, d.since = procs.Ref{}, time.Time{}
		if merr == nil || herr == nil {
			d.set("kube-proxy answered (/metrics: %s, /healthz: %s)", errText(merr), errText(herr))
			return nil, nil
		}
		// Refused, reset or garbage: not silence (KubeProxyUnreachable
		// reports it; a process that does not listen is not frozen).
		d.set("kube-proxy's endpoints fail without timing out (/metrics: %s; /healthz: %s): not frozen", errText(merr), errText(herr))
		return nil, nil
	}
	p, id, err := findKubeProxy(ctx, d.n)
	if err != nil {
		d.silent, d.since = procs.Ref{}, time.Time{}
		return nil, finding.Skip("kube-proxy answers nothing, but its process cannot be told (KubeProxyUnreachable reports the silence): %v", err)
	}
	switch p.State {
	case "Z", "X":
		d.silent, d.since = procs.Ref{}, time.Time{}
		return nil, finding.Skip("kube-proxy (pid %d) has exited (state %s): not frozen", p.Pid, p.State)
	case "t":
		d.silent, d.since = procs.Ref{}, time.Time{}
		return nil, finding.Skip("kube-proxy (pid %d) is stopped by a tracer (a debugger is attached): not judged", p.Pid)
	}
	ref := p.Ref()
	if d.since.IsZero() || d.silent != ref {
		d.silent, d.since, d.ticks = ref, now, p.CPUTicks
	}
	if p.CPUTicks > d.ticks || p.State == "R" {
		// Progress, not age: a kube-proxy using CPU is working, whoever
		// answers nothing on its ports (a process that bound
		// 127.0.0.1:10249/10256 first keeps kube-proxy's endpoints and
		// stays silent).
		used := float64(p.CPUTicks-min(d.ticks, p.CPUTicks)) / procs.TicksPerSecond
		since := now.Sub(d.since).Round(time.Second)
		d.since, d.ticks = now, p.CPUTicks
		return nil, finding.Skip("kube-proxy's endpoints answer nothing, but kube-proxy (pid %d, state %s) is making progress: %.2f s of CPU in %s: not frozen (KubeProxyUnreachable reports the silence)", p.Pid, p.State, used, since)
	}
	silentFor := now.Sub(d.since)
	if silentFor < d.p.MinSilence.Duration {
		return nil, finding.Skip("kube-proxy (pid %d, state %s) has answered nothing since %s (%s), using no CPU: judged frozen after %s of silence (the daemon remembers; --once cannot tell)",
			p.Pid, p.State, rfc3339(d.since), silentFor.Round(time.Second), d.p.MinSilence.Duration)
	}
	how := "stopped (state T)"
	if p.State != "T" {
		// Not stopped: the silence may be another process's listener on
		// kube-proxy's ports. Only where kube-proxy's descriptors are
		// readable (CAP_SYS_PTRACE) can the silent listeners be tied to
		// it; else only a stopped kube-proxy is known to be the silent one.
		why := d.listenersOwned(ctx, p, merr, herr)
		if why != "" {
			return nil, finding.Skip("kube-proxy (pid %d, state %s) has answered nothing for %s and used no CPU, but it is not stopped (state T) and %s: not judged frozen (KubeProxyUnreachable reports the silence)",
				p.Pid, p.State, silentFor.Round(time.Second), why)
		}
		how = fmt.Sprintf("state %s, its silent listeners its own (its descriptors)", p.State)
	}
	f := d.finding(ctx, p, merr, herr, now, silentFor)
	id.Evidence(f.Evidence)
	// How the node runs it, for the restart (RestartNodeAgent refuses a
	// kube-proxy it cannot restart by deleting a DaemonSet's pod).
	f.Subject.Agent = &finding.Agent{Shape: string(id.Shape()), RestartHow: id.RestartHow()}
	if id.Shape() == procident.ShapeDaemonSetPod {
		f.Subject.Agent.PodUID = id.PodUID
	}
	if how := id.RestartHow(); how != "" {
		f.Message += "; not restartable through the API: " + how
	}
	f.Evidence["cpuSeconds"] = float64(p.CPUTicks) / procs.TicksPerSecond
	f.Evidence["cpuSecondsWhileSilent"] = 0.0
	f.Evidence["progressWindowSeconds"] = silentFor.Round(time.Second).Seconds()
	f.Evidence["silentListener"] = how
	f.Message += fmt.Sprintf("; %s, no CPU used in %s; identity: %s", how, silentFor.Round(time.Second), id)
	return []finding.Finding{f}, nil
}

func (d *kubeProxyFrozen) finding(ctx context.Context, p procs.Process, merr, herr error, now time.Time, silentFor time.Duration) finding.Finding {
	state := p.State
	if m, ok := processStates[p.State]; ok {
		state += " (" + m + ")"
	}
	ev := map[string]any{
		"pid": p.Pid, "createTimeMs": p.CreateTimeMs, "process": p.Target(), "state": p.State, "stateMeaning": processStates[p.State],
		"silentSince": rfc3339(d.since), "silentSeconds": silentFor.Round(time.Second).Seconds(),
		"minSilenceSeconds": d.p.MinSilence.Duration.Seconds(), "metricsError": merr.Error(), "healthzError": herr.Error(),
	}
	if p.NetNS != "" {
		ev["netns"] = p.NetNS
	}
	msg := fmt.Sprintf("kube-proxy (pid %d, state %s) is alive but has answered nothing on /metrics and /healthz for %s (since %s): frozen",
		p.Pid, state, silentFor.Round(time.Second), rfc3339(d.since))
	// The drift it left: the Service ports it has not programmed, as
	// DataplaneDrift compares them (shared with it in the cycle).
	var dp DataplaneDriftParams
	dp.SetDefaults()
	obs, err := observeDataplane(ctx, d.n, dp)
	if err != nil {
		reason := err.Error()
		if r, ok := finding.IsSkip(err); ok {
			reason = r
		}
		ev["drift"] = "not compared: " + reason
		return finding.Finding{Detector: "KubeProxyFrozen", Target: kubeProxyFrozenTarget, Severity: finding.Critical, Message: msg, Evidence: ev}
	}
	grace := time.Duration(dp.GraceSyncPeriods * float64(obs.syncPeriod))
	var old []portDrift
	for _, pd := range oldDrift(obs, grace, now, nil) {
		if pd.port != nil {
			old = append(old, pd)
		}
	}
	sort.Slice(old, func(i, j int) bool { return old[i].changed.Before(old[j].changed) })
	var names []string
	for i, pd := range old {
		if i == d.p.MaxServicePorts {
			break
		}
		names = append(names, pd.name.String()+" ("+string(pd.family)+")")
	}
	ev["driftedServicePorts"] = len(old)
	ev["servicePorts"] = names
	ev["proxyMode"], ev["proxyModeSource"] = obs.mode, obs.modeSource
	ev["graceSeconds"] = grace.Seconds()
	if len(old) > 0 {
		more := ""
		if len(old) > len(names) {
			more = fmt.Sprintf(" and %d more", len(old)-len(names))
		}
		msg += fmt.Sprintf("; %d Service port(s) not programmed for over %s: %s%s", len(old), grace, strings.Join(names, ", "), more)
	} else {
		msg += "; no Service port drifted yet"
	}
	return finding.Finding{Detector: "KubeProxyFrozen", Target: kubeProxyFrozenTarget, Severity: finding.Critical, Message: msg, Evidence: ev}
}

// listenersOwned says why the silent endpoints cannot be tied to
// kube-proxy's process p ("" when each endpoint's port has a listening
// socket p holds): its descriptors are unreadable (no CAP_SYS_PTRACE), or
// another process holds a port (an impostor bound it first).
func (d *kubeProxyFrozen) listenersOwned(ctx context.Context, p procs.Process, errs ...error) string {
	for _, err := range errs {
		e, ok := kubeproxy.AsError(err)
		if !ok {
			return "whose listener is silent cannot be told"
		}
		u, perr := url.Parse(e.URL)
		port, cerr := strconv.ParseUint(u.Port(), 10, 16)
		if perr != nil || cerr != nil {
			return fmt.Sprintf("the port of %s is unknown", e.URL)
		}
		owns, err := d.n.Procs.OwnsListener(ctx, p.Pid, uint16(port))
		switch {
		case errors.Is(err, procs.ErrNoPtrace):
			return "without CAP_SYS_PTRACE the listener's socket cannot be tied to kube-proxy's process (another process may hold its port)"
		case err != nil:
			return fmt.Sprintf("whose listener is silent cannot be told: %v", err)
		case !owns:
			return fmt.Sprintf("the socket listening on port %d is not kube-proxy's: another process holds it (kube-proxy answers there for nobody)", port)
		}
	}
	return ""
}

func errText(err error) string {
	if err == nil {
		return "ok"
	}
	return err.Error()
}
