package procident

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/remediate-dev/remediate/internal/cluster"
	"github.com/remediate-dev/remediate/internal/cluster/clustertest"
	"github.com/remediate-dev/remediate/internal/procs"
)

var (
	t0        = time.Date(2026, 11, 28, 3, 0, 0, 0, time.UTC)
	kubeProxy = cluster.Pod{Namespace: "kube-system", Name: "kube-proxy-abc", UID: "11111111-1111-1111-1111-111111111111",
		Labels: map[string]string{"k8s-app": "kube-proxy"}, ControllerKind: "DaemonSet", ControllerName: "kube-proxy"}
	calico = cluster.Pod{Namespace: "calico-system", Name: "calico-node-x", UID: "55555555-5555-5555-5555-555555555555",
		Labels: map[string]string{"k8s-app": "calico-node"}, ControllerKind: "DaemonSet", ControllerName: "calico-node"}
	// A user's pod labelled like kube-proxy, in its own namespace.
	lookalike = cluster.Pod{Namespace: "default", Name: "kube-proxy-fake", UID: "22222222-2222-2222-2222-222222222222",
		Labels: map[string]string{"k8s-app": "kube-proxy"}, ControllerKind: "DaemonSet", ControllerName: "kube-proxy"}
	// A bare pod in kube-system labelled like kube-proxy (no controller).
	bare = cluster.Pod{Namespace: "kube-system", Name: "kube-proxy-bare", UID: "66666666-6666-6666-6666-666666666666",
		Labels: map[string]string{"k8s-app": "kube-proxy"}}
	static = cluster.Pod{Namespace: "kube-system", Name: "kube-proxy-node1", UID: "33333333-3333-3333-3333-333333333333",
		Labels: map[string]string{"k8s-app": "kube-proxy"}, MirrorOf: "0123456789abcdef0123456789abcdef"}
)

func proc(place procs.CgroupPlace, uid string) procs.Process {
	return procs.Process{Pid: 42, Comm: "iptables-restor", Cmdline: []string{"iptables-restore"}, CapEff: procs.CapNetAdmin, NetKey: 7,
		Cgroup: procs.Cgroup{Place: place, PodUID: uid}}
}

// TestOf: the cgroup's pod, checked against the API, is the identity; a
// name, an executable, labels in another namespace or without a
// controller are not.
func TestOf(t *testing.T) {
	pods := PodsFrom([]cluster.Pod{kubeProxy, calico, lookalike, bare, static})
	agents := Agents(cluster.DefaultCNIAgents())
	for _, c := range []struct {
		name   string
		p      procs.Process
		pods   Pods
		method Method
		agent  string
		refuse string
	}{
		{"kube-proxy's pod", proc(procs.CgroupPod, kubeProxy.UID), pods, CgroupAPI, "kube-proxy", ""},
		{"calico's pod", proc(procs.CgroupPod, calico.UID), pods, CgroupAPI, "calico-node", ""},
		{"static kube-proxy", proc(procs.CgroupPod, static.MirrorOf), pods, CgroupAPI, "kube-proxy", ""},
		{"host", proc(procs.CgroupHost, ""), pods, HostCgroup, "", ""},
		{"user pod labelled kube-proxy", proc(procs.CgroupPod, lookalike.UID), pods, "", "", "pod default/kube-proxy-fake (DaemonSet kube-proxy), which is not a pod of kube-proxy, calico-node"},
		{"bare pod in kube-system", proc(procs.CgroupPod, bare.UID), pods, "", "", "neither a DaemonSet's nor a static pod"},
		{"a mirror's own UID", proc(procs.CgroupPod, static.UID), pods, "", "", "does not list on this node"},
		{"another node's pod", proc(procs.CgroupPod, "44444444-4444-4444-4444-444444444444"), pods, "", "", "does not list on this node"},
		{"no view", proc(procs.CgroupPod, kubeProxy.UID), PodsOf(nil, t0), "", "", "no watch of this node's pods"},
		{"ambiguous", procs.Process{Pid: 42, Cgroup: procs.Cgroup{Place: procs.CgroupAmbiguous, Why: "two pods"}}, pods, "", "", "cannot be told: two pods"},
		{"unreadable", procs.Process{Pid: 42}, pods, "", "", "not readable"},
	} {
		id := Of(c.p, c.pods, agents)
		if id.Method != c.method || id.Agent != c.agent || !strings.Contains(id.Refused, c.refuse) || (c.refuse == "") != id.OK() {
			t.Errorf("%s: %+v, want %q %q refused %q", c.name, id, c.method, c.agent, c.refuse)
		}
	}
}

// TestPodsOf: only a synced, connected, in-budget view is used.
func TestPodsOf(t *testing.T) {
	v := clustertest.NewPods(t0)
	v.Set(kubeProxy)
	p := proc(procs.CgroupPod, kubeProxy.UID)
	if id := Of(p, PodsOf(v, t0), Agents(nil)); id.Method != CgroupAPI {
		t.Fatalf("fresh view: %+v", id)
	}
	for name, f := range map[string]cluster.Freshness{
		"not synced":   {Synced: false, Connected: true},
		"over budget":  {Synced: true, Connected: true, OverBudget: "over its 64 MiB budget"},
		"disconnected": {Synced: true, Connected: false, CurrentAt: t0, MaxAge: time.Hour, LastError: errors.New("refused")},
	} {
		v.SetFreshness(f)
		if id := Of(p, PodsOf(v, t0), Agents(nil)); id.OK() {
			t.Errorf("%s: identity %+v from a view not to trust", name, id)
		}
	}
}

// TestTarget: a netfilter target needs an identity, CAP_NET_ADMIN, the
// node's network namespace (or the node's lock) and, when readable, a
// netfilter executable.
func TestTarget(t *testing.T) {
	pods := PodsFrom([]cluster.Pod{kubeProxy, lookalike})
	agents := Agents(nil)
	progs := procs.NetfilterPrograms
	ok := proc(procs.CgroupPod, kubeProxy.UID)
	if id := Target(ok, pods, agents, progs, 7, false); id.Method != CgroupAPI {
		t.Fatalf("kube-proxy's restore, no ptrace: %+v", id)
	}
	ok.Exe = "/usr/sbin/xtables-legacy-multi"
	if id := Target(ok, pods, agents, progs, 7, false); id.Method != CgroupAPI {
		t.Fatalf("with its executable: %+v", id)
	}
	for name, c := range map[string]struct {
		p      procs.Process
		onLock bool
		want   string
	}{
		"user pod, real executable":  {func() procs.Process { p := proc(procs.CgroupPod, lookalike.UID); p.Exe = ok.Exe; return p }(), true, "not a pod of kube-proxy"},
		"executable of another name": {func() procs.Process { p := ok; p.Exe = "/usr/bin/sleep"; return p }(), false, "not an iptables/nft program"},
		"no CAP_NET_ADMIN":           {func() procs.Process { p := ok; p.CapEff = 0; return p }(), false, "without CAP_NET_ADMIN"},
		"another netns":              {func() procs.Process { p := ok; p.NetKey = 8; return p }(), false, "not the node's"},
		"netns unknown":              {func() procs.Process { p := ok; p.NetKey = 0; return p }(), false, "not the node's"},
	} {
		if id := Target(c.p, pods, agents, progs, 7, c.onLock); id.OK() || !strings.Contains(id.Refused, c.want) {
			t.Errorf("%s: %+v, want refused %q", name, id, c.want)
		}
	}
	other := ok
	other.NetKey = 8
	if id := Target(other, pods, agents, progs, 7, true); !id.OK() {
		t.Errorf("another netns on the node's lock: %+v", id)
	}
}

// TestKubeProxy: a host kube-proxy is taken only without a kube-proxy pod
// on this node in the API.
func TestKubeProxy(t *testing.T) {
	host := proc(procs.CgroupHost, "")
	if id := KubeProxy(host, PodsFrom(nil), 7); id.Method != HostCgroup {
		t.Fatalf("host kube-proxy, none in the API: %+v", id)
	}
	if id := KubeProxy(host, PodsFrom([]cluster.Pod{kubeProxy}), 7); id.OK() || !strings.Contains(id.Refused, "this node's kube-proxy is the pod kube-system/kube-proxy-abc") {
		t.Fatalf("host kube-proxy beside the API's: %+v", id)
	}
	if id := KubeProxy(proc(procs.CgroupPod, kubeProxy.UID), PodsFrom([]cluster.Pod{kubeProxy}), 7); id.Method != CgroupAPI || id.Pod != "kube-system/kube-proxy-abc" || !strings.Contains(id.String(), "cgroup+api (pod kube-system/kube-proxy-abc, DaemonSet kube-proxy") {
		t.Fatalf("the API's: %+v %s", id, id)
	}
	calicoProc := proc(procs.CgroupPod, calico.UID)
	if id := KubeProxy(calicoProc, PodsFrom([]cluster.Pod{kubeProxy, calico}), 7); id.OK() {
		t.Fatalf("calico's process taken for kube-proxy: %+v", id)
	}
}

// TestShapes: how the node runs kube-proxy, told from the cgroup, the API
// and the program, and what restarting each takes.
func TestShapes(t *testing.T) {
	named := func(p procs.Process, name string, unit string) procs.Process {
		p.Comm, p.Cmdline, p.Cgroup.Unit = name, []string{"/usr/local/bin/" + name}, unit
		return p
	}
	staticProc := proc(procs.CgroupPod, static.MirrorOf)
	staticProc.Cgroup.ContainerID = strings.Repeat("c", 64)
	for _, tc := range []struct {
		name      string
		p         procs.Process
		pods      []cluster.Pod
		shape     Shape
		how, desc string
	}{
		{"DaemonSet pod", named(proc(procs.CgroupPod, kubeProxy.UID), "kube-proxy", ""), []cluster.Pod{kubeProxy}, ShapeDaemonSetPod, "", "DaemonSet kube-proxy"},
		{"static pod", named(staticProc, "kube-proxy", ""), []cluster.Pod{static}, ShapeStaticPod, "crictl stop cccccccccccc", "static pod"},
		{"systemd unit", named(proc(procs.CgroupHost, ""), "kube-proxy", "kube-proxy.service"), nil, ShapeSystemdUnit, "systemctl restart kube-proxy.service", "systemd unit kube-proxy.service"},
		{"k3s", named(proc(procs.CgroupHost, ""), "k3s-server", "k3s.service"), nil, ShapeEmbedded, "systemctl restart k3s.service", "embedded in k3s-server"},
		{"host shell", named(proc(procs.CgroupHost, ""), "kube-proxy", ""), nil, ShapeHostProcess, "whoever started it", "a host process"},
	} {
		id := KubeProxy(tc.p, PodsFrom(tc.pods), 7)
		if id.Shape() != tc.shape || !strings.Contains(id.RestartHow(), tc.how) || tc.how == "" && id.RestartHow() != "" || !strings.Contains(id.String(), tc.desc) {
			t.Errorf("%s: %+v: shape %q, restart %q, %s", tc.name, id, id.Shape(), id.RestartHow(), id)
		}
		ev := map[string]any{}
		id.Evidence(ev)
		if ev["shape"] != string(tc.shape) {
			t.Errorf("%s: evidence %v", tc.name, ev)
		}
	}
	// k3s in a pod's cgroup (a user's pod named so) is not this node's
	// kube-proxy; nor is a k3s-server whose executable is not k3s's.
	inPod := named(proc(procs.CgroupPod, lookalike.UID), "k3s-server", "")
	if id := KubeProxy(inPod, PodsFrom([]cluster.Pod{lookalike}), 7); id.OK() {
		t.Errorf("k3s-server in a pod taken: %+v", id)
	}
	fake := named(proc(procs.CgroupHost, ""), "k3s-server", "")
	fake.Exe = "/tmp/sleep"
	if id := KubeProxy(fake, PodsFrom(nil), 7); id.OK() || !strings.Contains(id.Refused, "not k3s") {
		t.Errorf("k3s-server with another executable taken: %+v", id)
	}
	fake.Exe = "/var/lib/rancher/k3s/data/abc/bin/k3s"
	if id := KubeProxy(fake, PodsFrom(nil), 7); id.Shape() != ShapeEmbedded {
		t.Errorf("k3s-server with k3s's executable refused: %+v", id)
	}
}
