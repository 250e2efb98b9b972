package detect

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/remediate-dev/remediate/internal/iptables"
	"github.com/remediate-dev/remediate/internal/node"
	"github.com/remediate-dev/remediate/internal/procident"
	"github.com/remediate-dev/remediate/internal/procs"
)

// Finding kube-proxy's process and reading files under its root: shared by
// the detectors that look at kube-proxy's container from the outside
// (IPTablesVersionSkew, KubeProxyKernelModules, the likely causes).

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

// findKubeProxy returns this node's kube-proxy (pickKubeProxy among the
// processes named kube-proxy): the one helper every detector that needs
// kube-proxy's process uses. An error wrapping errNoNodeKubeProxy says
// there is none and why the processes named kube-proxy were not taken.
func findKubeProxy(ctx context.Context, n *node.Node) (procs.Process, error) {
	p, _, err := findKubeProxyIdentity(ctx, n)
	return p, err
}

// kubeProxyPrograms are the names this node's kube-proxy may run under.
var kubeProxyPrograms = append([]string{"kube-proxy"}, procident.EmbeddedProxyPrograms...)

// findKubeProxyIdentity is findKubeProxy with how the process's identity
// was established (for evidence).
func findKubeProxyIdentity(ctx context.Context, n *node.Node) (procs.Process, procident.Identity, error) {
	if n.Procs == nil {
		return procs.Process{}, procident.Identity{}, errors.New(n.Why("procs"))
	}
	// kube-proxy in a pod, a static pod or a systemd unit, or k3s with
	// kube-proxy inside it.
	ps, err := n.Procs.Find(ctx, kubeProxyPrograms)
	if err != nil {
		return procs.Process{}, procident.Identity{}, fmt.Errorf("looking for kube-proxy's process: %w", err)
	}
	return pickKubeProxy(ps, procident.PodsOf(n.Pods, n.Clock.Now()), n.Procs.SelfNetKey())
}

// notThisNodesKubeProxy says why p, named kube-proxy, is not known to be
// this node's kube-proxy ("" when it is), with its identity: a process of
// this node's kube-proxy pod by its cgroup and the API (a DaemonSet's pod
// labelled as kube-proxy's, or its static pod), or a host process with
// CAP_NET_ADMIN; in the node's network namespace (kube-proxy runs with
// hostNetwork; a nested cluster's kube-proxy, kind's, runs in another);
// with CAP_SYS_PTRACE also a kube-proxy executable (a second opinion). A
// process in any other pod's cgroup is not, whatever it calls itself; one
// in a pod's cgroup while the pod view is absent or stale cannot be told.
func notThisNodesKubeProxy(p procs.Process, pods procident.Pods, selfNetKey uint64) (string, procident.Identity) {
	id := procident.KubeProxy(p, pods, selfNetKey)
	return id.Refused, id
}

// pickKubeProxy chooses this node's kube-proxy among the processes named
// kube-proxy: those known not to be (notThisNodesKubeProxy) are left out;
// of the rest, the only one of kube-proxy's pod (cgroup+api) if any, else
// the only one. None is errNoNodeKubeProxy (with why each was left out);
// several is an error: comparing the wrong kube-proxy would be worse than
// saying so.
func pickKubeProxy(ps []procs.Process, pods procident.Pods, selfNetKey uint64) (procs.Process, procident.Identity, error) {
	var mine, ofPod []procs.Process
	var ids, podIDs []procident.Identity
	var others []string
	for _, p := range ps {
		why, id := notThisNodesKubeProxy(p, pods, selfNetKey)
		if why != "" {
			others = append(others, why)
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

// readPartyIPTables reads the iptables installed in root (the host's, or
// process pid's /proc/<pid>/root), through r's memo of unchanged files.
func readPartyIPTables(r *iptables.InstallReader, who string, pid int32, root string) iptablesParty {
	party := iptablesParty{Who: who, Pid: pid}
	party.In, party.Err = r.Read(root)
	party.In.Root = root
	return party
}

// kubeProxyIPTables finds kube-proxy's process and reads the iptables
// installed in its root.
func kubeProxyIPTables(ctx context.Context, n *node.Node, r *iptables.InstallReader) (iptablesParty, error) {
	p, err := findKubeProxy(ctx, n)
	if err != nil {
		return iptablesParty{}, err
	}
	return readPartyIPTables(r, "kube-proxy", p.Pid, processRoot(n, p.Pid)), nil
}
