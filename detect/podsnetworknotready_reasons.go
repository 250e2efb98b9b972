package detect

import (
	"context"
	"fmt"

	"github.com/remediate-dev/remediate/internal/cluster"
)

// sandboxFailures reads the kubelet's sandbox Events of the oldest stuck
// pods (at most MaxEventPods; host-network pods need no CNI and are
// skipped), classifies their messages and adds, under
// "sandboxFailures", the top kind, its count, one sanitised message, the
// counts by kind and the detector the kind correlates with. It returns a
// message suffix. Events that cannot be read are said so in the evidence;
// they never stop the finding.
func (d *podsNetwork) sandboxFailures(ctx context.Context, stuck []stuckPod, ev map[string]any) string {
	if d.p.MaxEventPods == 0 {
		return ""
	}
	if d.n.PodEvents == nil {
		ev["sandboxFailures"] = "not read: " + d.n.Why("kubernetes")
		return ""
	}
	pods := make([]*cluster.Pod, len(stuck))
	for i := range stuck {
		pods[i] = stuck[i].pod
	}
	t := tallySandboxEvents(ctx, d.n.PodEvents, pods, d.p.MaxEventPods)
	tally, read, failed, withEvents, firstErr := t.tally, t.read, t.failed, t.withEvents, t.firstErr
	top, ok := tally.Top()
	if !ok {
		if failed > 0 {
			ev["sandboxFailures"] = fmt.Sprintf("not read: %d of %d pods' events failed: %v", failed, read+failed, firstErr)
			return ""
		}
		if read > 0 {
			ev["sandboxFailures"] = fmt.Sprintf("no FailedCreatePodSandBox or FailedKillPod event for the %d pods read", read)
		}
		return ""
	}
	kinds := map[string]int{}
	for _, c := range tally.Counts() {
		kinds[string(c.Kind)] = c.Count
	}
	sf := map[string]any{"topKind": string(top.Kind), "count": top.Count, "message": top.Example,
		"kinds": kinds, "podsRead": read, "podsWithEvents": withEvents}
	if failed > 0 {
		sf["podsNotRead"] = failed
		sf["readError"] = firstErr.Error()
	}
	see := ""
	if c := FailureCorrelates[top.Kind]; c != "" {
		sf["correlatesWith"] = c
		see = " (see " + c + ")"
	}
	ev["sandboxFailures"] = sf
	return fmt.Sprintf("; sandbox failures: %s x%d in the events of %d pods%s: %s", top.Kind, top.Count, withEvents, see, top.Example)
}
