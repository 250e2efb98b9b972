package detect

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/remediate-dev/remediate/internal/cluster"
	"github.com/remediate-dev/remediate/internal/finding"
	"github.com/remediate-dev/remediate/internal/node"
	"github.com/remediate-dev/remediate/policy"
)

// CNIAgentUnhealthyParams are the agents and thresholds of
// CNIAgentUnhealthy.
type CNIAgentUnhealthyParams struct {
	// Agents are the CNI agents looked for among this node's pods, by
	// namespaces and label selector. Default: Calico (calico-node),
	// Cilium, Flannel, the AWS VPC CNI (aws-node), Antrea (antrea-agent),
	// kube-router and Weave Net, with their upstream labels.
	Agents []cluster.Agent `yaml:"agents"`
	// NotReadyFor is how long the agent's pod may be not Ready (by its
	// Ready condition's lastTransitionTime) before it is a finding
	// (default 1m).
	NotReadyFor policy.Duration `yaml:"notReadyFor"`
	// RestartWindow is how recent a restart must be to count: a restart
	// count that rose while this detector watched, or a container whose
	// last run ended, within the window (default 15m). An OOMKilled last
	// run within the window is reported as such.
	RestartWindow policy.Duration `yaml:"restartWindow"`
}

// SetDefaults sets the defaults of CNIAgentUnhealthy (registry.Defaulter).
func (p *CNIAgentUnhealthyParams) SetDefaults() {
	*p = CNIAgentUnhealthyParams{Agents: cluster.DefaultCNIAgents(), NotReadyFor: policy.D(time.Minute), RestartWindow: policy.D(15 * time.Minute)}
}

// Validate implements policy.Validator.
func (p *CNIAgentUnhealthyParams) Validate() []policy.FieldError {
	var errs []policy.FieldError
	if len(p.Agents) == 0 {
		errs = append(errs, policy.FieldError{Field: "agents", Msg: "must name at least one agent"})
	}
	if p.NotReadyFor.Duration <= 0 {
		errs = append(errs, policy.FieldError{Field: "notReadyFor", Msg: "must be > 0"})
	}
	if p.RestartWindow.Duration <= 0 {
		errs = append(errs, policy.FieldError{Field: "restartWindow", Msg: "must be > 0"})
	}
	return append(errs, validateAgents(p.Agents)...)
}

func init() {
	Define("CNIAgentUnhealthy",
		"this node's CNI agent pod (found by label selectors) not Ready for notReadyFor, restarting, or OOM-killed within restartWindow; one finding per agent (its DaemonSet), whichever pod runs it now",
		newCNIAgentUnhealthy, Targets(finding.KindNodeAgent))
}

type cniAgent struct {
	p CNIAgentUnhealthyParams
	n *node.Node

	mu   sync.Mutex
	seen map[string]restartTrack // pod UID -> restart count observed
	judgement
}

// restartTrack is the restart count first seen for a pod and when it
// last rose while watched.
type restartTrack struct {
	count int32
	rose  time.Time
}

func newCNIAgentUnhealthy(p *CNIAgentUnhealthyParams, n *node.Node) (Detector, error) {
	return &cniAgent{p: *p, n: n, seen: map[string]restartTrack{}}, nil
}

func (d *cniAgent) Detect(context.Context) ([]finding.Finding, error) {
	view, err := podView(d.n)
	if err != nil {
		return nil, err
	}
	now := d.n.Clock.Now()
	agents := cluster.AgentPods(view.NodePods(), d.p.Agents)
	d.track(agents, now)
	if len(agents) == 0 {
		names := make([]string, len(d.p.Agents))
		for i, a := range d.p.Agents {
			names[i] = a.Name
		}
		return nil, finding.Skip("no pod of a configured CNI agent (%s) on node %s", strings.Join(names, ", "), d.n.Name)
	}
	var out []finding.Finding
	var ok []string
	for _, a := range agents {
		f, bad := d.judge(a, now)
		if !bad {
			ok = append(ok, a.Pod.Key())
			continue
		}
		out = append(out, f)
	}
	d.set("CNI agent pods %s Ready, no restart within %s", strings.Join(ok, ", "), d.p.RestartWindow.Duration)
	return out, nil
}

// track records each agent pod's restart count and when it rose; pods
// gone are forgotten.
func (d *cniAgent) track(agents []cluster.AgentPod, now time.Time) {
	d.mu.Lock()
	defer d.mu.Unlock()
	live := map[string]bool{}
	for _, a := range agents {
		live[a.Pod.UID] = true
		n := a.Pod.Restarts()
		t, ok := d.seen[a.Pod.UID]
		switch {
		case !ok:
			d.seen[a.Pod.UID] = restartTrack{count: n}
		case n > t.count:
			d.seen[a.Pod.UID] = restartTrack{count: n, rose: now}
		}
	}
	for uid := range d.seen {
		if !live[uid] {
			delete(d.seen, uid)
		}
	}
}

func (d *cniAgent) judge(a cluster.AgentPod, now time.Time) (finding.Finding, bool) {
	p := a.Pod
	var problems []string
	sev := finding.Warning
	notReady := false
	switch {
	case p.Ready.IsFalse():
		since := p.Ready.Since
		if since.IsZero() {
			since = p.Created
		}
		if now.Sub(since) >= d.p.NotReadyFor.Duration {
			notReady = true
			problems = append(problems, fmt.Sprintf("not Ready for %s", now.Sub(since).Round(time.Second)))
		}
	case p.Ready.Status == "" && now.Sub(p.Created) >= d.p.NotReadyFor.Duration:
		notReady = true
		problems = append(problems, fmt.Sprintf("no Ready condition %s after creation (phase %s)", now.Sub(p.Created).Round(time.Second), p.Phase))
	}
	if notReady {
		sev = finding.Critical
	}
	d.mu.Lock()
	rose := d.seen[p.UID].rose
	d.mu.Unlock()
	last := lastTerminated(p)
	recentExit := last.LastTerminatedReason != "" && !last.LastTerminatedAt.IsZero() && now.Sub(last.LastTerminatedAt) < d.p.RestartWindow.Duration
	restarting := (!rose.IsZero() && now.Sub(rose) < d.p.RestartWindow.Duration) || recentExit
	if restarting {
		s := fmt.Sprintf("restarting (%d restarts", p.Restarts())
		if recentExit {
			s += fmt.Sprintf(", container %s last ended %s with exit code %d", last.Name, last.LastTerminatedReason, last.LastTerminatedExitCode)
		}
		problems = append(problems, s+")")
	}
	oom := recentExit && last.LastTerminatedReason == "OOMKilled"
	if oom {
		problems = append(problems, fmt.Sprintf("OOM-killed (container %s): its memory limit is too low for this node", last.Name))
	}
	if len(problems) == 0 {
		return finding.Finding{}, false
	}
	ev := map[string]any{
		cluster.EvidenceAgent:  a.Agent,
		"namespace":            p.Namespace,
		"pod":                  p.Name,
		cluster.EvidencePodUID: p.UID,
		"ready":                p.Ready.IsTrue(),
		"restartCount":         p.Restarts(),
		"problems":             problems,
	}
	if !p.Ready.Since.IsZero() {
		ev["readySince"] = p.Ready.Since.UTC().Format(time.RFC3339)
	}
	if !rose.IsZero() {
		ev["restartObservedAt"] = rose.UTC().Format(time.RFC3339)
	}
	if last.LastTerminatedReason != "" {
		ev["lastTerminatedContainer"] = last.Name
		ev["lastTerminatedReason"] = last.LastTerminatedReason
		ev["lastTerminatedExitCode"] = last.LastTerminatedExitCode
		if !last.LastTerminatedAt.IsZero() {
			ev["lastTerminatedAt"] = last.LastTerminatedAt.UTC().Format(time.RFC3339)
		}
	}
	if oom {
		ev["oomKilled"] = true
	}
	// The target is the agent (its DaemonSet on this node), not the pod: a
	// restart replaces the pod, and the engine's cooldown, escalation and
	// verification, kept per target, must follow the agent to the
	// replacement. The pod's name and UID are evidence.
	return finding.Finding{
		Detector: "CNIAgentUnhealthy",
		Target:   a.Ref().String(),
		Severity: sev,
		Message:  fmt.Sprintf("CNI agent %s pod %s on node %s: %s", a.Agent, p.Key(), d.n.Name, strings.Join(problems, "; ")),
		Evidence: ev,
		Subject:  finding.Subject{Agent: &finding.Agent{PodUID: p.UID}},
	}, true
}
