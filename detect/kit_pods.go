package detect

import (
	"context"
	"time"

	"github.com/remediate-dev/remediate/internal/cluster"
	"github.com/remediate-dev/remediate/internal/cni"
	"github.com/remediate-dev/remediate/internal/finding"
	"github.com/remediate-dev/remediate/internal/node"
)

// This node's pods as several detectors see them: the pod view, a pod's
// network readiness and last termination, the kubelet's sandbox Events,
// and the node's CNI configuration.

// podView returns the node's pod view, or a skip saying why there is none
// to trust.
func podView(n *node.Node) (cluster.PodView, error) {
	if n.Pods == nil {
		return nil, finding.Skip("%s", n.Why("kubernetes"))
	}
	f := n.Pods.Freshness()
	if !f.Synced {
		if f.LastError != nil {
			return nil, finding.Skip("the watch of this node's pods has not synced yet (%v)", f.LastError)
		}
		return nil, finding.Skip("the watch of this node's pods has not synced yet")
	}
	if !f.Connected {
		// Stale pods are no evidence either way: unknown is not absent.
		return nil, finding.Skip("the watch of this node's pods is disconnected (%v)", f.LastError)
	}
	return n.Pods, nil
}

// networkNotReady says whether a pod is waiting for its sandbox and
// network, since when (API server clock) and by which sign. The kubelet
// (1.29+) sets PodReadyToStartContainers False until the sandbox exists and
// the CNI plugin has configured its network; older kubelets only show the
// containers waiting in ContainerCreating.
func networkNotReady(p *cluster.Pod) (time.Time, string, bool) {
	if p.Terminating || p.Phase == "Succeeded" || p.Phase == "Failed" {
		return time.Time{}, "", false
	}
	if p.SandboxReady.IsFalse() {
		since := p.SandboxReady.Since
		if since.IsZero() {
			since = p.Created
		}
		return since, "PodReadyToStartContainers=False", true
	}
	if p.SandboxReady.Status != "" {
		return time.Time{}, "", false // True: sandbox and network are there
	}
	for _, c := range p.Containers {
		if c.WaitingReason == "ContainerCreating" {
			since := p.Scheduled.Since
			if since.IsZero() {
				since = p.Created
			}
			return since, "ContainerCreating", true
		}
	}
	return time.Time{}, "", false
}

// lastTerminated is the container whose previous run ended last.
func lastTerminated(p *cluster.Pod) cluster.ContainerStatus {
	var out cluster.ContainerStatus
	for _, c := range p.Containers {
		if c.LastTerminatedReason != "" && (out.LastTerminatedReason == "" || c.LastTerminatedAt.After(out.LastTerminatedAt)) {
			out = c
		}
	}
	return out
}

// FailureCorrelates names, per sandbox failure kind, the detector whose
// finding shows the cause on this node (none for Unknown).
var FailureCorrelates = map[cni.FailureKind]string{
	cni.FailureIPAMExhausted:    "HostLocalIPAM",
	cni.FailurePluginMissing:    "CNIConfig",
	cni.FailureConfig:           "CNIConfig",
	cni.FailureAgentUnreachable: "CNIAgentUnhealthy",
	cni.FailureXtablesLock:      "XtablesLockContention",
}

// sandboxTally is what the kubelet's sandbox Events of some pods say.
type sandboxTally struct {
	tally cni.FailureTally
	// read and failed count the pods whose Events were read or could not
	// be (firstErr says why), withEvents those with any sandbox Event.
	read, failed, withEvents int
	firstErr                 error
}

// tallySandboxEvents reads the kubelet's sandbox Events of pods, in their
// order (host-network pods need no CNI and are skipped), at most max pods
// tried, stopping when ctx ends, and classifies their messages (shared by
// PodsNetworkNotReady and KubeletPodStartup).
func tallySandboxEvents(ctx context.Context, ev cluster.PodEvents, pods []*cluster.Pod, max int) sandboxTally {
	var t sandboxTally
	for _, p := range pods {
		if t.read+t.failed >= max {
			break
		}
		if p.HostNetwork {
			continue
		}
		evs, err := ev.SandboxEvents(ctx, p, maxEventsPerPod)
		if err != nil {
			t.failed++
			if t.firstErr == nil {
				t.firstErr = err
			}
			if ctx.Err() != nil {
				break
			}
			continue
		}
		t.read++
		if len(evs) > 0 {
			t.withEvents++
		}
		for _, e := range evs {
			t.tally.Add(e.Message, e.Count, e.Last.Unix())
		}
	}
	return t
}

// readCNI is the node's CNI configuration: the cycle's shared read
// (node.CNI) when wired, else a read of its own.
func readCNI(ctx context.Context, n *node.Node) cni.Dir {
	if n.CNI != nil {
		return n.CNI.Read(ctx)
	}
	return cni.Read(n.CNIConfDir, n.CNIBinDir)
}

// maxEventsPerPod bounds the sandbox Events taken from one pod.
const maxEventsPerPod = 20
