package procident

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"slices"
	"sort"
	"strconv"
	"strings"

	"github.com/remediate-dev/remediate/internal/cluster"
	"github.com/remediate-dev/remediate/internal/procs"
	"github.com/remediate-dev/remediate/internal/sockdiag"
)

// Identifying kube-proxy by what serves its ports: the socket listening on
// its metrics or healthz port (sock_diag, internal/sockdiag) names the
// cgroup of the process that created it, the cgroup's cgroup.procs its
// processes (procs.CgroupTree), and the process is then judged as KubeProxy
// judges one found by name (the pod's cgroup against the API, or a host
// process with CAP_NET_ADMIN, in the node's network namespace), whatever
// it calls itself: kube-proxy, k3s-server, "k3s agent", a renamed binary.
// Nothing here needs CAP_SYS_PTRACE; where the process's descriptors are
// readable, the socket's inode among them settles a cgroup of several
// processes.

// ErrNotServed: nothing listens on the ports in this network namespace.
var ErrNotServed = errors.New("nothing listens on kube-proxy's ports")

// ErrCannotTell: something listens, but its process cannot be told from
// what is readable (no socket cgroup before kernel 5.7, the root cgroup of
// a host without cgroup v2 in use, a cgroup of several processes none of
// which stands out); callers fall back to finding kube-proxy by name.
var ErrCannotTell = errors.New("the process serving kube-proxy's ports cannot be told")

// ErrServedByOther: the process serving the ports is not this node's
// kube-proxy (another pod's, a host process without CAP_NET_ADMIN, ...).
var ErrServedByOther = errors.New("kube-proxy's ports are served by a process that is not this node's kube-proxy")

// maxCgroupProcs bounds the processes of the serving cgroup read.
const maxCgroupProcs = 256

// Cgroups resolves a socket's cgroup id to its cgroup and processes
// (procs.CgroupTree; a fake in tests).
type Cgroups interface {
	// Dir returns the cgroup's path on the unified hierarchy ("/" for
	// the root cgroup).
	Dir(ctx context.Context, id uint64) (string, error)
	// Procs returns the PIDs of the processes in the cgroup.
	Procs(rel string) ([]int32, error)
}

// Sockets lists the TCP sockets listening on ports in the node's network
// namespace (sockdiag.Listeners; a fake in tests).
type Sockets func(ctx context.Context, ports ...uint16) ([]sockdiag.Listener, error)

// Listening finds processes by the ports they serve.
type Listening struct {
	Sockets Sockets
	Cgroups Cgroups
	Procs   procs.Interface
}

// Served is how a process was tied to the ports it serves.
type Served struct {
	// Ports are the ports its cgroup's sockets listen on.
	Ports []uint16
	// Cgroup is the sockets' cgroup (path on the unified hierarchy) and
	// CgroupID its id.
	Cgroup   string
	CgroupID uint64
	// ByDescriptor is true when the process's descriptors (readable with
	// CAP_SYS_PTRACE) hold the socket, not only its cgroup.
	ByDescriptor bool
}

// String is the evidence form.
func (s Served) String() string {
	ps := make([]string, len(s.Ports))
	for i, p := range s.Ports {
		ps[i] = strconv.Itoa(int(p))
	}
	how := "its cgroup created the listening socket (sock_diag)"
	if s.ByDescriptor {
		how = "it holds the listening socket"
	}
	return fmt.Sprintf("serves port %s: %s, cgroup %s (id %d)", strings.Join(ps, ", "), how, s.Cgroup, s.CgroupID)
}

// PortsOf returns the ports of kube-proxy's endpoints (its metrics and
// healthz URLs from the policy), without duplicates; URLs without a
// parsable port are left out.
func PortsOf(urls ...string) []uint16 {
	var out []uint16
	for _, u := range urls {
		pu, err := url.Parse(u)
		if err != nil {
			continue
		}
		p, err := strconv.ParseUint(pu.Port(), 10, 16)
		if err != nil || p == 0 || slices.Contains(out, uint16(p)) {
			continue
		}
		out = append(out, uint16(p))
	}
	return out
}

// KubeProxy returns the process serving kube-proxy's ports (ports: its
// metrics and healthz ports, PortsOf) in this network namespace and its
// identity, judged as KubeProxy judges a process (its pod per the API, or
// a host process with CAP_NET_ADMIN; in the node's network namespace) but
// whatever its name. Errors: ErrNotServed, ErrCannotTell (callers fall
// back to finding kube-proxy by name), ErrServedByOther (the identity's
// Refused says why), or a read that failed.
func (l Listening) KubeProxy(ctx context.Context, ports []uint16, pods Pods, selfNetKey uint64) (procs.Process, Identity, error) {
	if l.Sockets == nil || l.Cgroups == nil || l.Procs == nil {
		return procs.Process{}, Identity{}, fmt.Errorf("%w: listening sockets or cgroups not readable here", ErrCannotTell)
	}
	if len(ports) == 0 {
		return procs.Process{}, Identity{}, fmt.Errorf("%w: no kube-proxy port known (metricsURL, healthzURL)", ErrCannotTell)
	}
	ls, err := l.Sockets(ctx, ports...)
	if err != nil {
		return procs.Process{}, Identity{}, fmt.Errorf("listing the sockets listening on %v: %w", ports, err)
	}
	if len(ls) == 0 {
		return procs.Process{}, Identity{}, fmt.Errorf("%w (ports %v)", ErrNotServed, ports)
	}
	// One cgroup must serve them all.
	byID := map[uint64][]uint16{}
	for _, s := range ls {
		if !s.HasCgroupID {
			return procs.Process{}, Identity{}, fmt.Errorf("%w: the kernel does not say which cgroup created the socket on %s (INET_DIAG_CGROUP_ID, kernel 5.7+)", ErrCannotTell, s.Addr)
		}
		if !slices.Contains(byID[s.CgroupID], s.Addr.Port()) {
			byID[s.CgroupID] = append(byID[s.CgroupID], s.Addr.Port())
		}
	}
	if len(byID) > 1 {
		var parts []string
		for id, ps := range byID {
			parts = append(parts, fmt.Sprintf("port %v by cgroup id %d", ps, id))
		}
		sort.Strings(parts)
		return procs.Process{}, Identity{}, fmt.Errorf("%w: the ports are served from different cgroups (%s)", ErrCannotTell, strings.Join(parts, "; "))
	}
	var sv Served
	for id, ps := range byID {
		sort.Slice(ps, func(i, j int) bool { return ps[i] < ps[j] })
		sv.CgroupID, sv.Ports = id, ps
	}
	sv.Cgroup, err = l.Cgroups.Dir(ctx, sv.CgroupID)
	if err != nil {
		return procs.Process{}, Identity{}, fmt.Errorf("%w: the cgroup (id %d) of the socket on port %v: %v", ErrCannotTell, sv.CgroupID, sv.Ports, err)
	}
	if sv.Cgroup == "/" {
		return procs.Process{}, Identity{}, fmt.Errorf("%w: the socket on port %v was created from the root cgroup of the unified hierarchy (a host without cgroup v2 in use): its cgroup names no process", ErrCannotTell, sv.Ports)
	}
	pids, err := l.Cgroups.Procs(sv.Cgroup)
	if err != nil {
		return procs.Process{}, Identity{}, fmt.Errorf("%w: the processes of cgroup %s: %v", ErrCannotTell, sv.Cgroup, err)
	}
	if len(pids) > maxCgroupProcs {
		return procs.Process{}, Identity{}, fmt.Errorf("%w: cgroup %s (serving port %v) holds %d processes (more than %d)", ErrCannotTell, sv.Cgroup, sv.Ports, len(pids), maxCgroupProcs)
	}
	p, byFD, err := l.server(ctx, pids, sv)
	if err != nil {
		return procs.Process{}, Identity{}, err
	}
	sv.ByDescriptor = byFD
	if want := procs.ParseCgroup([]byte("0::" + sv.Cgroup)); want.PodUID != p.Cgroup.PodUID {
		return procs.Process{}, Identity{}, fmt.Errorf("%w: pid %d's cgroup (pod %q) is not the socket's %s (moved since?)", ErrCannotTell, p.Pid, p.Cgroup.PodUID, sv.Cgroup)
	}
	id := judgeKubeProxy(p, pods, selfNetKey, true)
	id.Served = &sv
	if !id.OK() {
		return p, id, fmt.Errorf("%w: pid %d (%s) %s: %s", ErrServedByOther, p.Pid, p.Name(), sv, id.Refused)
	}
	return p, id, nil
}

// server picks the process of the serving cgroup that serves: the one
// holding the socket when descriptors are readable (ptrace), else the one
// process of the cgroup whose parent is outside it (its children, such as
// kube-proxy's iptables-restore, are its), else among several such the
// one named kube-proxy or an embedded proxy program (k3s's cgroup also
// holds containerd's shims).
func (l Listening) server(ctx context.Context, pids []int32, sv Served) (procs.Process, bool, error) {
	in := map[int32]bool{}
	var ps []procs.Process
	for _, pid := range pids {
		p, err := l.Procs.Get(ctx, pid)
		if errors.Is(err, procs.ErrNotFound) {
			continue
		}
		if err != nil {
			return procs.Process{}, false, fmt.Errorf("reading pid %d of cgroup %s: %w", pid, sv.Cgroup, err)
		}
		in[pid] = true
		ps = append(ps, p)
	}
	var top []procs.Process
	for _, p := range ps {
		if !in[p.PPid] {
			top = append(top, p)
		}
	}
	if len(top) == 0 {
		return procs.Process{}, false, fmt.Errorf("%w: cgroup %s (serving port %v) has no live process", ErrCannotTell, sv.Cgroup, sv.Ports)
	}
	// With ptrace, the descriptor settles it.
	var holders []procs.Process
	for _, p := range top {
		for _, port := range sv.Ports {
			if owns, err := l.Procs.OwnsListener(ctx, p.Pid, port); err == nil && owns {
				holders = append(holders, p)
				break
			}
		}
	}
	if len(holders) == 1 {
		return holders[0], true, nil
	}
	if len(top) == 1 {
		return top[0], false, nil
	}
	var named []procs.Process
	for _, p := range top {
		if p.Name() == "kube-proxy" || slices.Contains(EmbeddedProxyPrograms, p.Name()) {
			named = append(named, p)
		}
	}
	if len(named) == 1 {
		return named[0], false, nil
	}
	names := make([]string, 0, len(top))
	for _, p := range top {
		names = append(names, fmt.Sprintf("%s (pid %d)", p.Name(), p.Pid))
		if len(names) == 5 {
			names = append(names, fmt.Sprintf("and %d more", len(top)-5))
			break
		}
	}
	return procs.Process{}, false, fmt.Errorf("%w: cgroup %s (serving port %v) runs %s, none of them alone kube-proxy", ErrCannotTell, sv.Cgroup, sv.Ports, strings.Join(names, ", "))
}

// OwnProcess reports whether h (a holder or waiter of the xtables lock,
// an iptables-restore) is the proxy's own: the proxy itself, its child, or
// a process of the proxy's pod. Whatever the proxy's name: a k3s-server's
// iptables-restore is kube-proxy's own restore, not a foreign holder.
func OwnProcess(h, proxy procs.Process) bool {
	return h.Pid == proxy.Pid || h.PPid == proxy.Pid ||
		proxy.Cgroup.Place == procs.CgroupPod && h.Cgroup.Place == procs.CgroupPod && h.Cgroup.PodUID == proxy.Cgroup.PodUID
}

// ProxyPrograms are the names a process of kube-proxy's may run under
// when nothing better than its name is known: kube-proxy and the embedded
// proxy programs.
var ProxyPrograms = append([]string{cluster.KubeProxyAgent().Name}, EmbeddedProxyPrograms...)
