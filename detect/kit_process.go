package detect

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/remediate-dev/remediate/internal/clip"
	"github.com/remediate-dev/remediate/internal/cluster"
	"github.com/remediate-dev/remediate/internal/finding"
	"github.com/remediate-dev/remediate/internal/node"
	"github.com/remediate-dev/remediate/internal/procident"
	"github.com/remediate-dev/remediate/internal/procs"
)

// Processes as the detectors see them: this node's kube-proxy among the
// processes named so, a process's root filesystem, whether a process is
// one a detector may judge, and its evidence (HungIPTablesRestore,
// HungNFT, XtablesLockContention, IPTablesVersionSkew,
// KubeProxyKernelModules, KubeProxyFrozen, the likely causes).

// hostRoot is the host's root filesystem as PID 1 of the proc root sees
// it (with hostPID, the node's init).
func hostRoot(n *node.Node) string {
	if n.HostRoot != "" {
		return n.HostRoot
	}
	return processRoot(n, 1)
}

// processRoot is process pid's root filesystem as the proc root shows it
// (/proc/<pid>/root: its mount namespace's "/", whatever its container).
func processRoot(n *node.Node, pid int32) string {
	return filepath.Join(n.ProcRoot, strconv.Itoa(int(pid)), "root")
}

// errNoNodeKubeProxy: no process is this node's kube-proxy (none named
// kube-proxy, or each one named so is known to be another's).
var errNoNodeKubeProxy = errors.New("no kube-proxy of this node")

// kubeProxyPrograms are the names this node's kube-proxy may run under.
var kubeProxyPrograms = procident.ProxyPrograms

// findKubeProxy returns this node's kube-proxy (pickKubeProxy among the
// processes named kube-proxy) and how its identity was established (for
// evidence): the one helper every detector that needs kube-proxy's
// process uses. An error wrapping errNoNodeKubeProxy says there is none
// and why the processes named kube-proxy were not taken.
func findKubeProxy(ctx context.Context, n *node.Node) (procs.Process, procident.Identity, error) {
	if n.Procs == nil {
		return procs.Process{}, procident.Identity{}, errors.New(n.Why("procs"))
	}
	pods := procident.PodsOf(n.Pods, n.Clock.Now())
	// First the process serving kube-proxy's ports, whatever its name
	// (sock_diag's cgroup of the listening socket: issue 37).
	if n.Listening != nil {
		p, id, err := n.Listening.KubeProxy(ctx, n.KubeProxyPorts, pods, n.Procs.SelfNetKey())
		switch {
		case err == nil:
			return p, id, nil
		case errors.Is(err, procident.ErrServedByOther):
			return procs.Process{}, id, fmt.Errorf("%w: %v", errNoNodeKubeProxy, err)
		}
		// Not served, or its server cannot be told: by name.
	}
	// kube-proxy in a pod, a static pod or a systemd unit, or k3s with
	// kube-proxy inside it.
	ps, err := n.Procs.Find(ctx, kubeProxyPrograms)
	if err != nil {
		return procs.Process{}, procident.Identity{}, fmt.Errorf("looking for kube-proxy's process: %w", err)
	}
	return pickKubeProxy(ps, pods, n.Procs.SelfNetKey())
}

// pickKubeProxy chooses this node's kube-proxy among the processes named
// kube-proxy. Those procident.KubeProxy refuses are left out: this node's
// kube-proxy is a process of its kube-proxy pod by its cgroup and the API
// (a DaemonSet's pod labelled as kube-proxy's, or its static pod), or a
// host process with CAP_NET_ADMIN; in the node's network namespace
// (kube-proxy runs with hostNetwork; a nested cluster's kube-proxy,
// kind's, runs in another); with CAP_SYS_PTRACE also a kube-proxy
// executable (a second opinion). A process in any other pod's cgroup is
// not, whatever it calls itself; one in a pod's cgroup while the pod view
// is absent or stale cannot be told. Of the rest, the only one of
// kube-proxy's pod (cgroup+api) if any, else the only one. None is
// errNoNodeKubeProxy (with why each was left out); several is an error:
// comparing the wrong kube-proxy would be worse than saying so.
func pickKubeProxy(ps []procs.Process, pods procident.Pods, selfNetKey uint64) (procs.Process, procident.Identity, error) {
	var mine, ofPod []procs.Process
	var ids, podIDs []procident.Identity
	var others []string
	for _, p := range ps {
		id := procident.KubeProxy(p, pods, selfNetKey)
		if id.Refused != "" {
			others = append(others, id.Refused)
			continue
		}
		mine, ids = append(mine, p), append(ids, id)
		if id.Method == procident.CgroupAPI {
			ofPod, podIDs = append(ofPod, p), append(podIDs, id)
		}
	}
	switch {
	case len(ofPod) == 1:
		// The API's kube-proxy: host processes named kube-proxy (another
		// test's, an administrator's) are not this node's.
		return ofPod[0], podIDs[0], nil
	case len(ofPod) == 0 && len(mine) == 1:
		return mine[0], ids[0], nil
	case len(ps) == 0:
		return procs.Process{}, procident.Identity{}, fmt.Errorf("%w: no process named %s visible through the proc root", errNoNodeKubeProxy, strings.Join(kubeProxyPrograms, " or "))
	case len(mine) == 0:
		if len(others) > 3 {
			others = append(others[:3], fmt.Sprintf("and %d more", len(others)-3))
		}
		return procs.Process{}, procident.Identity{}, fmt.Errorf("%w: %d processes named kube-proxy, none this node's: %s", errNoNodeKubeProxy, len(ps), strings.Join(others, "; "))
	case len(ofPod) > 1:
		return procs.Process{}, procident.Identity{}, fmt.Errorf("%d processes named kube-proxy, %d in this node's kube-proxy pod's cgroup: cannot tell which is this node's", len(ps), len(ofPod))
	default:
		return procs.Process{}, procident.Identity{}, fmt.Errorf("%d processes named kube-proxy, %d may be this node's (host processes with CAP_NET_ADMIN in this network namespace; none in a kube-proxy pod's cgroup): cannot tell which is this node's", len(ps), len(mine))
	}
}

// outOfReach returns why a process matching by name is not a target ("" when
// it is), after recording its identity in ev (procident.Target): a
// process of kube-proxy's or an allowlisted CNI agent's pod on this node
// (its cgroup's pod UID, per the API: "identity: cgroup+api") or a host
// process ("host-cgroup": in no pod's cgroup, which only root on the host
// can arrange; with CAP_NET_ADMIN it is root on the host already), with
// CAP_NET_ADMIN, in the node's network namespace unless it holds or waits
// on the node's xtables lock (ev["holdsXtablesLock"],
// ev["waitsOnXtablesLock"]); where its executable is readable
// (CAP_SYS_PTRACE) a real iptables/nft program too (",exe"). A process in
// any other pod's cgroup never is; one in a pod's cgroup while the pod
// view is absent or stale cannot be told, and is not.
func outOfReach(p procs.Process, programs []string, n *node.Node, pods procident.Pods, ev map[string]any) string {
	self := n.Procs.SelfNetKey()
	ev["exe"] = clip.String(p.Exe, 512)
	ev["capNetAdmin"] = p.CapEff&procs.CapNetAdmin != 0
	if p.NetNS != "" {
		ev["netns"] = p.NetNS
	}
	ev["netKey"], ev["nodeNetKey"] = p.NetKey, self
	onLock := ev["holdsXtablesLock"] == true || ev["waitsOnXtablesLock"] == true
	id := procident.Target(p, pods, procident.Agents(cluster.DefaultCNIAgents()), programs, self, onLock)
	id.Evidence(ev)
	if !id.OK() {
		ev["notATarget"] = id.Refused
		return id.Refused
	}
	if p.Exe != "" {
		ev["identity"] = string(id.Method) + ",exe"
	}
	if id.Method == procident.HostCgroup {
		ev["identityNote"] = "a host process (in no pod's cgroup) with CAP_NET_ADMIN: root on the host already"
	}
	return ""
}

func orUnknown(s string) string {
	if s == "" {
		return "unknown"
	}
	return s
}

// processEvidence is the evidence every process finding carries; "pid" and
// "createTimeMs" identify the process for actions.
func processEvidence(p procs.Process, now time.Time) map[string]any {
	ev := processSummary(p, now)
	ev["blocked"] = p.Blocked()
	ev["ppid"] = p.PPid
	ev["parentName"] = p.ParentName
	return ev
}

// processSummary is a process in a list of processes: who it is, how old
// and in which state.
func processSummary(p procs.Process, now time.Time) map[string]any {
	return map[string]any{
		"pid":          p.Pid,
		"createTimeMs": p.CreateTimeMs,
		"name":         p.Name(),
		"cmdline":      clip.Join(p.Cmdline, " ", clip.Max),
		"ageSeconds":   durSeconds(p.Age(now)),
		"state":        p.State,
	}
}

// processSummaries is a short JSON-friendly list of processes.
func processSummaries(ps []procs.Process, now time.Time) []map[string]any {
	out := make([]map[string]any, 0, len(ps))
	for _, p := range ps {
		out = append(out, processSummary(p, now))
	}
	return out
}

// findOld scans the processes named names (argv[0] basenames) and returns
// them all, and those running for minAge or longer that keep accepts (nil:
// all), with the time they were judged at.
func findOld(ctx context.Context, n *node.Node, names []string, minAge time.Duration, keep func(procs.Process) bool) (found, old []procs.Process, now time.Time, err error) {
	if n.Procs == nil {
		return nil, nil, now, finding.Skip("%s", n.Why("procs"))
	}
	found, err = n.Procs.Find(ctx, names)
	if err != nil {
		return nil, nil, now, fmt.Errorf("scanning processes: %w", err)
	}
	now = n.Clock.Now()
	for _, p := range found {
		if p.Age(now) >= minAge && (keep == nil || keep(p)) {
			old = append(old, p)
		}
	}
	return found, old, now, nil
}
