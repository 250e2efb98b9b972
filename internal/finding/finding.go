// Package finding holds the types every layer of remediate shares: the
// Finding a detector reports and an action remedies, its Severity, the
// Kind of target it is about, and the Skip error that says "cannot run
// here, and why".
//
// It is the ground floor: it imports nothing of this module, and
// everything else (adapters, detectors, actions, guardrails, the engine,
// the exporters) may import it.
package finding

import (
	"errors"
	"fmt"
)

// Severity of a finding.
type Severity string

// Severities, in increasing order.
const (
	Info     Severity = "info"
	Warning  Severity = "warning"
	Critical Severity = "critical"
)

// Finding is one problem a detector sees now.
//
// Target is the stable identity of what the finding is about, unique within
// the detector and the same from one cycle to the next while it is the same
// thing: "process/1234@1763712000000" (PID and create time, so a reused PID
// is a new target), "conntrack/table", "ipvs-vs/UDP/10.96.0.10:53",
// "kube-proxy/IPv4". The engine keys its per-target state machine on
// (rule, Target). Targets are encoded and decoded by the typed references
// of the adapter that owns them (procs.Ref, ipvs.VirtualRef, ...).
//
// Evidence carries what an operator needs to judge the finding. Values
// must be JSON-encodable. The JSON keys of Finding are part of the stable
// report. What the engine and the paired action read of the target is in
// Subject, typed, not in Evidence.
type Finding struct {
	Detector string         `json:"detector"`
	Target   string         `json:"target"`
	Severity Severity       `json:"severity"`
	Message  string         `json:"message"`
	Evidence map[string]any `json:"evidence,omitempty"`
	// Subject is the typed facts of the target the engine and the action
	// read; not in the report.
	Subject Subject `json:"-"`
}

// Kind is the kind of target a finding is about. Detector types declare
// the kinds they report, action types the kinds they can act on; the
// policy loader refuses a rule whose detector cannot feed its action.
type Kind string

// Target kinds. Each has one typed reference beside the adapter that owns
// it, with one encoder and one decoder.
const (
	// KindProcess: "process/<pid>@<createTimeMs>" (procs.Ref).
	KindProcess Kind = "process"
	// KindConntrackTable: the nf_conntrack table and its tunables
	// ("conntrack/table", "conntrack/max-drift"; conntrack.TableRef).
	KindConntrackTable Kind = "conntrack-table"
	// KindConntrackBackend: the conntrack entries of one dead backend
	// ("ipvs-conn/UDP/10.244.1.5:53"; conntrack.BackendRef).
	KindConntrackBackend Kind = "conntrack-backend"
	// KindIPVSVirtualServer: a kernel IPVS virtual server that exists
	// ("ipvs-vs/UDP/10.96.0.10:53"; ipvs.VirtualRef).
	KindIPVSVirtualServer Kind = "ipvs-virtual-server"
	// KindIPVSRealServer: a real server of an IPVS virtual server
	// ("ipvs-rs/UDP/10.96.0.10:53/10.244.1.5:53"; ipvs.RealRef).
	KindIPVSRealServer Kind = "ipvs-real-server"
	// KindIPVSMissingVirtualServer: a Service that has no IPVS virtual
	// server (nothing in the kernel to act on).
	KindIPVSMissingVirtualServer Kind = "ipvs-missing-virtual-server"
	// KindIPVSTimeouts: the IPVS connection timeouts ("ipvs/timeouts").
	KindIPVSTimeouts Kind = "ipvs-timeouts"
	// KindIPVSLeftovers: what kube-proxy's IPVS mode left (virtual
	// servers on Service addresses, kube-ipvs0) while it runs in another
	// mode ("ipvs/kube-proxy-leftovers"); report only.
	KindIPVSLeftovers Kind = "ipvs-leftovers"
	// KindKubeProxy: kube-proxy itself, or one of its IP families
	// ("kube-proxy/IPv4"; kubeproxy.Family).
	KindKubeProxy Kind = "kube-proxy"
	// KindIPTablesRules: the iptables rule sets of one family and backend.
	KindIPTablesRules Kind = "iptables-rules"
	// KindDataplanePort: one Service port of one family as programmed on
	// the node ("dataplane/IPv4/ns/name:port").
	KindDataplanePort Kind = "dataplane-service-port"
	// KindNFTablesTable: one nftables table, present or expected
	// ("nftables/ip/kube-proxy").
	KindNFTablesTable Kind = "nftables-table"
	// KindNFTablesChain: one base chain of an nftables table
	// ("nftables/inet/firewall/input").
	KindNFTablesChain Kind = "nftables-chain"
	// KindNodePods: the pods of this node as a whole
	// ("pods/network-not-ready"; cluster.NodePodsTarget).
	KindNodePods Kind = "node-pods"
	// KindPod: one pod of this node, e.g. a node agent's
	// ("pod/kube-system/calico-node-x2x7k"; cluster.PodRef).
	KindPod Kind = "pod"
	// KindNodeAgent: a node agent (the CNI agent's DaemonSet) on this
	// node, whichever pod runs it now ("node-agent/<ns>/<name>",
	// cluster.AgentRef).
	KindNodeAgent Kind = "node-agent"
	// KindCNIConfig: the node's CNI configuration ("cni/config").
	KindCNIConfig Kind = "cni-config"
	// KindCNIIPAM: host-local IPAM's store of one network
	// ("cni-ipam/<network>", its leaked addresses
	// "cni-ipam/<network>/leaked").
	KindCNIIPAM Kind = "cni-ipam"
	// KindServicePath: the path through one Service port of one family,
	// as a connection from the node sees it
	// ("service-path/IPv4/default/kubernetes:443"; probe.Ref).
	KindServicePath Kind = "service-path"
	// KindCNIAgentProcess: the process of a CNI agent on this node, in the
	// form of a process target ("process/<pid>@<createTimeMs>",
	// procs.Ref): restarting the agent's pod (RestartNodeAgent) acts on
	// it; killing the process (KillProcess) does not.
	KindCNIAgentProcess Kind = "cni-agent-process"
)

// SkipError says a detector or action cannot run on this node and why (IPVS
// unavailable, no cluster access, kube-proxy in another mode). It is not a
// failure: reports list it as "skipped" with the reason.
type SkipError struct{ Reason string }

func (e *SkipError) Error() string { return "skipped: " + e.Reason }

// Skip returns a *SkipError with a formatted reason.
func Skip(format string, args ...any) error {
	return &SkipError{Reason: fmt.Sprintf(format, args...)}
}

// IsSkip reports whether err is (or wraps) a SkipError and returns its reason.
func IsSkip(err error) (string, bool) {
	var s *SkipError
	if errors.As(err, &s) {
		return s.Reason, true
	}
	return "", false
}
