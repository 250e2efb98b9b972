package detect

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/remediate-dev/remediate/internal/clip"
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

// errNoNodeKubeProxy: no process is this node's kube-proxy (none named
// kube-proxy, or each one named so is known to be another's).
var errNoNodeKubeProxy = errors.New("no kube-proxy of this node")

// findKubeProxy returns this node's kube-proxy (pickKubeProxy among the
// processes named kube-proxy): the one helper every detector that needs
// kube-proxy's process uses. An error wrapping errNoNodeKubeProxy says
// there is none and why the processes named kube-proxy were not taken.
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

// notThisNodesKubeProxy says why p, named kube-proxy, is known not to be
// this node's kube-proxy ("" when it may be): kube-proxy runs with
// hostNetwork, in the node's network namespace, which is this daemon's
// (selfNetNS; a nested cluster's kube-proxy, kind's, or one in a pod
// network runs in another), and its executable is a kube-proxy (a process
// can call itself kube-proxy, not choose /proc/<pid>/exe). What cannot be
// read (no SYS_PTRACE) is not held against it.
func notThisNodesKubeProxy(p procs.Process, selfNetNS string) string {
	if p.NetNS != "" && selfNetNS != "" && p.NetNS != selfNetNS {
		return fmt.Sprintf("pid %d runs in another network namespace (%s, this node's is %s)", p.Pid, p.NetNS, selfNetNS)
	}
	if p.Exe != "" && filepath.Base(p.Exe) != "kube-proxy" {
		return fmt.Sprintf("pid %d's executable is %s, not a kube-proxy", p.Pid, clip.String(p.Exe, 256))
	}
	return ""
}

// pickKubeProxy chooses this node's kube-proxy among the processes named
// kube-proxy: those known to be another's (notThisNodesKubeProxy) are left
// out; of the rest, the only one. None is errNoNodeKubeProxy (with why each
// was left out); several is an error: comparing the wrong kube-proxy would
// be worse than saying so.
func pickKubeProxy(ps []procs.Process, selfNetNS string) (procs.Process, error) {
	var mine []procs.Process
	var others []string
	for _, p := range ps {
		if why := notThisNodesKubeProxy(p, selfNetNS); why != "" {
			others = append(others, why)
			continue
		}
		mine = append(mine, p)
	}
	switch {
	case len(mine) == 1:
		return mine[0], nil
	case len(ps) == 0:
		return procs.Process{}, fmt.Errorf("%w: no process named kube-proxy visible through the proc root", errNoNodeKubeProxy)
	case len(mine) == 0:
		if len(others) > 3 {
			others = append(others[:3], fmt.Sprintf("and %d more", len(others)-3))
		}
		return procs.Process{}, fmt.Errorf("%w: %d processes named kube-proxy, none this node's: %s", errNoNodeKubeProxy, len(ps), strings.Join(others, "; "))
	default:
		return procs.Process{}, fmt.Errorf("%d processes named kube-proxy, %d may be this node's (in this network namespace, a kube-proxy executable): cannot tell which is this node's", len(ps), len(mine))
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
