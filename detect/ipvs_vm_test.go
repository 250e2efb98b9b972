//go:build linux

package detect

import (
	"context"
	"net/netip"
	"reflect"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/remediate-dev/remediate/internal/cluster"
	"github.com/remediate-dev/remediate/internal/cluster/clustertest"
	"github.com/remediate-dev/remediate/internal/finding"
	"github.com/remediate-dev/remediate/internal/ipvs"
	"github.com/remediate-dev/remediate/internal/node"
	"github.com/remediate-dev/remediate/internal/testing/vm"
)

// The TestVM* tests run only inside the IPVS test VM (make test-vm): each
// IPVS detector on the real adapter and a real kernel's IPVS table, with
// the cluster view from the fake.

var (
	vmDNS4 = vm.VIPDNS
	vmAPI4 = vm.VIPAPI
)

type vmWorld struct {
	lab            *vm.Lab
	client, b1, b2 *vm.Host
	view           *clustertest.Fake
	node           *node.Node
}

// newVMWorld: kube-dns (UDP and TCP 53 -> 5353) with backends b1 and b2
// programmed in IPVS and in the view, and default/kubernetes.
func newVMWorld(t *testing.T) *vmWorld {
	vm.Require(t)
	w := &vmWorld{lab: vm.SharedLab(t), view: clustertest.New(time.Now())}
	w.client, w.b1, w.b2 = w.lab.Hosts["client"], w.lab.Hosts["b1"], w.lab.Hosts["b2"]
	vm.Serve(t, w.b1, 5353)
	vm.Serve(t, w.b2, 5353)
	real := ipvs.New(ipvs.Options{ProcRoot: "/proc"})
	t.Cleanup(func() { _ = real.Close(context.Background()) })
	w.node = &node.Node{Name: "vm", ProcRoot: "/proc", IPVS: real, Cluster: w.view}

	w.view.SetService(cluster.Service{Namespace: "default", Name: "kubernetes", ClusterIPs: []string{vmAPI4.String()},
		Ports: []cluster.ServicePort{{Name: "https", Protocol: "TCP", Port: 443}}},
		tEP("10.0.3.2", 5353, "TCP", "https", true, true, false))
	vm.IPVSService(t, "TCP", netip.AddrPortFrom(vmAPI4, 443), netip.AddrPortFrom(w.b2.V4, 5353))
	w.setDNSEndpoints(w.b1, w.b2)
	for _, proto := range []string{"UDP", "TCP"} {
		vm.IPVSService(t, proto, netip.AddrPortFrom(vmDNS4, 53), netip.AddrPortFrom(w.b1.V4, 5353), netip.AddrPortFrom(w.b2.V4, 5353))
	}
	return w
}

func (w *vmWorld) setDNSEndpoints(hs ...*vm.Host) {
	var eps []cluster.Endpoint
	for _, h := range hs {
		eps = append(eps, tEP(h.V4.String(), 5353, "UDP", "dns", true, true, false), tEP(h.V4.String(), 5353, "TCP", "dns-tcp", true, true, false))
	}
	w.view.SetService(cluster.Service{Namespace: "kube-system", Name: "kube-dns", ClusterIPs: []string{vmDNS4.String()},
		Ports: []cluster.ServicePort{{Name: "dns", Protocol: "UDP", Port: 53}, {Name: "dns-tcp", Protocol: "TCP", Port: 53}}}, eps...)
}

func (w *vmWorld) detect(t *testing.T, typ string, set func(p any)) []finding.Finding {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	fs, err := newIPVSDetector(t, typ, w.node, set).Detect(ctx)
	if err != nil {
		t.Fatalf("%s: %v", typ, err)
	}
	return fs
}

func vmTargets(fs []finding.Finding) []string {
	out := ipvsTargets(fs)
	sort.Strings(out)
	return out
}

// TestVMIPVSStaleRealServer: a real server that left the endpoints is
// found in the real table; one kube-proxy is draining (weight 0 with a
// live TCP connection, counted by the kernel) is left alone by default.
func TestVMIPVSStaleRealServer(t *testing.T) {
	w := newVMWorld(t)
	if fs := w.detect(t, "IPVSStaleRealServer", nil); len(fs) != 0 {
		t.Fatalf("consistent state: %v", vmTargets(fs))
	}
	// b1's pod is deleted: the view drops it, kube-proxy did not.
	w.setDNSEndpoints(w.b2)
	fs := w.detect(t, "IPVSStaleRealServer", nil)
	want := []string{"ipvs-rs/TCP/10.96.0.10:53/10.0.2.2:5353", "ipvs-rs/UDP/10.96.0.10:53/10.0.2.2:5353"}
	if got := vmTargets(fs); !reflect.DeepEqual(got, want) {
		t.Fatalf("findings %v, want %v", got, want)
	}
	for _, f := range fs {
		if f.Evidence["rsAddress"] != "10.0.2.2" || f.Evidence["rsPort"] != 5353 || f.Evidence["vsAddress"] != "10.96.0.10" {
			t.Errorf("evidence %v", f.Evidence)
		}
	}

	// kube-proxy's graceful termination of TCP: weight 0 while a real
	// connection drains. Open connections until one lands on b1 (rr).
	vm.Sh(t, "ipvsadm", "-e", "-t", "10.96.0.10:53", "-r", "10.0.2.2:5353", "-m", "-w", "0")
	vm.Sh(t, "ipvsadm", "-e", "-t", "10.96.0.10:53", "-r", "10.0.2.2:5353", "-m", "-w", "1")
	onB1 := false
	for i := 0; i < 4 && !onB1; i++ {
		name, _ := vm.TCPConnect(t, w.client, netip.AddrPortFrom(vmDNS4, 53))
		onB1 = name == "b1"
	}
	if !onB1 {
		t.Fatal("no TCP connection reached b1 in 4 round-robin tries")
	}
	vm.Sh(t, "ipvsadm", "-e", "-t", "10.96.0.10:53", "-r", "10.0.2.2:5353", "-m", "-w", "0")
	t.Logf("ipvsadm -Ln:\n%s", vm.Sh(t, "ipvsadm", "-Ln"))
	fs = w.detect(t, "IPVSStaleRealServer", nil)
	if got := vmTargets(fs); !reflect.DeepEqual(got, want[1:]) {
		t.Fatalf("with TCP b1 draining: %v, want only %v", got, want[1:])
	}
	fs = w.detect(t, "IPVSStaleRealServer", func(p any) { p.(*IPVSStaleRealServerParams).IncludeDraining = true })
	if got := vmTargets(fs); !reflect.DeepEqual(got, want) {
		t.Fatalf("includeDraining: %v, want %v", got, want)
	}
}

// TestVMIPVSStaleAndMissingVirtualServer: a virtual server of a deleted
// Service is stale; one outside managedCIDRs is not kube-proxy's; a
// Service with endpoints and no virtual server is missing.
func TestVMIPVSStaleAndMissingVirtualServer(t *testing.T) {
	w := newVMWorld(t)
	for _, typ := range []string{"IPVSStaleVirtualServer", "IPVSMissingVirtualServer"} {
		if fs := w.detect(t, typ, nil); len(fs) != 0 {
			t.Fatalf("%s on a consistent state: %v", typ, vmTargets(fs))
		}
	}
	vm.IPVSService(t, "TCP", netip.MustParseAddrPort("10.96.5.5:80"), netip.AddrPortFrom(w.b1.V4, 5353))
	vm.IPVSService(t, "TCP", netip.MustParseAddrPort("172.16.0.1:80"), netip.AddrPortFrom(w.b1.V4, 5353))
	w.view.SetService(cluster.Service{Namespace: "default", Name: "web", ClusterIPs: []string{"10.96.7.7"},
		Ports: []cluster.ServicePort{{Name: "http", Protocol: "TCP", Port: 80}}},
		tEP(w.b2.V4.String(), 5353, "TCP", "http", true, true, false))

	fs := w.detect(t, "IPVSStaleVirtualServer", nil)
	if got := vmTargets(fs); !reflect.DeepEqual(got, []string{"ipvs-vs/TCP/10.96.5.5:80"}) {
		t.Fatalf("stale: %v", got)
	}
	if fs[0].Evidence["realServers"] != 1 {
		t.Errorf("evidence %v", fs[0].Evidence)
	}
	fs = w.detect(t, "IPVSMissingVirtualServer", nil)
	if got := vmTargets(fs); !reflect.DeepEqual(got, []string{"ipvs-vs/TCP/10.96.7.7:80"}) {
		t.Fatalf("missing: %v", got)
	}
}

// TestVMIPVSUDPDeadBackend: a real UDP client pinned through IPVS to b1;
// once b1 leaves the endpoints its entry is found, with the client, the
// virtual server, that b1 is still a real server, and the kernel's
// expire_nodest_conn.
func TestVMIPVSUDPDeadBackend(t *testing.T) {
	w := newVMWorld(t)
	vip := netip.AddrPortFrom(vmDNS4, 53)
	onB1 := false
	for i := 0; i < 4 && !onB1; i++ {
		name, err := vm.NewUDPClient(t, w.client, vm.ClientPort(), vip).Query(3 * time.Second)
		if err != nil {
			t.Fatal(err)
		}
		onB1 = name == "b1"
	}
	if !onB1 {
		t.Fatal("no UDP flow reached b1 in 4 round-robin tries")
	}
	if fs := w.detect(t, "IPVSUDPDeadBackend", nil); len(fs) != 0 {
		t.Fatalf("every backend alive: %v", vmTargets(fs))
	}
	w.setDNSEndpoints(w.b2)
	fs := w.detect(t, "IPVSUDPDeadBackend", nil)
	if got := vmTargets(fs); !reflect.DeepEqual(got, []string{"ipvs-conn/UDP/10.0.2.2:5353"}) {
		t.Fatalf("findings %v; ipvsadm -Lnc:\n%s", got, vm.Sh(t, "ipvsadm", "-Lnc"))
	}
	ev := fs[0].Evidence
	if ev["connections"].(int) < 1 || !reflect.DeepEqual(ev["clients"], []string{w.client.V4.String()}) ||
		!reflect.DeepEqual(ev["stillRealServerIn"], []string{"UDP/10.96.0.10:53"}) || ev["expireNodestConn"] != "0" {
		t.Fatalf("evidence %v", ev)
	}
	if !strings.Contains(fs[0].Message, "still a real server of UDP/10.96.0.10:53") {
		t.Errorf("message %q", fs[0].Message)
	}
}

// TestVMIPVSUDPTimeoutHigh: the kernel's default 300s is above the
// default ceiling; after lowering it with ipvsadm nothing is found.
func TestVMIPVSUDPTimeoutHigh(t *testing.T) {
	w := newVMWorld(t)
	fs := w.detect(t, "IPVSUDPTimeoutHigh", nil)
	if len(fs) != 1 || fs[0].Evidence["udpTimeoutSeconds"] != 300 || fs[0].Evidence["tcpTimeoutSeconds"] != 900 {
		t.Fatalf("findings %+v", fs)
	}
	vm.Sh(t, "ipvsadm", "--set", "900", "120", "30")
	if fs := w.detect(t, "IPVSUDPTimeoutHigh", nil); len(fs) != 0 {
		t.Fatalf("after lowering: %+v", fs)
	}
}

// TestVMIPVSModeCheck: without kube-ipvs0 (kube-proxy not in IPVS mode)
// every IPVS detector skips with the reason, on a kernel that has IPVS.
func TestVMIPVSModeCheck(t *testing.T) {
	w := newVMWorld(t)
	// Rename it away (the shared lab keeps its addresses) and back.
	vm.Sh(t, "ip", "link", "set", "kube-ipvs0", "down")
	vm.Sh(t, "ip", "link", "set", "kube-ipvs0", "name", "kipvs-away")
	t.Cleanup(func() {
		vm.Sh(t, "ip", "link", "set", "kipvs-away", "name", "kube-ipvs0")
		vm.Sh(t, "ip", "link", "set", "kube-ipvs0", "up")
	})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	for _, typ := range []string{"IPVSStaleRealServer", "IPVSStaleVirtualServer", "IPVSMissingVirtualServer", "IPVSUDPDeadBackend", "IPVSUDPTimeoutHigh"} {
		fs, err := newIPVSDetector(t, typ, w.node, nil).Detect(ctx)
		reason, ok := finding.IsSkip(err)
		if !ok || !strings.Contains(reason, "no kube-ipvs0 interface") || len(fs) != 0 {
			t.Errorf("%s: %v, %v; want a skip naming kube-ipvs0", typ, fs, err)
		}
	}
}
