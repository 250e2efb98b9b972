package detect

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strconv"

	"github.com/remediate-dev/remediate/internal/iptables"
	"github.com/remediate-dev/remediate/internal/node"
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

// findKubeProxy returns kube-proxy's process (pickKubeProxy among those
// named kube-proxy).
func findKubeProxy(ctx context.Context, n *node.Node) (procs.Process, error) {
	if n.Procs == nil {
		return procs.Process{}, errors.New(n.Why("procs"))
	}
	ps, err := n.Procs.Find(ctx, []string{"kube-proxy"})
	if err != nil {
		return procs.Process{}, fmt.Errorf("looking for kube-proxy's process: %w", err)
	}
	return pickKubeProxy(ps, n.Procs.SelfNetNS())
}

// pickKubeProxy chooses this node's kube-proxy among the processes named
// kube-proxy: the only one, or the only one of several in this daemon's
// network namespace selfNetNS (kube-proxy runs with hostNetwork; a nested
// cluster's kube-proxy, kind's, runs in another). Several and none or more
// than one in selfNetNS (or selfNetNS unknown) is an error: comparing the
// wrong kube-proxy would be worse than saying so.
func pickKubeProxy(ps []procs.Process, selfNetNS string) (procs.Process, error) {
	if len(ps) > 1 {
		var same []procs.Process
		for _, p := range ps {
			if selfNetNS != "" && p.NetNS == selfNetNS {
				same = append(same, p)
			}
		}
		if len(same) != 1 {
			return procs.Process{}, fmt.Errorf("%d processes named kube-proxy, %d in this network namespace: cannot tell which is this node's", len(ps), len(same))
		}
		ps = same
	}
	if len(ps) == 0 {
		return procs.Process{}, errors.New("no process named kube-proxy visible through the proc root")
	}
	return ps[0], nil
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
