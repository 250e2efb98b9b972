package procident

import (
	"context"
	"errors"
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/remediate-dev/remediate/internal/cluster"
	"github.com/remediate-dev/remediate/internal/procs"
	"github.com/remediate-dev/remediate/internal/sockdiag"
)

// fakeCgroups is a cgroup tree of ids, paths and processes.
type fakeCgroups struct {
	dirs  map[uint64]string
	procs map[string][]int32
}

func (f fakeCgroups) Dir(_ context.Context, id uint64) (string, error) {
	if d, ok := f.dirs[id]; ok {
		return d, nil
	}
	return "", procs.ErrCgroupNotFound
}

func (f fakeCgroups) Procs(rel string) ([]int32, error) { return f.procs[rel], nil }

func sockets(ls ...sockdiag.Listener) Sockets {
	return func(_ context.Context, ports ...uint16) ([]sockdiag.Listener, error) {
		var out []sockdiag.Listener
		for _, l := range ls {
			if slices.Contains(ports, l.Addr.Port()) {
				out = append(out, l)
			}
		}
		return out, nil
	}
}

func listener(port uint16, cg uint64) sockdiag.Listener {
	return sockdiag.Listener{Addr: netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), port), Inode: uint64(port), CgroupID: cg, HasCgroupID: true}
}

// TestListeningKubeProxy: the process serving kube-proxy's ports is this
// node's kube-proxy whatever its name (a renamed binary in a unit, k3s
// beside containerd's shims, a DaemonSet pod), judged as KubeProxy judges
// one; what cannot be told from the socket's cgroup says so (the caller
// falls back to the name), and a server that is not kube-proxy is refused.
func TestListeningKubeProxy(t *testing.T) {
	const (
		unitCg  = "/system.slice/node-proxy.service"
		k3sCg   = "/system.slice/k3s.service"
		podCg   = "/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod11111111_1111_1111_1111_111111111111.slice/cri-containerd-" + "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa.scope"
		otherCg = "/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod22222222_2222_2222_2222_222222222222.slice"
		twoCg   = "/system.slice/two.service"
	)
	cgs := fakeCgroups{
		dirs:  map[uint64]string{1: "/", 10: unitCg, 20: k3sCg, 30: podCg, 40: otherCg, 50: twoCg},
		procs: map[string][]int32{unitCg: {100, 101}, k3sCg: {200, 201, 202}, podCg: {300}, otherCg: {400}, twoCg: {500, 501}},
	}
	fp := procs.NewFake(1)
	fp.NetKey = 7
	host := func(pid, ppid int32, name, unit string) procs.FakeProcess {
		return procs.FakeProcess{Process: procs.Process{Pid: pid, PPid: ppid, Comm: name, Cmdline: []string{"/usr/bin/" + name}, CapEff: procs.CapNetAdmin, NetKey: 7,
			Cgroup: procs.Cgroup{Place: procs.CgroupHost, Unit: unit}}}
	}
	fp.Add(host(100, 1, "my-proxy", "node-proxy.service"))
	fp.Add(host(101, 100, "iptables-restore", "node-proxy.service"))
	fp.Add(host(200, 1, "k3s-server", "k3s.service"))
	fp.Add(host(201, 200, "containerd", "k3s.service"))
	fp.Add(host(202, 1, "containerd-shim-runc-v2", "k3s.service"))
	fp.Add(procs.FakeProcess{Process: procs.Process{Pid: 300, PPid: 1, Comm: "kube-proxy", Cmdline: []string{"/usr/local/bin/kube-proxy"}, CapEff: procs.CapNetAdmin, NetKey: 7,
		Cgroup: procs.Cgroup{Place: procs.CgroupPod, PodUID: kubeProxy.UID, ContainerID: strings.Repeat("a", 64)}}})
	fp.Add(procs.FakeProcess{Process: procs.Process{Pid: 400, PPid: 1, Comm: "server", Cmdline: []string{"server"}, CapEff: procs.CapNetAdmin, NetKey: 7,
		Cgroup: procs.Cgroup{Place: procs.CgroupPod, PodUID: lookalike.UID}}})
	fp.Add(host(500, 1, "a", "two.service"))
	fp.Add(host(501, 1, "b", "two.service"))
	pods := PodsFrom([]cluster.Pod{kubeProxy, lookalike})
	noPods := PodsFrom(nil)
	ports := PortsOf("http://127.0.0.1:10249/metrics", "http://127.0.0.1:10256/healthz", "http://127.0.0.1:10249/proxyMode")
	if !slices.Equal(ports, []uint16{10249, 10256}) {
		t.Fatalf("PortsOf = %v", ports)
	}
	for _, c := range []struct {
		name    string
		socks   []sockdiag.Listener
		pods    Pods
		wantPid int32
		shape   Shape
		err     error
		why     string
	}{
		{"a renamed binary of a unit", []sockdiag.Listener{listener(10249, 10), listener(10256, 10)}, noPods, 100, ShapeSystemdUnit, nil, ""},
		{"k3s beside containerd's shims", []sockdiag.Listener{listener(10249, 20), listener(10256, 20)}, noPods, 200, ShapeEmbedded, nil, ""},
		{"kube-proxy's DaemonSet pod", []sockdiag.Listener{listener(10249, 30), listener(10256, 30)}, pods, 300, ShapeDaemonSetPod, nil, ""},
		{"nothing listens", nil, noPods, 0, "", ErrNotServed, ""},
		{"the root cgroup (cgroup v1 host)", []sockdiag.Listener{listener(10249, 1)}, noPods, 0, "", ErrCannotTell, "root cgroup"},
		{"a cgroup gone", []sockdiag.Listener{listener(10249, 99)}, noPods, 0, "", ErrCannotTell, "no cgroup with that id"},
		{"no cgroup from the kernel", []sockdiag.Listener{{Addr: netip.MustParseAddrPort("127.0.0.1:10249")}}, noPods, 0, "", ErrCannotTell, "kernel 5.7+"},
		{"two cgroups serve the ports", []sockdiag.Listener{listener(10249, 10), listener(10256, 20)}, noPods, 0, "", ErrCannotTell, "different cgroups"},
		{"two processes, neither named", []sockdiag.Listener{listener(10249, 50)}, noPods, 0, "", ErrCannotTell, "a (pid 500), b (pid 501)"},
		{"another pod serves the ports", []sockdiag.Listener{listener(10249, 40)}, pods, 400, "", ErrServedByOther, "not a pod of kube-proxy"},
		{"a host process while the API has kube-proxy's pod", []sockdiag.Listener{listener(10249, 10)}, pods, 100, "", ErrServedByOther, "this node's kube-proxy is the pod kube-system/kube-proxy-abc"},
	} {
		t.Run(c.name, func(t *testing.T) {
			l := Listening{Sockets: sockets(c.socks...), Cgroups: cgs, Procs: fp}
			p, id, err := l.KubeProxy(context.Background(), ports, c.pods, 7)
			switch {
			case c.err == nil && err != nil:
				t.Fatalf("error %v", err)
			case c.err != nil && (!errors.Is(err, c.err) || !strings.Contains(err.Error(), c.why)):
				t.Fatalf("error %v, want %v containing %q", err, c.err, c.why)
			}
			if p.Pid != c.wantPid || id.Shape() != c.shape {
				t.Fatalf("pid %d shape %q (%s), want %d %q", p.Pid, id.Shape(), id, c.wantPid, c.shape)
			}
			if c.err == nil && (id.Served == nil || !strings.Contains(id.String(), "serves port 10249, 10256")) {
				t.Fatalf("identity %s does not say it serves the ports", id)
			}
		})
	}
	if _, _, err := (Listening{Sockets: sockets(listener(10249, 10)), Cgroups: cgs, Procs: fp}).KubeProxy(context.Background(), nil, noPods, 7); !errors.Is(err, ErrCannotTell) {
		t.Fatalf("no ports: %v, want ErrCannotTell (never every listener)", err)
	}
	// With descriptors readable, the holder of the socket settles a
	// cgroup of two.
	fp.Remove(501)
	fp.Add(procs.FakeProcess{Process: host(501, 1, "b", "two.service").Process, Listens: []uint16{10249}})
	l := Listening{Sockets: sockets(listener(10249, 50)), Cgroups: cgs, Procs: fp}
	if p, id, err := l.KubeProxy(context.Background(), ports, noPods, 7); err != nil || p.Pid != 501 || !id.Served.ByDescriptor {
		t.Fatalf("with ptrace: pid %d %s %v, want 501 by its descriptor", p.Pid, id, err)
	}
}

// TestOwnProcess: the proxy, its child and its pod's processes are its
// own, whatever the proxy's name; another process is not.
func TestOwnProcess(t *testing.T) {
	k3s := procs.Process{Pid: 200, PPid: 1, Cmdline: []string{"k3s-server"}, Cgroup: procs.Cgroup{Place: procs.CgroupHost, Unit: "k3s.service"}}
	restore := procs.Process{Pid: 210, PPid: 200, Cmdline: []string{"iptables-restore"}, ParentName: "k3s-server", Cgroup: k3s.Cgroup}
	admin := procs.Process{Pid: 300, PPid: 1, Cmdline: []string{"iptables-restore"}, Cgroup: procs.Cgroup{Place: procs.CgroupHost}}
	pod := procs.Process{Pid: 400, PPid: 1, Cmdline: []string{"kube-proxy"}, Cgroup: procs.Cgroup{Place: procs.CgroupPod, PodUID: kubeProxy.UID}}
	podRestore := procs.Process{Pid: 410, PPid: 999, Cmdline: []string{"iptables-restore"}, Cgroup: pod.Cgroup}
	for _, c := range []struct {
		h, proxy procs.Process
		want     bool
	}{{k3s, k3s, true}, {restore, k3s, true}, {admin, k3s, false}, {podRestore, pod, true}, {admin, pod, false}} {
		if got := OwnProcess(c.h, c.proxy); got != c.want {
			t.Errorf("OwnProcess(%s %d, proxy %s %d) = %v", c.h.Name(), c.h.Pid, c.proxy.Name(), c.proxy.Pid, got)
		}
	}
}
