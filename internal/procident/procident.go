// Package procident tells whose a process is from what the kernel shows
// every process without ptrace and what the API says of this node's pods:
// the pod UID in the process's cgroup (/proc/<pid>/cgroup, a path the
// process cannot choose: moving into another cgroup takes write access to
// it, which a pod's process has not) must be a pod of this node that the
// API says is kube-proxy's or an allowlisted node agent's (its namespace
// and labels, owned by a DaemonSet, or a static pod through its mirror).
// A process in no pod's cgroup is a host process. A process in any other
// pod's cgroup is nobody's agent, whatever its name or executable.
//
// Where CAP_SYS_PTRACE is granted, the executable (and for kube-proxy its
// Go build information) is a second opinion the callers apply on top,
// never the only one.
package procident

import (
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/remediate-dev/remediate/internal/clip"
	"github.com/remediate-dev/remediate/internal/cluster"
	"github.com/remediate-dev/remediate/internal/procs"
)

// Method says how an identity was established (evidence "identity").
type Method string

const (
	// CgroupAPI: the pod UID of the process's cgroup is a pod of this
	// node the API says is the agent's.
	CgroupAPI Method = "cgroup+api"
	// HostCgroup: the process is in no pod's cgroup (a host process: a
	// systemd unit, an administrator's shell; only root on the host puts
	// a process there).
	HostCgroup Method = "host-cgroup"
)

// Pods is the view of this node's pods identities are checked against.
type Pods struct {
	pods []cluster.Pod
	// skip says why the view cannot be used ("" when it can).
	skip string
}

// PodsOf takes the pods of the view at now, or why they cannot be
// trusted: no view (no cluster access), not synced, over its budget, or
// disconnected (an identity decides a kill: a stale view is no evidence).
func PodsOf(v cluster.PodView, now time.Time) Pods {
	if v == nil {
		return Pods{skip: "no watch of this node's pods (no cluster access)"}
	}
	f := v.Freshness()
	_, skip := f.Usable(now)
	switch {
	case skip != "":
		return Pods{skip: "the watch of this node's pods cannot be used: " + skip}
	case !f.Connected:
		why := "disconnected"
		if f.LastError != nil {
			why += ": " + f.LastError.Error()
		}
		return Pods{skip: "the watch of this node's pods is " + why}
	}
	return Pods{pods: v.NodePods()}
}

// agentPod is a pod of the usable view that is the agent's (a DaemonSet's
// or a static pod), nil when none or the view is not usable.
func (ps Pods) agentPod(a cluster.Agent) *cluster.Pod {
	if ps.skip != "" {
		return nil
	}
	for i := range ps.pods {
		q := &ps.pods[i]
		if (q.MirrorOf != "" || q.ControllerKind == "DaemonSet") && !q.Terminating && a.Matches(q) {
			return q
		}
	}
	return nil
}

// PodsFrom is a usable view of the given pods (tests, and callers that
// have checked their view).
func PodsFrom(pods []cluster.Pod) Pods { return Pods{pods: pods} }

// Identity is who a process is.
type Identity struct {
	// Method is how it was established; "" when it was not (Refused says
	// why).
	Method Method
	// Agent is the agent whose pod the process is in ("" for a host
	// process).
	Agent string
	// Pod is the pod's "namespace/name", PodUID the UID in the cgroup,
	// ContainerID the container's (when the cgroup names it); Owner how
	// the pod is the agent's ("DaemonSet <name>", "static pod").
	Pod, PodUID, ContainerID, Owner string
	// Unit is a host process's systemd unit ("" when none is named).
	Unit string
	// Program is the process's name (argv[0]'s basename).
	Program string
	// Refused says why no identity could be established.
	Refused string
	// Served, when set, says the process was found serving kube-proxy's
	// ports (Listening.KubeProxy), not by its name.
	Served *Served
}

// Shape is how the node runs the process: what restarting it takes.
type Shape string

// The shapes of Identity.Shape.
const (
	// ShapeDaemonSetPod: a DaemonSet's pod, which deleting restarts.
	ShapeDaemonSetPod Shape = "DaemonSet pod"
	// ShapeStaticPod: a static pod (the kubelet's manifest; the API has
	// its mirror, whose deletion restarts nothing).
	ShapeStaticPod Shape = "static pod"
	// ShapeSystemdUnit: a host process of a systemd unit.
	ShapeSystemdUnit Shape = "systemd unit"
	// ShapeEmbedded: kube-proxy run inside another program (k3s).
	ShapeEmbedded Shape = "embedded"
	// ShapeHostProcess: a host process of no unit (a shell, a script).
	ShapeHostProcess Shape = "host process"
)

// EmbeddedProxyPrograms are the names (argv[0]'s basename) of the
// programs that run kube-proxy inside them: k3s's server and agent
// (k3s-io/k3s#11098), run as k3s-server/k3s-agent, whose process title
// k3s rewrites to "<argv0> server" / "<argv0> agent" (its proctitle). Such
// a host process is this node's kube-proxy, and its iptables-restore
// children are kube-proxy's own.
var EmbeddedProxyPrograms = []string{"k3s-server", "k3s-agent", "k3s server", "k3s agent"}

// embeddedExecutables are the executables an embedded program may have
// (k3s's multi-call binary).
var embeddedExecutables = []string{"k3s", "k3s-server", "k3s-agent"}

// Shape returns how the node runs the identified process ("" when not
// identified).
func (id Identity) Shape() Shape {
	switch {
	case id.Method == CgroupAPI && id.Owner == "static pod":
		return ShapeStaticPod
	case id.Method == CgroupAPI:
		return ShapeDaemonSetPod
	case id.Method != HostCgroup:
		return ""
	case slices.Contains(EmbeddedProxyPrograms, id.Program):
		return ShapeEmbedded
	case id.Unit != "":
		return ShapeSystemdUnit
	}
	return ShapeHostProcess
}

// RestartHow says how an operator restarts the process when deleting a
// pod through the API cannot ("" for a DaemonSet's pod, or when not
// identified).
func (id Identity) RestartHow() string {
	switch id.Shape() {
	case ShapeStaticPod:
		return fmt.Sprintf("it is the static pod %s from the kubelet's manifest directory: deleting its mirror pod restarts nothing; restart its container on the node (crictl stop %s: the kubelet starts it again) or move its manifest out of the directory and back",
			id.Pod, shortID(id.ContainerID))
	case ShapeEmbedded:
		how := "restart k3s on the node"
		if id.Unit != "" {
			how = "systemctl restart " + id.Unit
		}
		return fmt.Sprintf("it runs inside %s (k3s's embedded kube-proxy): only restarting k3s restarts it (%s), which this daemon does not do", id.Program, how)
	case ShapeSystemdUnit:
		return fmt.Sprintf("it runs as the systemd unit %s: restart it on the node with systemctl restart %s", id.Unit, id.Unit)
	case ShapeHostProcess:
		return "it is a host process of no systemd unit: whoever started it restarts it"
	}
	return ""
}

func shortID(c string) string {
	if c == "" {
		return "<its container>"
	}
	return c[:min(12, len(c))]
}

// OK reports whether the identity was established.
func (id Identity) OK() bool { return id.Method != "" }

// String is the identity for messages.
func (id Identity) String() string {
	if id.Served != nil {
		return id.str() + "; " + id.Served.String()
	}
	return id.str()
}

func (id Identity) str() string {
	switch id.Method {
	case CgroupAPI:
		s := fmt.Sprintf("%s (pod %s, %s, uid %s", id.Method, id.Pod, id.Owner, id.PodUID)
		if c := id.ContainerID; c != "" {
			s += ", container " + c[:min(12, len(c))]
		}
		return s + ")"
	case HostCgroup:
		switch id.Shape() {
		case ShapeEmbedded:
			return fmt.Sprintf("%s (in no pod's cgroup: kube-proxy embedded in %s)", id.Method, id.Program)
		case ShapeSystemdUnit:
			return fmt.Sprintf("%s (in no pod's cgroup: a host process of systemd unit %s)", id.Method, id.Unit)
		}
		return string(id.Method) + " (in no pod's cgroup: a host process)"
	}
	return "none: " + id.Refused
}

// Evidence records the identity in a finding's evidence.
func (id Identity) Evidence(ev map[string]any) {
	if id.OK() {
		ev["identity"] = string(id.Method)
	} else {
		ev["identity"] = "none"
		ev["identityRefused"] = id.Refused
	}
	if id.Agent != "" {
		ev["identityAgent"] = id.Agent
	}
	if id.Pod != "" {
		ev["identityPod"] = id.Pod
	}
	if id.PodUID != "" {
		ev["podUID"] = id.PodUID
	}
	if id.ContainerID != "" {
		ev["containerID"] = id.ContainerID
	}
	if sh := id.Shape(); sh != "" {
		ev["shape"] = string(sh)
	}
	if id.Unit != "" {
		ev["systemdUnit"] = id.Unit
	}
	if how := id.RestartHow(); how != "" {
		ev["restartHow"] = how
	}
	if id.Served != nil {
		ev["identityListener"] = id.Served.String()
	}
}

// Of tells whose p is: a host process, a process of one of the agents'
// pods on this node, or (Refused) neither or cannot tell.
func Of(p procs.Process, pods Pods, agents []cluster.Agent) Identity {
	c := p.Cgroup
	switch c.Place {
	case procs.CgroupHost:
		return Identity{Method: HostCgroup, Unit: c.Unit, Program: p.Name()}
	case procs.CgroupAmbiguous:
		return Identity{Refused: fmt.Sprintf("pid %d's cgroup cannot be told: %s", p.Pid, c.Why)}
	case procs.CgroupPod:
	default:
		return Identity{Refused: fmt.Sprintf("pid %d's cgroup is not readable", p.Pid)}
	}
	id := Identity{PodUID: c.PodUID, ContainerID: c.ContainerID, Program: p.Name()}
	if pods.skip != "" {
		id.Refused = fmt.Sprintf("pid %d runs in the cgroup of pod %s, but %s: whose pod that is cannot be told", p.Pid, c.PodUID, pods.skip)
		return id
	}
	var pod *cluster.Pod
	for i := range pods.pods {
		q := &pods.pods[i]
		// A static pod runs under its configuration's UID, which its
		// mirror carries in an annotation (the mirror's own UID is not
		// in any cgroup).
		if q.UID == c.PodUID && q.MirrorOf == "" || q.MirrorOf == c.PodUID {
			pod = q
			break
		}
	}
	if pod == nil {
		id.Refused = fmt.Sprintf("pid %d runs in the cgroup of pod %s, which the API does not list on this node (another node's or cluster's process, or a pod deleted since)", p.Pid, c.PodUID)
		return id
	}
	id.Pod = pod.Key()
	switch {
	case pod.MirrorOf != "":
		id.Owner = "static pod"
	case pod.ControllerKind == "DaemonSet":
		id.Owner = "DaemonSet " + pod.ControllerName
	}
	for _, a := range agents {
		if id.Owner != "" && a.Matches(pod) {
			id.Method, id.Agent = CgroupAPI, a.Name
			return id
		}
	}
	names := make([]string, 0, len(agents))
	for _, a := range agents {
		names = append(names, a.Name)
	}
	owner := id.Owner
	if owner == "" {
		owner = "neither a DaemonSet's nor a static pod"
	}
	id.Refused = fmt.Sprintf("pid %d runs in the cgroup of pod %s (%s), which is not a pod of %s", p.Pid, pod.Key(), owner, strings.Join(names, ", "))
	return id
}

// KubeProxy tells whether p (named kube-proxy, or one of
// EmbeddedProxyPrograms) is this node's kube-proxy: a process of
// kube-proxy's pod (cgroup+api: a DaemonSet's or a static pod), or a host
// process with CAP_NET_ADMIN (a kube-proxy run as a systemd unit, or k3s
// with its kube-proxy inside; an embedded program only on the host);
// either way in this daemon's network namespace (selfNetKey, the node's:
// kube-proxy runs with hostNetwork) when both keys are known. exe, when
// readable (ptrace), must be a kube-proxy (or k3s's) too. The identity
// is returned with Refused set when p is not.
func KubeProxy(p procs.Process, pods Pods, selfNetKey uint64) Identity {
	return judgeKubeProxy(p, pods, selfNetKey, false)
}

// judgeKubeProxy is KubeProxy; served says p was found serving kube-proxy's
// ports (Listening.KubeProxy): its name and executable's name are then
// not checked (a renamed binary serving the ports is kube-proxy).
func judgeKubeProxy(p procs.Process, pods Pods, selfNetKey uint64, served bool) Identity {
	id := Of(p, pods, []cluster.Agent{cluster.KubeProxyAgent()})
	if !id.OK() {
		return id
	}
	embedded := slices.Contains(EmbeddedProxyPrograms, p.Name())
	if embedded && id.Method != HostCgroup {
		id.Method, id.Refused = "", fmt.Sprintf("pid %d (%s) runs in a pod's cgroup: an embedded kube-proxy runs on the host", p.Pid, p.Name())
		return id
	}
	if id.Method == HostCgroup {
		if p.CapEff&procs.CapNetAdmin == 0 {
			id.Method, id.Refused = "", fmt.Sprintf("pid %d is a host process without CAP_NET_ADMIN (CapEff %016x): not a kube-proxy", p.Pid, p.CapEff)
			return id
		}
		if kp := pods.agentPod(cluster.KubeProxyAgent()); kp != nil {
			id.Method, id.Refused = "", fmt.Sprintf("pid %d is a host process, and this node's kube-proxy is the pod %s (the API)", p.Pid, kp.Key())
			return id
		}
	}
	if p.NetKey != 0 && selfNetKey != 0 && p.NetKey != selfNetKey {
		id.Method, id.Refused = "", fmt.Sprintf("pid %d runs in another network namespace (net/dev inode %d, this node's is %d)", p.Pid, p.NetKey, selfNetKey)
		return id
	}
	if served {
		return id
	}
	if p.Exe != "" && embedded && !slices.Contains(embeddedExecutables, filepath.Base(p.Exe)) {
		id.Method, id.Refused = "", fmt.Sprintf("pid %d's executable is %s, not k3s", p.Pid, clip.String(p.Exe, 256))
		return id
	}
	if p.Exe != "" && !embedded && filepath.Base(p.Exe) != "kube-proxy" {
		id.Method, id.Refused = "", fmt.Sprintf("pid %d's executable is %s, not a kube-proxy", p.Pid, clip.String(p.Exe, 256))
		return id
	}
	return id
}

// Target tells whether p may be a netfilter target (an iptables restore,
// an nft, a holder of the xtables lock): a process of one of the agents'
// pods (kube-proxy's, a CNI agent's: their iptables-restore and nft run
// in their container) or a host process, with CAP_NET_ADMIN (readable
// without ptrace), in the node's network namespace unless onNodeLock (it
// holds or waits on the node's xtables lock); its executable, when
// readable, one of programs. A process in any other pod's cgroup never
// is.
func Target(p procs.Process, pods Pods, agents []cluster.Agent, programs []string, selfNetKey uint64, onNodeLock bool) Identity {
	id := Of(p, pods, agents)
	if !id.OK() {
		return id
	}
	refuse := func(format string, args ...any) Identity {
		id.Method, id.Refused = "", fmt.Sprintf(format, args...)
		return id
	}
	if p.CapEff&procs.CapNetAdmin == 0 {
		return refuse("it runs without CAP_NET_ADMIN (CapEff %016x)", p.CapEff)
	}
	if p.Exe != "" && !slices.Contains(programs, filepath.Base(p.Exe)) {
		return refuse("its executable %q is not an iptables/nft program (%s)", clip.String(p.Exe, 256), strings.Join(programs, ", "))
	}
	if !onNodeLock && (p.NetKey == 0 || selfNetKey == 0 || p.NetKey != selfNetKey) {
		return refuse("it runs in network namespace %s, not the node's (%s), and neither holds nor waits on the node's xtables lock", netKey(p.NetKey), netKey(selfNetKey))
	}
	return id
}

func netKey(k uint64) string {
	if k == 0 {
		return "unknown"
	}
	return fmt.Sprintf("net/dev inode %d", k)
}

// Agents are the agents whose processes may be netfilter targets:
// kube-proxy and the given CNI agents.
func Agents(cni []cluster.Agent) []cluster.Agent {
	return append([]cluster.Agent{cluster.KubeProxyAgent()}, cni...)
}
