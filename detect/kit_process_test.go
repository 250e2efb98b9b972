package detect

import (
	"context"
	"errors"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/remediate-dev/remediate/internal/cluster/clustertest"
	"github.com/remediate-dev/remediate/internal/node"
	"github.com/remediate-dev/remediate/internal/procident"
	"github.com/remediate-dev/remediate/internal/procs"
	"github.com/remediate-dev/remediate/internal/sockdiag"
)

// portCgroups is a cgroup tree of ids, paths and processes (the
// procident.Cgroups the daemon reads from /sys/fs/cgroup).
type portCgroups struct {
	dirs  map[uint64]string
	procs map[string][]int32
}

func (f portCgroups) Dir(_ context.Context, id uint64) (string, error) {
	if d, ok := f.dirs[id]; ok {
		return d, nil
	}
	return "", procs.ErrCgroupNotFound
}

func (f portCgroups) Procs(rel string) ([]int32, error) { return f.procs[rel], nil }

// TestFindKubeProxyByItsPorts: the detectors' one way to kube-proxy's
// process asks first what serves its ports (issue 37): a renamed proxy in
// a unit, which the name search cannot find, is found; a port served by
// another pod's process is no kube-proxy of this node (not a name match
// beside it); when the server cannot be told, the name search decides.
func TestFindKubeProxyByItsPorts(t *testing.T) {
	const unitCg, twoCg = "/system.slice/node-proxy.service", "/system.slice/two.service"
	t0 := time.Date(2026, 12, 7, 0, 0, 0, 0, time.UTC)
	fp := procs.NewFake(1)
	fp.NetKey = 7
	host := func(pid int32, name, unit string) procs.FakeProcess {
		return procs.FakeProcess{Process: procs.Process{Pid: pid, PPid: 1, Comm: name, Cmdline: []string{"/usr/bin/" + name}, CapEff: procs.CapNetAdmin, NetKey: 7,
			Cgroup: procs.Cgroup{Place: procs.CgroupHost, Unit: unit}}}
	}
	fp.Add(host(100, "node-proxy", "node-proxy.service")) // serves the ports, not named kube-proxy
	fp.Add(host(500, "a", "two.service"))
	fp.Add(host(501, "b", "two.service"))
	fp.Add(host(600, "kube-proxy", "kube-proxy.service")) // named kube-proxy
	cgs := portCgroups{dirs: map[uint64]string{10: unitCg, 50: twoCg}, procs: map[string][]int32{unitCg: {100}, twoCg: {500, 501}}}
	served := func(cg uint64) procident.Sockets {
		return func(_ context.Context, ports ...uint16) ([]sockdiag.Listener, error) {
			var out []sockdiag.Listener
			for _, p := range []uint16{10249, 10256} {
				if slices.Contains(ports, p) {
					out = append(out, sockdiag.Listener{Addr: netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), p), Inode: uint64(p), CgroupID: cg, HasCgroupID: true})
				}
			}
			return out, nil
		}
	}
	ports := procident.PortsOf("http://127.0.0.1:10249/metrics", "http://127.0.0.1:10256/healthz")
	newNode := func(l *procident.Listening) *node.Node {
		return &node.Node{Name: "n1", Clock: clocktesting.NewFakePassiveClock(t0), Log: zap.NewNop(), Procs: fp,
			Pods: clustertest.NewPods(t0), Listening: l, KubeProxyPorts: ports}
	}
	ctx := context.Background()

	// Served by the renamed proxy of node-proxy.service: found, though
	// the name search would take pid 600.
	p, id, err := findKubeProxy(ctx, newNode(&procident.Listening{Sockets: served(10), Cgroups: cgs, Procs: fp}))
	if err != nil || p.Pid != 100 || id.Shape() != procident.ShapeSystemdUnit || id.Served == nil {
		t.Fatalf("served by a renamed proxy: pid %d %s %v, want 100 (systemd unit, by its ports)", p.Pid, id, err)
	}
	// Without the port view (sock_diag not readable): by name, pid 600.
	if p, _, err := findKubeProxy(ctx, newNode(nil)); err != nil || p.Pid != 600 {
		t.Fatalf("by name: pid %d %v, want 600", p.Pid, err)
	}
	// A cgroup of two unnamed processes cannot be told: by name.
	if p, _, err := findKubeProxy(ctx, newNode(&procident.Listening{Sockets: served(50), Cgroups: cgs, Procs: fp})); err != nil || p.Pid != 600 {
		t.Fatalf("server cannot be told: pid %d %v, want 600 by name", p.Pid, err)
	}
	// Served by a process without CAP_NET_ADMIN: not this node's
	// kube-proxy, and the name search is not asked.
	fp.Remove(100)
	weak := host(100, "node-proxy", "node-proxy.service")
	weak.CapEff = 0
	fp.Add(weak)
	_, _, err = findKubeProxy(ctx, newNode(&procident.Listening{Sockets: served(10), Cgroups: cgs, Procs: fp}))
	if !errors.Is(err, errNoNodeKubeProxy) || !strings.Contains(err.Error(), "served by a process that is not this node's kube-proxy") {
		t.Fatalf("served by another: %v, want errNoNodeKubeProxy saying so", err)
	}
}
