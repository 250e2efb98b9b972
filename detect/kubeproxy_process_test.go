package detect

import (
	"context"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/remediate-dev/remediate/internal/cluster"
	"github.com/remediate-dev/remediate/internal/iptables"
	"github.com/remediate-dev/remediate/internal/procident"
	"github.com/remediate-dev/remediate/internal/procs"
)

func TestPickKubeProxy(t *testing.T) {
	const self, other = 1, 2
	host := func(pid int32, netKey uint64) procs.Process {
		return procs.Process{Pid: pid, Comm: "kube-proxy", NetKey: netKey, CapEff: procs.CapNetAdmin, Cgroup: procs.Cgroup{Place: procs.CgroupHost}}
	}
	inPod := func(pid int32, uid string) procs.Process {
		p := host(pid, self)
		p.Cgroup = procs.Cgroup{Place: procs.CgroupPod, PodUID: uid}
		return p
	}
	kpPod := cluster.Pod{Namespace: "kube-system", Name: "kube-proxy-x", UID: "11111111-1111-1111-1111-111111111111",
		Labels: map[string]string{"k8s-app": "kube-proxy"}, ControllerKind: "DaemonSet", ControllerName: "kube-proxy"}
	userPod := cluster.Pod{Namespace: "default", Name: "app", UID: "22222222-2222-2222-2222-222222222222", ControllerKind: "ReplicaSet"}
	staticMirror := cluster.Pod{Namespace: "kube-system", Name: "kube-proxy-node1", UID: "33333333-3333-3333-3333-333333333333",
		Labels: map[string]string{"k8s-app": "kube-proxy"}, MirrorOf: "0123456789abcdef0123456789abcdef"}
	withKP := procident.PodsFrom([]cluster.Pod{kpPod, userPod})
	noKP := procident.PodsFrom([]cluster.Pod{userPod})
	stale := procident.PodsOf(nil, procT0)
	for _, c := range []struct {
		name    string
		ps      []procs.Process
		pods    procident.Pods
		pid     int32
		method  procident.Method
		wantErr string
	}{
		{"none", nil, noKP, 0, "", "no process named kube-proxy"},
		// Issue 27, item 9: the only one, in another namespace, is not
		// this node's (on main it was taken).
		{"the only one, in another namespace", []procs.Process{host(7, other)}, noKP, 0, "", "none this node's: pid 7 runs in another network namespace"},
		{"a host kube-proxy, its namespace unknown", []procs.Process{host(7, 0)}, noKP, 7, procident.HostCgroup, ""},
		{"the only one in this network namespace", []procs.Process{host(7, other), host(9, self)}, noKP, 9, procident.HostCgroup, ""},
		{"several, none here (kind's nested clusters)", []procs.Process{host(7, other), host(9, other)}, noKP, 0, "", "2 processes named kube-proxy, none this node's"},
		{"several host ones here", []procs.Process{host(7, self), host(9, self)}, noKP, 0, "", "2 may be this node's"},
		{"an impostor here (ptrace: its executable)", []procs.Process{{Pid: 7, Comm: "kube-proxy", NetKey: self, CapEff: procs.CapNetAdmin, Cgroup: procs.Cgroup{Place: procs.CgroupHost}, Exe: "/tmp/x/bash"}}, noKP, 0, "", "pid 7's executable is /tmp/x/bash, not a kube-proxy"},
		// Issue 41: the cgroup and the API tell them apart.
		{"kube-proxy's pod among host ones (other tests' clusters)", []procs.Process{host(7, self), inPod(8, kpPod.UID), host(9, self)}, withKP, 8, procident.CgroupAPI, ""},
		{"a host one while the API has kube-proxy's pod here", []procs.Process{host(7, self)}, withKP, 0, "", "this node's kube-proxy is the pod kube-system/kube-proxy-x"},
		{"a kube-proxy in a user pod (even a real kube-proxy build)", []procs.Process{func() procs.Process {
			p := inPod(7, userPod.UID)
			p.Exe = "/usr/local/bin/kube-proxy"
			return p
		}()}, withKP, 0, "", "pod default/app (neither a DaemonSet's nor a static pod), which is not a pod of kube-proxy"},
		{"a pod not on this node", []procs.Process{inPod(7, "44444444-4444-4444-4444-444444444444")}, withKP, 0, "", "which the API does not list on this node"},
		{"a static kube-proxy (its cgroup has the config hash)", []procs.Process{inPod(7, staticMirror.MirrorOf)}, procident.PodsFrom([]cluster.Pod{staticMirror}), 7, procident.CgroupAPI, ""},
		{"the mirror's own UID is no static pod's", []procs.Process{inPod(7, staticMirror.UID)}, procident.PodsFrom([]cluster.Pod{staticMirror}), 0, "", "does not list"},
		{"in a pod, no pod view", []procs.Process{inPod(7, kpPod.UID)}, stale, 0, "", "whose pod that is cannot be told"},
		{"ambiguous cgroup", []procs.Process{{Pid: 7, Comm: "kube-proxy", NetKey: self, CapEff: procs.CapNetAdmin, Cgroup: procs.Cgroup{Place: procs.CgroupAmbiguous, Why: "two pods"}}}, withKP, 0, "", "cannot be told: two pods"},
	} {
		got, id, err := pickKubeProxy(c.ps, c.pods, self)
		if c.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), c.wantErr) {
				t.Errorf("%s: %+v, %v; want an error containing %q", c.name, got, err, c.wantErr)
			}
			continue
		}
		if err != nil || got.Pid != c.pid || id.Method != c.method {
			t.Errorf("%s: %+v %s, %v; want PID %d by %s", c.name, got, id, err, c.pid, c.method)
		}
	}
}

// TestKubeProxyIPTables: kube-proxy's process is found and its iptables
// read from its own root (/proc/<pid>/root), not the host's; the two
// detectors that use it agree.
func TestKubeProxyIPTables(t *testing.T) {
	pf := procs.NewFake(999)
	pf.Add(fakeProc(50, 1, "kube-proxy", procT0.Add(-time.Hour), "S", "kube-proxy"))
	n, _ := newIssue3Node(pf)
	n.ProcRoot = fakeProcRoot(t, map[int]map[string]string{1: debianRoot("nft", "1.8.9"), 50: debianRoot("legacy", "1.8.7")})
	kp, err := kubeProxyIPTables(context.Background(), n, nil)
	if err != nil {
		t.Fatal(err)
	}
	if kp.Who != "kube-proxy" || kp.Pid != 50 || kp.In.Root != filepath.Join(n.ProcRoot, "50", "root") ||
		kp.In.Backend != iptables.Legacy || kp.In.Version != "1.8.7" {
		t.Fatalf("kube-proxy's iptables = %+v", kp)
	}
	if host := readPartyIPTables(nil, "host", 0, hostRoot(n)); host.In.Backend != iptables.NFT || host.In.Root != filepath.Join(n.ProcRoot, "1", "root") {
		t.Fatalf("host's iptables = %+v", host)
	}
	_, kp2, _, _ := readIPTablesParties(context.Background(), n, nil, nil)
	if kp2 == nil || kp2.Pid != kp.Pid || kp2.In.Describe() != kp.In.Describe() {
		t.Fatalf("readIPTablesParties' kube-proxy = %+v, kubeProxyIPTables' %+v", kp2, kp)
	}

	// A second kube-proxy in another network namespace (a nested
	// cluster's): this node's is still the one in the daemon's.
	nested := fakeProc(70, 1, "kube-proxy", procT0.Add(-time.Hour), "S", "kube-proxy")
	nested.NetNS = "net:[4026532999]"
	pf.Add(nested)
	if kp, err := kubeProxyIPTables(context.Background(), n, nil); err != nil || kp.Pid != 50 {
		t.Fatalf("with a nested kube-proxy: %+v, %v", kp, err)
	}

	// No process lister: said, not guessed.
	n.Procs = nil
	if _, err := kubeProxyIPTables(context.Background(), n, nil); err == nil {
		t.Fatal("no error without a process lister")
	}
}
