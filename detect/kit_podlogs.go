package detect

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"time"

	"github.com/remediate-dev/remediate/internal/causes"
	"github.com/remediate-dev/remediate/internal/cluster"
	"github.com/remediate-dev/remediate/internal/kmod"
	"github.com/remediate-dev/remediate/internal/node"
	"github.com/remediate-dev/remediate/internal/podlogs"
	"github.com/remediate-dev/remediate/internal/procident"
)

// This file reads what kube-proxy and the CNI agents say in their
// container logs (internal/podlogs: the kubelet's /var/log/pods files,
// bounded) and turns the classified lines into likely causes
// (causes.LogLine) for the kube-proxy findings, with a missing match or
// target checked against the kernel.

// logWindowMin is the shortest window log lines are counted over: a
// failing kube-proxy retries once per syncPeriod (30 s by default), so
// 5 minutes holds several of its attempts; it is also the rate window of
// KubeProxyXtablesLockMessages.
const logWindowMin = 5 * time.Minute

// maxLogSources bounds the containers read in one pass.
const maxLogSources = 6

// logSource is one container whose log is read, and whose it is.
type logSource struct {
	src podlogs.Source
	// who is "kube-proxy" or the CNI agent's name.
	who string
	// target is the finding target of whose log it is ("kube-proxy", or
	// the CNI agent's node-agent target).
	target string
}

func (s logSource) String() string {
	return fmt.Sprintf("%s pod %s/%s container %s", s.who, s.src.Namespace, s.src.Pod, s.src.Container)
}

// logSources finds this node's kube-proxy pod (by its process's identity,
// cgroup+api, else the pod view's kube-proxy DaemonSet or static pod) and
// the CNI agents' pods on this node (as CNIAgentUnhealthy finds them),
// with the containers to read; why says what could not be found.
func logSources(ctx context.Context, n *node.Node) (out []logSource, why []string) {
	if n.Pods == nil {
		return nil, []string{"pod logs: " + n.Why("kubernetes") + " (this node's pods are not known)"}
	}
	pods := n.Pods.NodePods()
	var kp *cluster.Pod
	if n.Procs != nil {
		if _, id, err := findKubeProxy(ctx, n); err == nil && id.Method == procident.CgroupAPI {
			for i := range pods {
				if pods[i].UID == id.PodUID || pods[i].MirrorOf == id.PodUID {
					kp = &pods[i]
				}
			}
		}
	}
	if kp == nil {
		for _, a := range cluster.AgentPods(pods, []cluster.Agent{cluster.KubeProxyAgent()}) {
			if a.Pod.ControllerKind == "DaemonSet" || a.Pod.MirrorOf != "" {
				kp = a.Pod
				break
			}
		}
	}
	if kp != nil {
		out = append(out, containersOf(kp, "kube-proxy", "kube-proxy", "kube-proxy")...)
	} else {
		why = append(why, "kube-proxy's log: no kube-proxy pod on this node (neither its process's cgroup nor the API names one)")
	}
	for _, a := range cluster.AgentPods(pods, cluster.DefaultCNIAgents()) {
		out = append(out, containersOf(a.Pod, a.Agent, a.Agent, a.Ref().String())...)
	}
	if len(out) > maxLogSources {
		out = out[:maxLogSources]
	}
	return out, why
}

// containersOf are the containers of p to read: the one named prefer, else
// its regular containers (at most two); prefer when the pod has no
// container statuses yet.
func containersOf(p *cluster.Pod, who, prefer, target string) []logSource {
	uid := p.UID
	if p.MirrorOf != "" {
		uid = p.MirrorOf // the kubelet runs (and logs) a static pod under its own UID
	}
	mk := func(c string) logSource {
		return logSource{src: podlogs.Source{Namespace: p.Namespace, Pod: p.Name, UID: uid, Container: c}, who: who, target: target}
	}
	var names []string
	for _, c := range p.Containers {
		if c.Init {
			continue
		}
		if c.Name == prefer {
			return []logSource{mk(c.Name)}
		}
		names = append(names, c.Name)
	}
	if len(names) == 0 {
		return []logSource{mk(prefer)}
	}
	out := make([]logSource, 0, 2)
	for _, c := range names[:min(2, len(names))] {
		out = append(out, mk(c))
	}
	return out
}

// logLines reads the sources' tails and returns the classified lines of
// the last window, one LogLine per source, class and object (the newest
// quoted), missing extensions checked against the kernel; why says what
// could not be read.
func logLines(ctx context.Context, n *node.Node, sources []logSource, window time.Duration) (out []causes.LogLine, why []string) {
	if n.PodLogs == nil {
		return nil, []string{"pod logs: " + n.Why("podlogs")}
	}
	now := n.Clock.Now()
	from := now.Add(-window)
	var snap *kmod.Snapshot
	for _, s := range sources {
		tail, err := n.PodLogs.Tail(ctx, s.src)
		if err != nil {
			if !errors.Is(err, podlogs.ErrNoLogs) || len(why) < 4 {
				why = append(why, fmt.Sprintf("%s's log: %v", s, err))
			}
			continue
		}
		idx := map[podlogs.Class]int{}
		for _, l := range tail.Lines {
			if l.Time.Before(from) {
				continue
			}
			c, ok := podlogs.Classify(l.Text)
			if !ok {
				continue
			}
			i, seen := idx[c]
			if !seen {
				i = len(out)
				idx[c] = i
				out = append(out, causes.LogLine{Source: s.String(), Class: string(c.Kind), Object: c.Object, Window: window})
			}
			ll := &out[i]
			ll.Count++
			if !l.Time.Before(ll.Last) {
				ll.Last, ll.Quote = l.Time, podlogs.Quote(l.Text)
			}
		}
	}
	for i := range out {
		if c := out[i].Class; c == causes.ClassMissingMatch || c == causes.ClassMissingTarget {
			if snap == nil {
				root := hostRoot(n)
				if _, off := n.Unavailable[node.SubsystemHostRoot]; off {
					root = ""
				}
				snap = kmod.Read(n.ProcRoot, root)
			}
			out[i].Kernel, out[i].KernelLacks = kernelHas(snap, c == causes.ClassMissingMatch, out[i].Object)
		}
	}
	sort.SliceStable(out, func(i, j int) bool { return out[i].Last.After(out[j].Last) })
	return out, why
}

// kernelHas says what the kernel says of the module providing an xtables
// match or target (xt_<name>, or ipt_<name> as REJECT's is), and whether
// it is known to lack it.
func kernelHas(s *kmod.Snapshot, match bool, name string) (string, bool) {
	prov := kmod.Provides{Family: kmod.IPv4}
	if match {
		prov.Matches = []string{name}
	} else {
		prov.Targets = []string{name}
	}
	var best string
	var bestState kmod.State
	for _, m := range []string{"xt_" + name, "ipt_" + name} {
		st := s.State(m, prov)
		if st.Present() {
			return fmt.Sprintf("%s %s", m, st), false
		}
		if best == "" || (bestState == kmod.Unknown && st == kmod.Missing) {
			best, bestState = m, st
		}
	}
	what := fmt.Sprintf("%s %s", best, bestState)
	if sym, ok := kmod.ConfigSymbols[best]; ok && s.Config != nil {
		if v, set := s.Config[sym]; set {
			what += fmt.Sprintf(" (/proc/config.gz: %s=%s)", sym, v)
		}
	}
	return what, bestState == kmod.Missing
}

// logCauses is logSources and logLines for a cause ranking.
func logCauses(ctx context.Context, n *node.Node, span time.Duration) ([]causes.LogLine, []string) {
	if n.PodLogs == nil {
		return nil, []string{"pod logs: " + n.Why("podlogs")}
	}
	srcs, why := logSources(ctx, n)
	lines, why2 := logLines(ctx, n, srcs, max(span, logWindowMin))
	return lines, append(why, why2...)
}
