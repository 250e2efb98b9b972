package cluster

import (
	"fmt"
	"sort"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/labels"
)

// MirrorAnnotation is the annotation the kubelet puts on a static pod's
// mirror (kubelet/types.ConfigMirrorAnnotationKey): its value is the static
// pod's UID, the one the kubelet runs it under and names its containers'
// cgroups with (Pod.MirrorOf).
const MirrorAnnotation = "kubernetes.io/config.mirror"

// Pod is the part of a Pod on this node the detectors and actions use:
// identity, labels (agent selectors match on them), the owner, and the
// status a kubelet writes. Times are the API server's clock.
type Pod struct {
	Namespace string            `json:"namespace"`
	Name      string            `json:"name"`
	UID       string            `json:"uid"`
	Labels    map[string]string `json:"labels,omitempty"`
	// ControllerKind is the kind of the controller owner reference
	// ("DaemonSet", "ReplicaSet"); empty for a bare or static pod.
	ControllerKind string `json:"controllerKind,omitempty"`
	// ControllerName is the controller owner reference's name (the
	// DaemonSet's); empty for a bare or static pod.
	ControllerName string `json:"controllerName,omitempty"`
	// MirrorOf is, for a static pod's mirror, the static pod's UID (its
	// MirrorAnnotation): the UID the kubelet runs it
	// under and names its cgroup with, not the mirror's UID. Empty for
	// any other pod.
	MirrorOf string    `json:"mirrorOf,omitempty"`
	Created  time.Time `json:"created"`
	// Terminating is set once the pod has a deletionTimestamp.
	Terminating bool   `json:"terminating,omitempty"`
	HostNetwork bool   `json:"hostNetwork,omitempty"`
	Phase       string `json:"phase,omitempty"`
	// SandboxReady is the PodReadyToStartContainers condition (sandbox
	// created and networking configured; kubelet 1.29+), Ready the Ready
	// condition, Scheduled the PodScheduled condition.
	SandboxReady Condition `json:"sandboxReady"`
	Ready        Condition `json:"ready"`
	Scheduled    Condition `json:"scheduled"`
	// Containers are the init and regular containers' statuses.
	Containers []ContainerStatus `json:"containers,omitempty"`
	// IPs are the pod's IPs (status.podIPs), empty before its sandbox
	// has a network or for a pod the kubelet has not reported.
	IPs []string `json:"ips,omitempty"`
	// HostPorts are the container ports of the pod's regular containers
	// that have a hostPort (what the kubelet hands the CNI as port
	// mappings).
	HostPorts []HostPort `json:"hostPorts,omitempty"`
}

// HostPort is one container port with a hostPort.
type HostPort struct {
	Container     string `json:"container"`
	HostPort      int32  `json:"hostPort"`
	ContainerPort int32  `json:"containerPort"`
	// Protocol is TCP, UDP or SCTP (TCP when the spec leaves it empty).
	Protocol string `json:"protocol"`
	// HostIP is the host address the port is bound to, "" for all.
	HostIP string `json:"hostIP,omitempty"`
}

// Condition is one pod condition: Status "True", "False" or "" (absent),
// and when it last changed (zero when absent or not set).
type Condition struct {
	Status string    `json:"status,omitempty"`
	Since  time.Time `json:"since,omitempty"`
}

// IsFalse says the condition is present and False.
func (c Condition) IsFalse() bool { return c.Status == "False" }

// IsTrue says the condition is present and True.
func (c Condition) IsTrue() bool { return c.Status == "True" }

// ContainerStatus is one container's state as the kubelet reports it.
type ContainerStatus struct {
	Name         string `json:"name"`
	Init         bool   `json:"init,omitempty"`
	Ready        bool   `json:"ready"`
	RestartCount int32  `json:"restartCount"`
	// WaitingReason and WaitingMessage (clipped) are set while the
	// container waits (ContainerCreating, CrashLoopBackOff, ...).
	WaitingReason  string `json:"waitingReason,omitempty"`
	WaitingMessage string `json:"waitingMessage,omitempty"`
	// LastTerminated* describe the previous run (lastState.terminated).
	LastTerminatedReason   string    `json:"lastTerminatedReason,omitempty"`
	LastTerminatedExitCode int32     `json:"lastTerminatedExitCode,omitempty"`
	LastTerminatedAt       time.Time `json:"lastTerminatedAt,omitempty"`
}

// Restarts is the sum of the restart counts of the pod's containers.
func (p *Pod) Restarts() int32 {
	var n int32
	for _, c := range p.Containers {
		n += c.RestartCount
	}
	return n
}

// Key is "namespace/name".
func (p *Pod) Key() string { return p.Namespace + "/" + p.Name }

// PodView is the watch of the pods bound to this node (a field selector on
// spec.nodeName: never a cluster-wide list). Implementations are
// goroutine-safe; returned values must not be modified.
type PodView interface {
	// NodePods returns the pods bound to this node, sorted by namespace
	// and name.
	NodePods() []Pod
	// Freshness reports the watch's sync state.
	Freshness() Freshness
}

// Agent names a node agent (kube-proxy, a CNI agent) by the namespaces
// and label selector of its pods.
type Agent struct {
	// Name is the agent's name in findings and journal records.
	Name string `yaml:"name" json:"name"`
	// Namespaces the agent's pods may live in.
	Namespaces []string `yaml:"namespaces" json:"namespaces"`
	// LabelSelector its pods match (Kubernetes selector syntax).
	LabelSelector string `yaml:"labelSelector" json:"labelSelector"`
}

// DefaultCNIAgents are the labels and namespaces the common CNI agents'
// DaemonSets give their pods (their upstream manifests and charts):
// Calico (manifest install in kube-system, operator install in
// calico-system), Cilium, Flannel (kube-flannel since v0.20, kube-system
// before), the AWS VPC CNI, Antrea, kube-router and Weave Net.
func DefaultCNIAgents() []Agent {
	return []Agent{
		{Name: "calico-node", Namespaces: []string{"kube-system", "calico-system"}, LabelSelector: "k8s-app=calico-node"},
		{Name: "cilium", Namespaces: []string{"kube-system"}, LabelSelector: "k8s-app=cilium"},
		{Name: "flannel", Namespaces: []string{"kube-flannel", "kube-system"}, LabelSelector: "app=flannel"},
		{Name: "aws-node", Namespaces: []string{"kube-system"}, LabelSelector: "k8s-app=aws-node"},
		{Name: "antrea-agent", Namespaces: []string{"kube-system"}, LabelSelector: "component=antrea-agent"},
		{Name: "kube-router", Namespaces: []string{"kube-system"}, LabelSelector: "k8s-app=kube-router"},
		{Name: "weave-net", Namespaces: []string{"kube-system"}, LabelSelector: "name=weave-net"},
	}
}

// KubeProxyAgent is kube-proxy's DaemonSet pods as kubeadm labels them.
func KubeProxyAgent() Agent {
	return Agent{Name: "kube-proxy", Namespaces: []string{"kube-system"}, LabelSelector: "k8s-app=kube-proxy"}
}

// Validate says what is wrong with an agent entry, or nil.
func (a Agent) Validate() error {
	if a.Name == "" {
		return fmt.Errorf("name must not be empty")
	}
	if len(a.Namespaces) == 0 {
		return fmt.Errorf("agent %s: namespaces must not be empty", a.Name)
	}
	for _, ns := range a.Namespaces {
		if ns == "" {
			return fmt.Errorf("agent %s: empty namespace", a.Name)
		}
	}
	sel, err := labels.Parse(a.LabelSelector)
	if err != nil {
		return fmt.Errorf("agent %s: labelSelector: %w", a.Name, err)
	}
	if sel.Empty() {
		return fmt.Errorf("agent %s: labelSelector must not be empty (it would match every pod)", a.Name)
	}
	return nil
}

// Matches says whether the pod belongs to the agent. An invalid selector
// matches nothing.
func (a Agent) Matches(p *Pod) bool {
	in := false
	for _, ns := range a.Namespaces {
		if ns == p.Namespace {
			in = true
			break
		}
	}
	if !in {
		return false
	}
	sel, err := labels.Parse(a.LabelSelector)
	if err != nil || sel.Empty() {
		return false
	}
	return sel.Matches(labels.Set(p.Labels))
}

// AgentPods returns the pods of the view that belong to one of the
// agents, with the agent each belongs to (the first that matches),
// terminating pods excluded, sorted by namespace and name.
func AgentPods(pods []Pod, agents []Agent) []AgentPod {
	var out []AgentPod
	for i := range pods {
		p := &pods[i]
		if p.Terminating {
			continue
		}
		for _, a := range agents {
			if a.Matches(p) {
				out = append(out, AgentPod{Agent: a.Name, Pod: p})
				break
			}
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Pod.Key() < out[j].Pod.Key() })
	return out
}

// AgentPod is a pod of a named agent.
type AgentPod struct {
	Agent string
	Pod   *Pod
}

// NodePodsTarget is the target of the finding about this node's pods that
// cannot get a sandbox or network: one finding for all of them.
const NodePodsTarget = "pods/network-not-ready"

// PodRef is the target of a finding about one pod: "pod/<ns>/<name>".
type PodRef struct {
	Namespace, Name string
}

// String encodes the reference.
func (r PodRef) String() string { return "pod/" + r.Namespace + "/" + r.Name }

// ParsePodRef decodes a PodRef target.
func ParsePodRef(target string) (PodRef, error) {
	rest, ok := strings.CutPrefix(target, "pod/")
	ns, name, ok2 := strings.Cut(rest, "/")
	if !ok || !ok2 || ns == "" || name == "" || strings.Contains(name, "/") {
		return PodRef{}, fmt.Errorf("not a pod target: %q", target)
	}
	return PodRef{Namespace: ns, Name: name}, nil
}

// AgentRef is the target of a finding about a node agent on this node:
// "node-agent/<ns>/<name>", name the controller (DaemonSet) of the agent's
// pods, or the Agent's name for a pod with no controller. Unlike a PodRef
// it survives the pod's replacement: the engine's cooldown, escalation
// and verification, kept per target, follow the agent, not one pod of it.
type AgentRef struct {
	Namespace, Name string
}

// AgentTargetPrefix starts every AgentRef target.
const AgentTargetPrefix = "node-agent/"

// String encodes the reference.
func (r AgentRef) String() string { return AgentTargetPrefix + r.Namespace + "/" + r.Name }

// ParseAgentRef decodes an AgentRef target.
func ParseAgentRef(target string) (AgentRef, error) {
	rest, ok := strings.CutPrefix(target, AgentTargetPrefix)
	ns, name, ok2 := strings.Cut(rest, "/")
	if !ok || !ok2 || ns == "" || name == "" || strings.Contains(name, "/") {
		return AgentRef{}, fmt.Errorf("not a node agent target: %q", target)
	}
	return AgentRef{Namespace: ns, Name: name}, nil
}

// Ref is the stable target of the agent pod: its namespace and its
// controller's name, or the agent's name when it has no controller.
func (a AgentPod) Ref() AgentRef {
	name := a.Pod.ControllerName
	if name == "" {
		name = a.Agent
	}
	return AgentRef{Namespace: a.Pod.Namespace, Name: name}
}

// IsOf says whether the pod p, of agent agent, is the one ref names
// (the inverse of AgentPod.Ref).
func (r AgentRef) IsOf(agent string, p *Pod) bool {
	return AgentPod{Agent: agent, Pod: p}.Ref() == r
}

// Evidence keys of pod findings shared by detectors and actions.
const (
	// EvidenceAgent is the node agent a pod belongs to (Agent.Name).
	EvidenceAgent = "agent"
	// EvidencePodUID is the pod's UID when the finding was made.
	EvidencePodUID = "podUID"
)
