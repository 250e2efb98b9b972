package action

import (
	"context"
	"fmt"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/utils/clock"

	"github.com/remediate-dev/remediate/internal/cluster"
	"github.com/remediate-dev/remediate/internal/finding"
	"github.com/remediate-dev/remediate/internal/node"
	"github.com/remediate-dev/remediate/internal/procs"
	"github.com/remediate-dev/remediate/policy"
)

// RestartNodeAgentParams are the allowlist and bounds of RestartNodeAgent.
type RestartNodeAgentParams struct {
	// Agents are the node agents whose pod on this node may be restarted
	// (deleted, for its DaemonSet to replace), by namespaces and label
	// selector. Default: kube-proxy and the common CNI agents (the
	// defaults of CNIAgentUnhealthy). Keep the admission policy in deploy/
	// in step: it refuses deleting any other pod.
	Agents []cluster.Agent `yaml:"agents"`
	// ReadyTimeout bounds the wait for the replacement pod to be Ready.
	// Keep it under actionTimeout (default 60s).
	ReadyTimeout policy.Duration `yaml:"readyTimeout"`
	// PollInterval between checks of the replacement pod.
	PollInterval policy.Duration `yaml:"pollInterval"`
}

// SetDefaults sets the defaults of RestartNodeAgent (registry.Defaulter).
func (p *RestartNodeAgentParams) SetDefaults() {
	*p = RestartNodeAgentParams{Agents: append([]cluster.Agent{cluster.KubeProxyAgent()}, cluster.DefaultCNIAgents()...),
		ReadyTimeout: policy.D(50 * time.Second), PollInterval: policy.D(2 * time.Second)}
}

// Validate implements policy.Validator.
func (p *RestartNodeAgentParams) Validate() []policy.FieldError {
	var errs []policy.FieldError
	if len(p.Agents) == 0 {
		errs = append(errs, policy.FieldError{Field: "agents", Msg: "must name at least one agent"})
	}
	for i, a := range p.Agents {
		if err := a.Validate(); err != nil {
			errs = append(errs, policy.FieldError{Field: fmt.Sprintf("agents[%d]", i), Msg: err.Error()})
		}
	}
	return append(errs, validateReadyWait(p.ReadyTimeout, p.PollInterval)...)
}

func init() {
	Define("RestartNodeAgent",
		"deletes this node's pod of an allowlisted node agent (kube-proxy, the CNI agent, or the agent whose process holds the xtables lock; DaemonSet-managed only: a static pod, a systemd unit or k3s's embedded kube-proxy is refused with how to restart it) and waits for its replacement to be Ready (kube-proxy's: and its /healthz healthy); the one action that restarts kube-proxy",
		newRestartNodeAgent, Disruptive(), NeedsAPI(), ActsOn(append([]finding.Kind{finding.KindNodeAgent, finding.KindPod, finding.KindProcess, finding.KindCNIAgentProcess}, kubeProxyKinds...)...))
}

type restartNodeAgent struct {
	p RestartNodeAgentParams
	n *node.Node
}

func newRestartNodeAgent(p *RestartNodeAgentParams, n *node.Node) (Action, error) {
	for _, a := range p.Agents {
		if err := a.Validate(); err != nil {
			return nil, err
		}
	}
	return &restartNodeAgent{p: *p, n: n}, nil
}

func (a *restartNodeAgent) clock() clock.PassiveClock {
	if a.n.Clock != nil {
		return a.n.Clock
	}
	return clock.RealClock{}
}

// agentTarget is the pod to restart and the agent it belongs to.
type agentTarget struct {
	agent cluster.Agent
	pod   *corev1.Pod
}

// resolve finds the pod a finding is about (by the kind of its subject,
// decoding its target with that kind's typed reference), live from the
// API: the agent's
// current pod on this node for a node-agent target (cluster.AgentRef: its
// DaemonSet's, or the agent's by name when it has none), the pod a pod
// target names, kube-proxy's pod for a kube-proxy target, the pod whose
// cgroup holds a process target. The pod must be on this node, match an
// allowlisted agent, not be terminating, and be managed by a DaemonSet.
// When the finding names the pod's UID (a node-agent finding's Subject),
// the pod found must be that one: another means the agent's pod was
// replaced since the finding, which is not the pod judged unhealthy.
func (a *restartNodeAgent) resolve(ctx context.Context, f finding.Finding) (*agentTarget, error) {
	if a.n.Kube == nil {
		return nil, finding.Skip("%s", a.n.Why("kubernetes"))
	}
	var (
		ns, name, uid string
		want          *cluster.Agent
		agentRef      *cluster.AgentRef
	)
	switch f.Subject.Kind {
	case finding.KindNodeAgent:
		ref, err := cluster.ParseAgentRef(f.Target)
		if err != nil {
			return nil, err
		}
		ns, agentRef = ref.Namespace, &ref
	case finding.KindPod:
		ref, err := cluster.ParsePodRef(f.Target)
		if err != nil {
			return nil, err
		}
		ns, name = ref.Namespace, ref.Name
	case finding.KindProcess, finding.KindCNIAgentProcess:
		ref, err := procs.ParseRef(f.Target)
		if err != nil {
			return nil, err
		}
		if a.n.Procs == nil {
			return nil, finding.Skip("%s", a.n.Why("procs"))
		}
		p, err := a.n.Procs.Get(ctx, ref.Pid)
		if err != nil || p.CreateTimeMs != ref.CreateTimeMs {
			return nil, finding.Skip("process %d is gone or is another process now", ref.Pid)
		}
		if c, err := procs.ReadCgroup(a.n.ProcRoot, ref.Pid); err == nil && c.Place == procs.CgroupHost {
			unit := "no systemd unit"
			if c.Unit != "" {
				unit = "systemd unit " + c.Unit + ": systemctl restart " + c.Unit + " on the node restarts it"
			}
			return nil, finding.Skip("process %d (%s) is a host process, in no pod's cgroup (%s): deleting a pod would not restart it", ref.Pid, p.Name(), unit)
		}
		if uid, err = procs.PodUID(a.n.ProcRoot, ref.Pid); err != nil {
			return nil, fmt.Errorf("refusing: process %d (%s) is not in a pod of this node: %w", ref.Pid, p.Name(), err)
		}
	case finding.KindKubeProxy, finding.KindIPTablesRules, finding.KindIPVSMissingVirtualServer, finding.KindNFTablesTable:
		// kube-proxy's own findings, and the rules it programs: the
		// remedy is a fresh kube-proxy, when it is a DaemonSet's pod.
		if ag := f.Subject.Agent; ag != nil && ag.RestartHow != "" {
			return nil, finding.Skip("kube-proxy on node %s is not a DaemonSet's pod (%s): deleting a pod would not restart it: %s", a.n.Name, ag.Shape, ag.RestartHow)
		}
		for i := range a.p.Agents {
			if a.p.Agents[i].Name == cluster.KubeProxyAgent().Name {
				want = &a.p.Agents[i]
			}
		}
		if want == nil {
			return nil, fmt.Errorf("refusing: kube-proxy is not among the allowlisted agents")
		}
	default:
		return nil, fmt.Errorf("refusing: target %q (kind %q) is no node agent, pod, process or kube-proxy", f.Target, f.Subject.Kind)
	}
	// Candidate pods: this node's, in the allowlisted agents' namespaces
	// (a pod target's own namespace only).
	var cands []corev1.Pod
	for _, ag := range a.p.Agents {
		if want != nil && ag.Name != want.Name {
			continue
		}
		for _, n := range ag.Namespaces {
			if ns != "" && n != ns {
				continue
			}
			pods, err := a.nodePods(ctx, n, ag.LabelSelector)
			if err != nil {
				return nil, err
			}
			cands = append(cands, pods...)
		}
	}
	var matches, terminating []agentTarget
	seen := map[string]bool{}
	for i := range cands {
		p := &cands[i]
		// A static pod's process runs under its configuration's UID, which
		// its mirror carries in an annotation.
		if seen[string(p.UID)] || (name != "" && p.Name != name) || (uid != "" && string(p.UID) != uid && p.Annotations[cluster.MirrorAnnotation] != uid) {
			continue
		}
		seen[string(p.UID)] = true
		cp := clusterPod(p)
		for _, ag := range a.p.Agents {
			if !ag.Matches(&cp) {
				continue
			}
			switch {
			case agentRef == nil:
				matches = append(matches, agentTarget{agent: ag, pod: p})
			case !agentRef.IsOf(ag.Name, &cp):
			case p.DeletionTimestamp != nil:
				// The agent's old pod on its way out (a rollout, or a
				// restart under way): not the one to act on.
				terminating = append(terminating, agentTarget{agent: ag, pod: p})
			default:
				matches = append(matches, agentTarget{agent: ag, pod: p})
			}
			break
		}
	}
	if len(matches) == 0 && len(terminating) > 0 {
		matches = terminating[:1] // skipped below as terminating
	}
	what := f.Target
	switch {
	case len(matches) == 0 && agentRef != nil:
		return nil, finding.Skip("no pod of node agent %s/%s (an allowlisted agent's) on node %s now", agentRef.Namespace, agentRef.Name, a.n.Name)
	case len(matches) == 0 && name != "":
		return nil, fmt.Errorf("refusing: no pod %s/%s of an allowlisted agent on node %s (another node's pod, or not an agent)", ns, name, a.n.Name)
	case len(matches) == 0 && uid != "":
		return nil, fmt.Errorf("refusing: the pod (uid %s) of %s is no allowlisted agent's pod on node %s", uid, f.Target, a.n.Name)
	case len(matches) == 0:
		return nil, finding.Skip("no %s pod on node %s (no pod matching %q in %s)", want.Name, a.n.Name, want.LabelSelector, strings.Join(want.Namespaces, ", "))
	case len(matches) > 1:
		names := make([]string, len(matches))
		for i, m := range matches {
			names[i] = m.pod.Namespace + "/" + m.pod.Name
		}
		return nil, fmt.Errorf("refusing: %d pods on node %s match %s (%s): which one to restart is ambiguous", len(matches), a.n.Name, what, strings.Join(names, ", "))
	}
	t := matches[0]
	if t.pod.DeletionTimestamp != nil {
		return nil, finding.Skip("pod %s/%s is already terminating", t.pod.Namespace, t.pod.Name)
	}
	if _, static := t.pod.Annotations[cluster.MirrorAnnotation]; static {
		return nil, finding.Skip("pod %s/%s is the mirror of a static pod (the kubelet's manifest directory): deleting it would not restart %s; restart its container on the node (crictl stop: the kubelet starts it again) or move its manifest out of the directory and back",
			t.pod.Namespace, t.pod.Name, t.agent.Name)
	}
	if c := metav1.GetControllerOf(t.pod); c == nil || c.Kind != "DaemonSet" {
		return nil, finding.Skip("pod %s/%s is not managed by a DaemonSet: deleting it would not restart %s", t.pod.Namespace, t.pod.Name, t.agent.Name)
	}
	if ag := f.Subject.Agent; ag != nil && ag.PodUID != "" && ag.PodUID != string(t.pod.UID) {
		want := ag.PodUID
		return nil, finding.Skip("%s's pod on node %s is %s/%s (uid %s) now, not the pod (uid %s) the finding judged: replaced since; the next cycle judges the new one",
			f.Target, a.n.Name, t.pod.Namespace, t.pod.Name, t.pod.UID, want)
	}
	return &t, nil
}

// clusterPod is the part of a Pod agent matching looks at.
func clusterPod(p *corev1.Pod) cluster.Pod {
	cp := cluster.Pod{Namespace: p.Namespace, Name: p.Name, UID: string(p.UID), Labels: p.Labels, Terminating: p.DeletionTimestamp != nil}
	if c := metav1.GetControllerOf(p); c != nil {
		cp.ControllerKind, cp.ControllerName = c.Kind, c.Name
	}
	return cp
}

// nodePods lists the pods of a namespace on this node matching selector
// (field selector spec.nodeName; checked again).
func (a *restartNodeAgent) nodePods(ctx context.Context, ns, selector string) ([]corev1.Pod, error) {
	sel, err := labels.Parse(selector)
	if err != nil {
		return nil, err
	}
	l, err := a.n.Kube.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{
		LabelSelector: sel.String(),
		FieldSelector: fields.OneTermEqualSelector("spec.nodeName", a.n.Name).String(),
	})
	if err != nil {
		return nil, fmt.Errorf("listing pods in %s (%s) on node %s: %w", ns, sel, a.n.Name, err)
	}
	out := l.Items[:0]
	for _, p := range l.Items {
		if p.Spec.NodeName == a.n.Name {
			out = append(out, p)
		}
	}
	return out, nil
}

func (a *restartNodeAgent) Plan(ctx context.Context, f finding.Finding) (Plan, error) {
	t, err := a.resolve(ctx, f)
	if err != nil {
		return Plan{}, err
	}
	return Plan{
		Summary: fmt.Sprintf("delete %s pod %s/%s (uid %s) on node %s and wait up to %s for its replacement to be Ready",
			t.agent.Name, t.pod.Namespace, t.pod.Name, t.pod.UID, a.n.Name, a.p.ReadyTimeout.Duration),
		Details: map[string]any{"agent": t.agent.Name, "namespace": t.pod.Namespace, "pod": t.pod.Name, "uid": string(t.pod.UID)},
	}, nil
}

func (a *restartNodeAgent) Execute(ctx context.Context, f finding.Finding) (Result, error) {
	t, err := a.resolve(ctx, f) // re-check right before acting
	if err != nil {
		return Result{}, err
	}
	pod, uid := t.pod, t.pod.UID
	start := a.clock().Now()
	err = a.n.Kube.CoreV1().Pods(pod.Namespace).Delete(ctx, pod.Name, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &uid}})
	if err != nil && !apierrors.IsNotFound(err) {
		return Result{}, fmt.Errorf("deleting %s pod %s/%s (uid %s): %w", t.agent.Name, pod.Namespace, pod.Name, uid, err)
	}
	details := map[string]any{"agent": t.agent.Name, "namespace": pod.Namespace, "oldPod": pod.Name, "oldUID": string(uid)}
	wctx, cancel := context.WithTimeout(ctx, a.p.ReadyTimeout.Duration)
	defer cancel()
	tick := time.NewTicker(a.p.PollInterval.Duration)
	defer tick.Stop()
	// The replacement is the same DaemonSet's (resolve checked the old
	// pod has one): another DaemonSet's pod matching the selector (say,
	// calico-node-windows) is no replacement.
	owner := metav1.GetControllerOf(pod).UID
	p, last := waitReplacement(wctx, tick.C, func(ctx context.Context) ([]corev1.Pod, error) {
		pods, err := a.nodePods(ctx, pod.Namespace, t.agent.LabelSelector)
		same := pods[:0]
		for _, p := range pods {
			if c := metav1.GetControllerOf(&p); c != nil && c.UID == owner {
				same = append(same, p)
			}
		}
		return same, err
	}, uid)
	if p == nil {
		return Result{Summary: t.agent.Name + " pod deleted, replacement not Ready", Details: details},
			fmt.Errorf("deleted pod %s/%s but no Ready replacement within %s: %s", pod.Namespace, pod.Name, a.p.ReadyTimeout.Duration, last)
	}
	details["newPod"], details["newUID"] = p.Name, string(p.UID)
	details["readyAfter"] = a.clock().Since(start).Round(time.Millisecond).String()
	summary := fmt.Sprintf("deleted %s pod %s/%s; replacement %s Ready after %s",
		t.agent.Name, pod.Namespace, pod.Name, p.Name, details["readyAfter"])
	if t.agent.Name != cluster.KubeProxyAgent().Name {
		return Result{Summary: summary, Details: details}, nil
	}
	// A Ready kube-proxy is not yet one that programs the rules: wait for
	// its /healthz (its sync) too.
	if err := a.waitSynced(wctx, tick, details); err != nil {
		return Result{Summary: summary + "; sync not recovered", Details: details}, err
	}
	if details["syncRecoveredAfter"] != nil {
		summary += fmt.Sprintf(", /healthz healthy after %s", details["syncRecoveredAfter"])
	}
	return Result{Summary: summary, Details: details}, nil
}

// waitSynced waits for kube-proxy's /healthz to report healthy (its rules
// synced since the restart), through the kube-proxy adapter, within the
// readyTimeout the replacement's wait started; without the adapter it
// records why it did not check.
func (a *restartNodeAgent) waitSynced(ctx context.Context, t *time.Ticker, details map[string]any) error {
	if a.n.KubeProxy == nil {
		details["syncCheck"] = "not checked: " + a.n.Why("kube-proxy")
		return nil
	}
	start := a.clock().Now()
	last := "no answer yet"
	for {
		h, err := a.n.KubeProxy.Healthz(ctx)
		switch {
		case err != nil:
			last = err.Error()
		case h.Healthy:
			details["syncRecoveredAfter"] = a.clock().Since(start).Round(time.Millisecond).String()
			return nil
		default:
			last = fmt.Sprintf("/healthz %d, healthy=false", h.StatusCode)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("replacement kube-proxy is Ready but its sync did not recover within %s: %s", a.p.ReadyTimeout.Duration, last)
		case <-t.C:
		}
	}
}
