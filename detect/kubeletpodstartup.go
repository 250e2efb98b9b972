package detect

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/remediate-dev/remediate/internal/causes"
	"github.com/remediate-dev/remediate/internal/cluster"
	"github.com/remediate-dev/remediate/internal/cni"
	"github.com/remediate-dev/remediate/internal/finding"
	"github.com/remediate-dev/remediate/internal/kubelet"
	"github.com/remediate-dev/remediate/internal/kubeproxy"
	"github.com/remediate-dev/remediate/internal/node"
	"github.com/remediate-dev/remediate/policy"
)

// KubeletPodStartupParams are the thresholds of KubeletPodStartup.
type KubeletPodStartupParams struct {
	// Window over which the kubelet's counters are compared (the increase
	// between the scrapes at its ends). Default 10m.
	Window policy.Duration `yaml:"window"`
	// MaxSandboxErrors: a finding when kubelet_run_podsandbox_errors_total
	// rises by more than this in the window (default 2: a kubelet retries
	// a failing sandbox about every 10-20 s per pod, so three errors in
	// ten minutes is a pod that did not get one, not a blip). -1 ignores
	// the sandbox errors.
	MaxSandboxErrors int `yaml:"maxSandboxErrors"`
	// PodStartQuantile of kubelet_pod_start_sli_duration_seconds (pod
	// start without image pulls and init containers) to judge (default
	// 0.99).
	PodStartQuantile float64 `yaml:"podStartQuantile"`
	// MaxPodStart: a finding when that quantile of the pods started in the
	// window is above this (default 60s; 0 ignores pod start). The
	// upstream pod-startup SLO is p99 <= 5 s for stateless pods; 60 s is
	// the "far past anything a healthy node does".
	MaxPodStart policy.Duration `yaml:"maxPodStart"`
	// MinPodStarts is the fewest pod starts in the window for a verdict on
	// their quantile (default 3).
	MinPodStarts int `yaml:"minPodStarts"`
	// MaxEventPods bounds how many of this node's pods waiting for a
	// sandbox have their kubelet Events read for the likely cause (one
	// field-selected LIST each; default 5, at most 50; 0: none read).
	MaxEventPods int `yaml:"maxEventPods"`
	// Agents are the CNI agents whose pods' readiness is a likely cause
	// (default: the common agents, as CNIAgentUnhealthy).
	Agents []cluster.Agent `yaml:"agents"`
}

// SetDefaults sets the defaults of KubeletPodStartup (registry.Defaulter).
func (p *KubeletPodStartupParams) SetDefaults() {
	*p = KubeletPodStartupParams{Window: policy.D(10 * time.Minute), MaxSandboxErrors: 2, PodStartQuantile: 0.99,
		MaxPodStart: policy.D(time.Minute), MinPodStarts: 3, MaxEventPods: 5, Agents: cluster.DefaultCNIAgents()}
}

// Validate implements policy.Validator.
func (p *KubeletPodStartupParams) Validate() []policy.FieldError {
	var errs []policy.FieldError
	if p.Window.Duration <= 0 {
		errs = append(errs, policy.FieldError{Field: "window", Msg: "must be > 0"})
	}
	if p.MaxSandboxErrors < -1 {
		errs = append(errs, policy.FieldError{Field: "maxSandboxErrors", Msg: "must be -1 (ignore) or more"})
	}
	if p.PodStartQuantile <= 0 || p.PodStartQuantile >= 1 {
		errs = append(errs, policy.FieldError{Field: "podStartQuantile", Msg: "must be between 0 and 1 (exclusive), e.g. 0.99"})
	}
	if p.MaxPodStart.Duration < 0 {
		errs = append(errs, policy.FieldError{Field: "maxPodStart", Msg: "must not be negative (0 ignores pod start)"})
	}
	if p.MinPodStarts < 1 {
		errs = append(errs, policy.FieldError{Field: "minPodStarts", Msg: "must be at least 1"})
	}
	if p.MaxEventPods < 0 || p.MaxEventPods > 50 {
		errs = append(errs, policy.FieldError{Field: "maxEventPods", Msg: "must be between 0 and 50"})
	}
	if p.MaxSandboxErrors == -1 && p.MaxPodStart.Duration == 0 {
		errs = append(errs, policy.FieldError{Field: "maxSandboxErrors", Msg: "with maxPodStart 0 nothing is judged"})
	}
	return append(errs, validateAgents(p.Agents)...)
}

func init() {
	Define("KubeletPodStartup",
		"the kubelet's own counters (its authenticated /metrics): pod sandbox creation errors (kubelet_run_podsandbox_errors_total) over a window above maxSandboxErrors, or the pod-start SLI quantile (kubelet_pod_start_sli_duration_seconds) of the pods started in the window above maxPodStart; with the likely cause (sandbox Events classified, CNI configuration, CNI agent, xtables lock)",
		newKubeletPodStartup, Targets(finding.KindNodePods), Windowed())
}

// Targets of KubeletPodStartup's findings.
const (
	KubeletSandboxErrorsTarget = "kubelet/sandbox-errors"
	KubeletPodStartTarget      = "kubelet/pod-start"
)

// subsystemKubelet is the node.Unavailable key of the kubelet adapter.
const subsystemKubelet = "kubelet"

type kubeletPodStartup struct {
	p KubeletPodStartupParams
	n *node.Node

	mu sync.Mutex
	w  window[kubeletSample]
	judgement
}

// kubeletSample is what one scrape says: the sandbox error counter and
// the pod-start histogram (zero and empty while the series are absent:
// the kubelet exposes them from their first observation).
type kubeletSample struct {
	errors float64
	start  kubeproxy.Histogram
}

func newKubeletPodStartup(p *KubeletPodStartupParams, n *node.Node) (Detector, error) {
	return &kubeletPodStartup{p: *p, n: n}, nil
}

func (d *kubeletPodStartup) Detect(ctx context.Context) ([]finding.Finding, error) {
	if d.n.Kubelet == nil {
		return nil, finding.Skip("%s", d.n.Why(subsystemKubelet))
	}
	sc, err := d.n.Kubelet.Metrics(ctx)
	if err != nil {
		if e, ok := kubelet.AsError(err); ok {
			return nil, finding.Skip("cannot read the kubelet's /metrics: %v", e)
		}
		return nil, fmt.Errorf("reading the kubelet's /metrics: %w", err)
	}
	span := d.p.Window.Duration
	d.mu.Lock()
	inc, ok := recordKubelet(&d.w, sc, span)
	d.mu.Unlock()
	what := fmt.Sprintf("sandbox errors at most %d", d.p.MaxSandboxErrors)
	if d.p.MaxSandboxErrors < 0 {
		what = "sandbox errors not judged"
	}
	if d.p.MaxPodStart.Duration > 0 {
		what += fmt.Sprintf(", pod start p%g at most %s (or fewer than %d starts)", d.p.PodStartQuantile*100, d.p.MaxPodStart.Duration, d.p.MinPodStarts)
	}
	if !ok {
		d.set("%s over the last %s: one scrape so far (%s)", what, span, sc.URL)
		return nil, nil
	}
	d.set("%s over the last %s: %g sandbox errors, %d pod starts", what, inc.covered.Round(time.Second), inc.errors, inc.start.Count)
	out := kubeletStartupFindings(inc, d.p)
	if len(out) > 0 {
		res, why := d.causes(ctx)
		for i := range out {
			res.Attach(out[i].Evidence, why)
			if top := res.Top(); top != "" {
				out[i].Message += "; likely cause: " + top
			}
		}
	}
	return out, nil
}

// kubeletIncrease is what the kubelet's counters rose by over a window.
type kubeletIncrease struct {
	errors  float64
	start   kubeproxy.Histogram
	covered time.Duration
}

// record adds the scrape to the window and returns the increase over it;
// ok is false with one sample, or after a kubelet restart (its counters
// went down: the window starts again from this scrape).
func recordKubelet(ww *window[kubeletSample], sc *kubelet.Scrape, span time.Duration) (kubeletIncrease, bool) {
	var v kubeletSample
	if e := sc.Metrics.SandboxErrors; e != nil {
		v.errors = *e
	}
	if h := sc.Metrics.PodStartSLI; h != nil {
		v.start = *h
	}
	inc, covered, st := ww.advance(sc.Seq, sc.At, v, span, func(newer, older kubeletSample) (kubeletSample, bool) {
		d, ok := kubeletDelta(older, newer)
		return kubeletSample{errors: d.errors, start: d.start}, ok
	})
	if st != windowReady {
		return kubeletIncrease{}, false
	}
	return kubeletIncrease{errors: inc.errors, start: inc.start, covered: covered}, true
}

// kubeletDelta is newer minus older; false when a counter went down (the
// kubelet restarted). A histogram absent at the older scrape (no pod
// started yet) counts as empty.
func kubeletDelta(older, newer kubeletSample) (kubeletIncrease, bool) {
	if newer.errors < older.errors {
		return kubeletIncrease{}, false
	}
	inc := kubeletIncrease{errors: newer.errors - older.errors}
	switch {
	case len(older.start.Buckets) == 0 && older.start.Count == 0:
		inc.start = newer.start
	case len(newer.start.Buckets) == 0 && newer.start.Count == 0:
		return kubeletIncrease{}, false // the series vanished: restarted
	default:
		h, ok := newer.start.Sub(older.start)
		if !ok {
			return kubeletIncrease{}, false
		}
		inc.start = h
	}
	return inc, true
}

// kubeletStartupFindings is the decision on the increases over a window.
func kubeletStartupFindings(inc kubeletIncrease, p KubeletPodStartupParams) []finding.Finding {
	var out []finding.Finding
	win := inc.covered.Round(time.Second)
	if p.MaxSandboxErrors >= 0 && inc.errors > float64(p.MaxSandboxErrors) {
		out = append(out, finding.Finding{
			Detector: "KubeletPodStartup",
			Target:   KubeletSandboxErrorsTarget,
			Severity: finding.Warning,
			Message: fmt.Sprintf("the kubelet failed to create %g pod sandboxes in the last %s (limit %d): new pods of this node get no sandbox/network",
				inc.errors, win, p.MaxSandboxErrors),
			Evidence: map[string]any{
				"sandboxErrors":    inc.errors,
				"maxSandboxErrors": p.MaxSandboxErrors,
				"windowSeconds":    inc.covered.Seconds(),
				"series":           kubelet.MetricSandboxErrors,
			},
		})
	}
	if lim := p.MaxPodStart.Duration; lim > 0 && inc.start.Count >= uint64(p.MinPodStarts) {
		v, above, ok := inc.start.Quantile(p.PodStartQuantile)
		got := time.Duration(v * float64(time.Second))
		if ok && (got > lim || (above && got >= lim)) {
			val := got.Round(time.Millisecond).String()
			if above {
				val = "above " + val + " (the largest bucket)"
			}
			out = append(out, finding.Finding{
				Detector: "KubeletPodStartup",
				Target:   KubeletPodStartTarget,
				Severity: finding.Warning,
				Message: fmt.Sprintf("pod start p%g of the %d pods started in the last %s is %s, limit %s (kubelet's SLI: without image pulls and init containers)",
					p.PodStartQuantile*100, inc.start.Count, win, val, lim),
				Evidence: map[string]any{
					"quantile":           p.PodStartQuantile,
					"seconds":            v,
					"aboveLargestBucket": above,
					"limitSeconds":       lim.Seconds(),
					"podStarts":          inc.start.Count,
					"meanSeconds":        inc.start.Sum / float64(inc.start.Count),
					"windowSeconds":      inc.covered.Seconds(),
					"series":             kubelet.MetricPodStartSLI,
				},
			})
		}
	}
	return out
}

// causes gathers the observations behind failing sandboxes (bounded to
// half of what is left of the detector's time) and ranks them; why says
// what could not be observed.
func (d *kubeletPodStartup) causes(ctx context.Context) (causes.Result, []string) {
	ctx, cancel := halfOfDeadline(ctx)
	defer cancel()
	var in causes.SandboxInputs
	var why []string
	if d.n.CNIConfDir == "" {
		why = append(why, "CNI configuration: no --cni-conf-dir")
	} else {
		in.Config = cniConfigState(readCNI(ctx, d.n))
	}
	if view, err := podView(d.n); err != nil {
		why = append(why, "CNI agent and sandbox Events: "+err.Error())
	} else {
		pods := view.NodePods()
		in.AgentsObserved = true
		for _, a := range cluster.AgentPods(pods, d.p.Agents) {
			in.Agents = append(in.Agents, causes.AgentState{Pod: a.Pod.Key(), Ready: a.Pod.Ready.IsTrue(), Restarts: int(a.Pod.Restarts())})
		}
		ev, err := d.sandboxEvents(ctx, pods)
		if err != nil {
			why = append(why, "sandbox Events: "+err.Error())
		}
		in.Events = ev
	}
	if l, err := lockWindow(ctx, d.n, nil, d.p.Window.Duration); err != nil {
		why = append(why, "xtables lock holders: "+err.Error())
	} else {
		in.Lock = l
	}
	return causes.RankSandbox(in), why
}

// cniConfigState is what CNIConfig would judge, in one line.
func cniConfigState(dir cni.Dir) *causes.CNIConfigState {
	f := dir.InUse()
	switch {
	case dir.ConfDirErr != nil:
		return &causes.CNIConfigState{Problem: fmt.Sprintf("CNI configuration directory %s: %v", dir.ConfDir, dir.ConfDirErr)}
	case f == nil:
		return &causes.CNIConfigState{Problem: fmt.Sprintf("CNI configuration directory %s holds no network configuration", dir.ConfDir)}
	case f.Err != "":
		return &causes.CNIConfigState{Problem: fmt.Sprintf("CNI configuration %s cannot be loaded: %s", f.Name, f.Err), InUse: f.Name}
	case len(f.MissingPlugins) > 0:
		return &causes.CNIConfigState{Problem: fmt.Sprintf("CNI configuration %s names plugins missing from %s: %s", f.Name, dir.BinDir, strings.Join(f.MissingPlugins, ", ")), InUse: f.Name}
	}
	return &causes.CNIConfigState{InUse: f.Name}
}

// sandboxEvents classifies the kubelet's sandbox Events of this node's pods
// now waiting for a sandbox (any age, oldest first, host-network pods
// left out, at most MaxEventPods). nil with no pod to read.
func (d *kubeletPodStartup) sandboxEvents(ctx context.Context, pods []cluster.Pod) (*causes.SandboxEvents, error) {
	if d.p.MaxEventPods == 0 {
		return nil, nil
	}
	if d.n.PodEvents == nil {
		return nil, errors.New(d.n.Why("kubernetes"))
	}
	type waiting struct {
		pod   *cluster.Pod
		since time.Time
	}
	var ws []waiting
	for i := range pods {
		if since, _, ok := networkNotReady(&pods[i]); ok {
			ws = append(ws, waiting{&pods[i], since})
		}
	}
	if len(ws) == 0 {
		return nil, nil
	}
	sort.Slice(ws, func(i, j int) bool {
		if !ws[i].since.Equal(ws[j].since) {
			return ws[i].since.Before(ws[j].since)
		}
		return ws[i].pod.Key() < ws[j].pod.Key()
	})
	oldest := make([]*cluster.Pod, len(ws))
	for i := range ws {
		oldest[i] = ws[i].pod
	}
	t := tallySandboxEvents(ctx, d.n.PodEvents, oldest, d.p.MaxEventPods)
	if t.read == 0 {
		return nil, t.firstErr
	}
	out := &causes.SandboxEvents{Pods: t.read}
	if top, ok := t.tally.Top(); ok {
		out.Kind, out.Count, out.Example = string(top.Kind), top.Count, top.Example
		out.Correlates = FailureCorrelates[top.Kind]
	}
	return out, t.firstErr
}
