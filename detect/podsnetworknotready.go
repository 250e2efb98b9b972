package detect

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/remediate-dev/remediate/internal/clip"
	"github.com/remediate-dev/remediate/internal/cluster"
	"github.com/remediate-dev/remediate/internal/finding"
	"github.com/remediate-dev/remediate/internal/node"
	"github.com/remediate-dev/remediate/policy"
)

// PodsNetworkNotReadyParams are the thresholds of PodsNetworkNotReady.
type PodsNetworkNotReadyParams struct {
	// MinAge is how long a pod may go without a sandbox and network
	// (PodReadyToStartContainers False, or waiting in ContainerCreating
	// before that condition existed) before it counts. Default 5m, the
	// threshold field guide 3 (kube-proxy and CNI conflicts) gives for
	// "ContainerCreating > 5 minutes".
	MinAge policy.Duration `yaml:"minAge"`
	// MinPods is how many such pods make a finding (default 1).
	MinPods int `yaml:"minPods"`
	// MaxListed bounds the pods named in the finding (default 10, oldest
	// first); the count is always complete.
	MaxListed int `yaml:"maxListed"`
	// Agents are the CNI agents whose pods' state is added as evidence
	// (default: the common agents, as CNIAgentUnhealthy).
	Agents []cluster.Agent `yaml:"agents"`
	// MaxEventPods is how many stuck pods (oldest first) have their
	// kubelet sandbox Events (FailedCreatePodSandBox, FailedKillPod) read,
	// one field-selected LIST each, to classify why their sandbox fails
	// (default 10, at most 50; 0: Events are not read).
	MaxEventPods int `yaml:"maxEventPods"`
}

// SetDefaults sets the defaults of PodsNetworkNotReady (registry.Defaulter).
func (p *PodsNetworkNotReadyParams) SetDefaults() {
	*p = PodsNetworkNotReadyParams{MinAge: policy.D(5 * time.Minute), MinPods: 1, MaxListed: 10, Agents: cluster.DefaultCNIAgents(), MaxEventPods: 10}
}

// Validate implements policy.Validator.
func (p *PodsNetworkNotReadyParams) Validate() []policy.FieldError {
	var errs []policy.FieldError
	if p.MinAge.Duration <= 0 {
		errs = append(errs, policy.FieldError{Field: "minAge", Msg: "must be > 0"})
	}
	if p.MinPods < 1 {
		errs = append(errs, policy.FieldError{Field: "minPods", Msg: "must be >= 1"})
	}
	if p.MaxListed < 1 || p.MaxListed > 100 {
		errs = append(errs, policy.FieldError{Field: "maxListed", Msg: "must be between 1 and 100"})
	}
	if p.MaxEventPods < 0 || p.MaxEventPods > 50 {
		errs = append(errs, policy.FieldError{Field: "maxEventPods", Msg: "must be between 0 and 50"})
	}
	return append(errs, validateAgents(p.Agents)...)
}

func init() {
	Define("PodsNetworkNotReady",
		"pods of this node without a sandbox/network (PodReadyToStartContainers False, or ContainerCreating) for longer than minAge: one node finding counting them, with why (the kubelet's sandbox Events classified: IPAM exhausted, plugin missing, config, CNI agent unreachable, xtables lock) and the CNI agent's, the xtables lock's and kube-proxy's state",
		newPodsNetworkNotReady, Targets(finding.KindNodePods))
}

type podsNetwork struct {
	p PodsNetworkNotReadyParams
	n *node.Node
	judgement
}

func newPodsNetworkNotReady(p *PodsNetworkNotReadyParams, n *node.Node) (Detector, error) {
	return &podsNetwork{p: *p, n: n}, nil
}

// stuckPod is a pod without sandbox/network, since when and why.
type stuckPod struct {
	pod   *cluster.Pod
	since time.Time
	why   string
}

func (d *podsNetwork) Detect(ctx context.Context) ([]finding.Finding, error) {
	view, err := podView(d.n)
	if err != nil {
		return nil, err
	}
	now := d.n.Clock.Now()
	pods := view.NodePods()
	var stuck []stuckPod
	waiting, hostNet := 0, 0
	for i := range pods {
		since, why, ok := networkNotReady(&pods[i])
		if !ok {
			continue
		}
		waiting++
		if now.Sub(since) < d.p.MinAge.Duration {
			continue
		}
		if pods[i].HostNetwork {
			hostNet++
		}
		stuck = append(stuck, stuckPod{pod: &pods[i], since: since, why: why})
	}
	d.set("%d of %d pods on node %s without sandbox/network longer than %s (%d waiting less)", len(stuck), len(pods), d.n.Name, d.p.MinAge.Duration, waiting-len(stuck))
	if len(stuck) < d.p.MinPods {
		return nil, nil
	}
	sort.Slice(stuck, func(i, j int) bool {
		if !stuck[i].since.Equal(stuck[j].since) {
			return stuck[i].since.Before(stuck[j].since)
		}
		return stuck[i].pod.Key() < stuck[j].pod.Key()
	})
	listed := make([]map[string]any, 0, min(len(stuck), d.p.MaxListed))
	names := make([]string, 0, cap(listed))
	for _, s := range stuck[:min(len(stuck), d.p.MaxListed)] {
		e := map[string]any{"pod": s.pod.Key(), "since": s.since.UTC().Format(time.RFC3339),
			"waitingSeconds": durSeconds(now.Sub(s.since)), "sign": s.why}
		if msg := waitingMessage(s.pod); msg != "" {
			e["message"] = msg
		}
		if s.pod.HostNetwork {
			e["hostNetwork"] = true
		}
		listed = append(listed, e)
		names = append(names, s.pod.Key())
	}
	ev := map[string]any{
		"stuckPods":   len(stuck),
		"nodePods":    len(pods),
		"minAge":      d.p.MinAge.Duration.String(),
		"pods":        listed,
		"oldestSince": stuck[0].since.UTC().Format(time.RFC3339),
	}
	if hostNet > 0 {
		ev["hostNetworkPods"] = hostNet // these need no CNI: their wait is not the network's
	}
	more := ""
	if len(stuck) > len(names) {
		more = fmt.Sprintf(" and %d more", len(stuck)-len(names))
	}
	msg := fmt.Sprintf("%d pods on node %s have had no sandbox/network for more than %s (oldest %s for %s): %s%s",
		len(stuck), d.n.Name, d.p.MinAge.Duration, stuck[0].pod.Key(), now.Sub(stuck[0].since).Round(time.Second), strings.Join(names, ", "), more)
	msg += d.correlate(ctx, pods, ev)
	msg += d.sandboxFailures(ctx, stuck, ev)
	return []finding.Finding{{Detector: "PodsNetworkNotReady", Target: cluster.NodePodsTarget, Severity: finding.Warning, Message: msg, Evidence: ev}}, nil
}

// waitingMessage is the kubelet's first waiting message of the pod (the
// CNI error usually), clipped.
func waitingMessage(p *cluster.Pod) string {
	for _, c := range p.Containers {
		if c.WaitingMessage != "" {
			return clip.String(c.WaitingMessage, 256)
		}
	}
	return ""
}

// correlate adds what shares the node with the stuck pods' sandboxes: the
// CNI agent's pods, the xtables lock (holders, waiters; read from
// /proc/locks, never by taking it) and kube-proxy's health. It returns a
// message suffix; a source that cannot be read is named in the evidence.
func (d *podsNetwork) correlate(ctx context.Context, pods []cluster.Pod, ev map[string]any) string {
	var parts []string
	agents := cluster.AgentPods(pods, d.p.Agents)
	if len(agents) == 0 {
		ev["cniAgent"] = "no pod of the configured CNI agents on this node"
		parts = append(parts, "no CNI agent pod found")
	} else {
		var list []map[string]any
		for _, a := range agents {
			list = append(list, map[string]any{"agent": a.Agent, "pod": a.Pod.Key(), "ready": a.Pod.Ready.IsTrue(),
				"restartCount": a.Pod.Restarts(), "lastTerminatedReason": lastTerminated(a.Pod).LastTerminatedReason})
			state := "Ready"
			if !a.Pod.Ready.IsTrue() {
				state = "not Ready"
			}
			parts = append(parts, fmt.Sprintf("CNI agent %s %s (%d restarts)", a.Pod.Key(), state, a.Pod.Restarts()))
		}
		ev["cniAgent"] = list
	}
	if d.n.Procs != nil && d.n.XtablesLock != "" {
		if l, err := d.n.Procs.FileLocks(ctx, d.n.XtablesLock); err != nil {
			ev["xtablesLock"] = "not read: " + err.Error()
		} else {
			var holders []string
			for _, h := range l.Holders {
				holders = append(holders, fmt.Sprintf("%s (pid %d)", h.Name(), h.Pid))
			}
			ev["xtablesLock"] = map[string]any{"held": l.Held, "holders": holders, "waiters": len(l.Waiters)}
			if l.Held {
				parts = append(parts, fmt.Sprintf("xtables lock held by %s, %d waiting", strings.Join(holders, ", "), len(l.Waiters)))
			} else {
				parts = append(parts, "xtables lock free")
			}
		}
	}
	if d.n.KubeProxy != nil {
		qctx, cancel := kubeProxyQueryCtx(ctx) // a frozen kube-proxy costs this part only
		h, err := d.n.KubeProxy.Healthz(qctx)
		cancel()
		if err != nil {
			ev["kubeProxy"] = "not read: " + err.Error()
		} else {
			ev["kubeProxy"] = map[string]any{"healthy": h.Healthy, "statusCode": h.StatusCode, "lastUpdated": h.LastUpdated.UTC().Format(time.RFC3339)}
			parts = append(parts, fmt.Sprintf("kube-proxy /healthz %d", h.StatusCode))
		}
	}
	if len(parts) == 0 {
		return ""
	}
	return "; " + strings.Join(parts, "; ")
}
