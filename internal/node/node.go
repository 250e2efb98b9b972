// Package node carries what detectors and actions may use on this node: its
// identity, the configured paths, the clock, the logger, and the adapters to
// the kernel and the cluster. One Node is built by cmd/remediate and shared
// by every detector (which reads) and action (which writes).
//
// An adapter field that is nil means that subsystem is unavailable here; a
// detector or action that needs it returns finding.Skip with the reason in
// Unavailable, if any.
package node

import (
	"go.uber.org/zap"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/clock"

	"github.com/remediate-dev/remediate/internal/causes"
	"github.com/remediate-dev/remediate/internal/cluster"
	"github.com/remediate-dev/remediate/internal/cni"
	"github.com/remediate-dev/remediate/internal/cnichains"
	"github.com/remediate-dev/remediate/internal/conntrack"
	"github.com/remediate-dev/remediate/internal/cpustat"
	"github.com/remediate-dev/remediate/internal/cri"
	"github.com/remediate-dev/remediate/internal/iptables"
	"github.com/remediate-dev/remediate/internal/ipvs"
	"github.com/remediate-dev/remediate/internal/kubelet"
	"github.com/remediate-dev/remediate/internal/kubeproxy"
	"github.com/remediate-dev/remediate/internal/lockwatch"
	"github.com/remediate-dev/remediate/internal/nftables"
	"github.com/remediate-dev/remediate/internal/podlogs"
	"github.com/remediate-dev/remediate/internal/probe"
	"github.com/remediate-dev/remediate/internal/procident"
	"github.com/remediate-dev/remediate/internal/procs"
)

// Node is the shared dependency set. Fields are set once at start-up (or
// reload) and not changed afterwards; adapters must be goroutine-safe.
type Node struct {
	// Name is the Kubernetes node name (--node-name).
	Name string
	// ProcRoot is the procfs mount to read (--proc-root, default /proc).
	// Every /proc and /proc/sys read goes through it.
	ProcRoot string
	// HostRoot is the host's root filesystem (--host-root; the chart
	// mounts the host's "/" read-only there). Empty: <ProcRoot>/1/root,
	// which needs ptrace access to PID 1 (CAP_SYS_PTRACE, and a PID 1 that
	// allows it: a VM's protected init does not).
	HostRoot string
	// XtablesLock is the xtables lock file (--xtables-lock).
	XtablesLock string
	// Clock is injected so tests control time.
	Clock clock.PassiveClock
	// Log is the structured logger.
	Log *zap.Logger

	// Unavailable records, per subsystem name ("kubernetes", "ipvs", ...),
	// why its adapter is nil.
	Unavailable map[string]string

	// Adapters are added here, one per subsystem (internal/<subsystem>).

	// Procs reads processes and file locks through ProcRoot and signals
	// processes (subsystem "procs").
	Procs procs.Interface
	// Listening finds the process serving kube-proxy's ports
	// KubeProxyPorts (sock_diag and the unified cgroup hierarchy); nil
	// when those cannot be read (kube-proxy is then found by name).
	Listening      *procident.Listening
	KubeProxyPorts []uint16
	// XtablesLockWatch measures every hold of XtablesLock between cycles
	// (inotify-woken sampling, started by the first detector that reads
	// it and stopped at exit); nil when not wired (holds are then only
	// seen at cycles).
	XtablesLockWatch lockwatch.Reader
	// IPTables reads the iptables rule sets with *-save, never taking the
	// xtables lock (subsystem "iptables").
	IPTables iptables.Interface
	// NFTables lists the nftables ruleset read-only with `nft -j list`
	// (subsystem "nftables"): kube-proxy's nftables-mode table and the
	// tables that can shadow it.
	NFTables nftables.Interface
	// Conntrack is the nf_conntrack table and its tunables (subsystem
	// "conntrack").
	Conntrack conntrack.Interface

	// Kube is the Kubernetes API client; nil without cluster access
	// (Unavailable["kubernetes"] says why). Built by internal/kube.
	Kube kubernetes.Interface
	// Cluster is the informer-backed view of Services and EndpointSlices;
	// nil without cluster access. Callers check Cluster.Freshness().
	Cluster cluster.View
	// Pods is the watch of the pods bound to this node (field selector
	// spec.nodeName); nil without cluster access. Callers check
	// Pods.Freshness().
	Pods cluster.PodView
	// PodEvents reads the kubelet's sandbox Events of one of this node's
	// pods (a field-selected, bounded LIST); nil without cluster access.
	PodEvents cluster.PodEvents
	// CNIConfDir and CNIBinDir are the host's CNI configuration and plugin
	// directories as mounted here (--cni-conf-dir, --cni-bin-dir); empty
	// means not configured.
	CNIConfDir string
	CNIBinDir  string
	// CNI reads CNIConfDir and CNIBinDir once for the detectors of a
	// cycle (cni.Shared); nil: each detector reads them itself.
	CNI cni.Reader
	// CNIIPAMDir is host-local IPAM's data directory as mounted here
	// (--cni-ipam-dir; the host's /var/lib/cni/networks); empty means not
	// configured.
	CNIIPAMDir string
	// CRI lists the container runtime's pod sandboxes through its CRI
	// socket (--cri-socket; subsystem "cri"), read-only.
	CRI cri.Interface
	// KubeProxy reads kube-proxy's metrics, /healthz and /proxyMode
	// (subsystem "kube-proxy").
	KubeProxy kubeproxy.Interface
	// Kubelet scrapes this node's kubelet's authenticated /metrics
	// (subsystem "kubelet"): sandbox errors and pod start-up.
	Kubelet kubelet.Interface
	// IPVS is the kernel's IP Virtual Server tables (subsystem "ipvs").
	IPVS ipvs.Interface
	// CPU reads cgroup cpu.stat (kube-proxy's throttling) and the node's
	// /proc/stat CPU times (subsystem "cpustat"), for the likely causes of
	// kube-proxy symptoms.
	CPU cpustat.Interface
	// LockHistory, when set, gives the xtables lock holds of a recent
	// window for those causes; nil: the current /proc/locks snapshot.
	LockHistory causes.LockSource
	// CNIChains keeps what CNIAgentChains remembers of the CNI agents'
	// iptables chains across restarts (in the state directory); nil:
	// nothing is remembered beyond the detector's life.
	CNIChains cnichains.Store
	// PodLogs reads the tail of kube-proxy's and the CNI agents' container
	// logs from the kubelet's pod log directory (--pod-log-dir; subsystem
	// "podlogs"), for the causes those logs name.
	PodLogs podlogs.Reader
	// Probe makes bounded TCP connects (connect, close, no payload) from
	// the node's network namespace, for the Service path probe (subsystem
	// "probe").
	Probe probe.Interface
}

// SubsystemHostRoot names, in Unavailable, the reading of other
// processes' root filesystems through ProcRoot/<pid>/root (the host's as
// PID 1's, kube-proxy's as its process's): the kernel allows it only with
// CAP_SYS_PTRACE over processes more privileged than the reader. It has no
// adapter; the detectors that need it check Unavailable.
const SubsystemHostRoot = "hostroot"

// Why returns the recorded reason a subsystem is unavailable, or a generic
// one.
func (n *Node) Why(subsystem string) string {
	if r, ok := n.Unavailable[subsystem]; ok && r != "" {
		return r
	}
	return subsystem + " is not configured on this node"
}
