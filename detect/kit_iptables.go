package detect

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"syscall"

	"github.com/remediate-dev/remediate/internal/iptables"
	"github.com/remediate-dev/remediate/internal/node"
	"github.com/remediate-dev/remediate/internal/procident"
	"github.com/remediate-dev/remediate/internal/procs"
)

// iptables as several detectors see it: the parties that install and use
// it (the host, kube-proxy's container, the CNI agents'), read from their
// own root filesystems, and the targets of findings about a save.

// iptablesParty is one place iptables is installed and used: the host,
// kube-proxy's container, a CNI agent's container.
type iptablesParty struct {
	// Who: "host", "kube-proxy", "cni/<name>".
	Who string
	Pid int32
	In  iptables.Install
	Err error
}

func (p iptablesParty) known() bool { return p.Err == nil }

// evidence renders the party for a finding.
func (p iptablesParty) evidence() map[string]any {
	m := map[string]any{"who": p.Who, "root": p.In.Root}
	if p.Pid > 0 {
		m["pid"] = p.Pid
	}
	if p.Err != nil {
		m["error"] = p.Err.Error()
		return m
	}
	m["iptables"] = p.In.Describe()
	m["backend"], m["backendSource"] = string(p.In.Backend), p.In.BackendSource
	m["version"], m["versionSource"] = p.In.Version, p.In.VersionSource
	m["links"] = p.In.Links
	if p.In.Wrapper {
		m["wrapper"] = true
	}
	return m
}

// readIPTablesParties reads the iptables of the host, kube-proxy (the one
// pickKubeProxy chooses) and the running CNI agents (by process name, the
// lowest PID of each), each from its own root, through r's memo.
func readIPTablesParties(ctx context.Context, n *node.Node, r *iptables.InstallReader, cniAgents []string) (host iptablesParty, kp *iptablesParty, cni []iptablesParty, notes []string) {
	host = readPartyIPTables(r, "host", 0, hostRoot(n))
	if same, _ := sameFile(hostRoot(n), filepath.Join(n.ProcRoot, "self", "root")); same {
		notes = append(notes, "the host root "+hostRoot(n)+" is this daemon's own root (it runs on the host, or without hostPID)")
	}
	if n.Procs == nil {
		notes = append(notes, "kube-proxy and CNI agent processes not looked up: "+n.Why("procs"))
		return host, nil, nil, notes
	}
	// One look-up for kube-proxy and the agents.
	names := append([]string{"kube-proxy"}, cniAgents...)
	ps, err := n.Procs.Find(ctx, names)
	if err != nil {
		notes = append(notes, "listing processes: "+err.Error())
		return host, nil, nil, notes
	}
	var kps []procs.Process
	seen := map[string]bool{}
	for _, p := range ps {
		name := p.Name()
		if name == "kube-proxy" {
			kps = append(kps, p)
			continue
		}
		if seen[name] {
			continue // one per agent: the lowest PID
		}
		seen[name] = true
		cni = append(cni, readPartyIPTables(r, "cni/"+name, p.Pid, processRoot(n, p.Pid)))
	}
	if p, _, err := pickKubeProxy(kps, procident.PodsOf(n.Pods, n.Clock.Now()), n.Procs.SelfNetKey()); err != nil {
		notes = append(notes, err.Error())
	} else {
		party := readPartyIPTables(r, "kube-proxy", p.Pid, processRoot(n, p.Pid))
		kp = &party
	}
	return host, kp, cni, notes
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
	p, _, err := findKubeProxy(ctx, n)
	if err != nil {
		return iptablesParty{}, err
	}
	return readPartyIPTables(r, "kube-proxy", p.Pid, processRoot(n, p.Pid)), nil
}

func notInstalled(cmds []string) string {
	if len(cmds) == 0 {
		return ""
	}
	return " (not installed: " + strings.Join(cmds, ", ") + ")"
}

func iptablesTarget(f iptables.Family, b iptables.Backend, what string) string {
	return "iptables/" + string(f) + "/" + string(b) + "/" + what
}

func sameFile(a, b string) (bool, error) {
	fa, err := os.Stat(a)
	if err != nil {
		return false, err
	}
	fb, err := os.Stat(b)
	if err != nil {
		return false, err
	}
	sa, ok1 := fa.Sys().(*syscall.Stat_t)
	sb, ok2 := fb.Sys().(*syscall.Stat_t)
	return ok1 && ok2 && sa.Dev == sb.Dev && sa.Ino == sb.Ino, nil
}
