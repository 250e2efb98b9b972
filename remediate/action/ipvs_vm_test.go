//go:build linux

package action

import (
	"context"
	"errors"
	"net/netip"
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
// IPVS action and each of its refusals on the real adapter and a real
// kernel's IPVS table, the cluster view from the fake.

// vmActNode is the real adapter on the guest's root namespace with a fresh
// fake view holding default/kubernetes and kube-dns (UDP and TCP 53 ->
// 5353) with endpoints eps.
func vmActNode(t *testing.T, eps ...string) (*node.Node, *clustertest.Fake) {
	t.Helper()
	view := clustertest.New(time.Now())
	real := ipvs.New(ipvs.Options{ProcRoot: "/proc"})
	t.Cleanup(func() { _ = real.Close(context.Background()) })
	view.SetService(cluster.Service{Namespace: "default", Name: "kubernetes", ClusterIPs: []string{"10.96.0.1"},
		Ports: []cluster.ServicePort{{Name: "https", Protocol: "TCP", Port: 443}}},
		cluster.Endpoint{Address: "10.0.9.9", Port: 6443, Protocol: "TCP", PortName: "https", Ready: true, Serving: true})
	setDNS(view, eps...)
	return &node.Node{Name: "vm", ProcRoot: "/proc", IPVS: real, Cluster: view, KubeProxy: ipvsKubeProxy()}, view
}

func setDNS(view *clustertest.Fake, eps ...string) {
	var list []cluster.Endpoint
	for _, e := range eps {
		list = append(list,
			cluster.Endpoint{Address: e, Port: 5353, Protocol: "UDP", PortName: "dns", Ready: true, Serving: true},
			cluster.Endpoint{Address: e, Port: 5353, Protocol: "TCP", PortName: "dns-tcp", Ready: true, Serving: true})
	}
	view.SetService(cluster.Service{Namespace: "kube-system", Name: "kube-dns", ClusterIPs: []string{"10.96.0.10"},
		Ports: []cluster.ServicePort{{Name: "dns", Protocol: "UDP", Port: 53}, {Name: "dns-tcp", Protocol: "TCP", Port: 53}}}, list...)
}

func vmRSFinding(proto, rs string) finding.Finding {
	return withRefs(finding.Finding{Detector: "IPVSStaleRealServer", Target: "ipvs-rs/" + proto + "/10.96.0.10:53/" + rs + ":5353",
		Evidence: map[string]any{"vsProtocol": proto, "vsAddress": "10.96.0.10", "vsPort": 53, "rsAddress": rs, "rsPort": 5353}})
}

func ipvsadmHas(t *testing.T, s string) bool { return strings.Contains(vm.Sh(t, "ipvsadm", "-Ln"), s) }

func vmCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// TestVMDeleteIPVSRealServer: the stale real server is deleted from the
// kernel; every refusal leaves the kernel as it was.
func TestVMDeleteIPVSRealServer(t *testing.T) {
	vm.Require(t)
	ctx := vmCtx(t)
	vip := netip.MustParseAddrPort("10.96.0.10:53")
	b1, b2 := netip.MustParseAddrPort("10.0.2.2:5353"), netip.MustParseAddrPort("10.0.3.2:5353")
	vm.IPVSService(t, "UDP", vip, b1, b2)
	n, view := vmActNode(t, "10.0.3.2") // b1 left the endpoints
	act := func(set func(p any)) Action { return newIPVSAction(t, "DeleteIPVSRealServer", n, set) }
	f := vmRSFinding("UDP", "10.0.2.2")

	refusals := []struct {
		name, want string
		setup      func()
		undo       func()
	}{
		{"view not synced", "not synced", func() { view.SetFreshness(cluster.Freshness{Connected: true}) },
			func() { view.SetFreshness(cluster.Freshness{Synced: true, Connected: true, LastEvent: time.Now()}) }},
		{"view disconnected", "disconnected", func() {
			view.SetFreshness(cluster.Freshness{Synced: true, Connected: false, LastError: errors.New("watch closed")})
		}, func() { view.SetFreshness(cluster.Freshness{Synced: true, Connected: true, LastEvent: time.Now()}) }},
		{"expected endpoint again", "expected endpoint", func() { setDNS(view, "10.0.2.2", "10.0.3.2") }, func() { setDNS(view, "10.0.3.2") }},
		{"view has no endpoints", "no endpoints at all", func() { view.SetEndpoints("kube-system", "kube-dns") }, func() { setDNS(view, "10.0.3.2") }},
		{"no Service for the virtual server", "matches no Service", func() { view.DeleteService("kube-system", "kube-dns") }, func() { setDNS(view, "10.0.3.2") }},
	}
	for _, r := range refusals {
		r.setup()
		_, err := act(nil).Execute(ctx, f)
		wantSkip(t, err, r.want)
		if !ipvsadmHas(t, "10.0.2.2:5353") {
			t.Fatalf("%s: the real server was deleted", r.name)
		}
		r.undo()
	}

	a := act(nil)
	p, err := a.Plan(ctx, f)
	if err != nil || !strings.Contains(p.Summary, "delete real server 10.0.2.2:5353 from IPVS UDP/10.96.0.10:53") {
		t.Fatalf("plan %+v, %v", p, err)
	}
	if !ipvsadmHas(t, "10.0.2.2:5353") {
		t.Fatal("Plan deleted")
	}
	res, err := a.Execute(ctx, f)
	if err != nil {
		t.Fatal(err)
	}
	if ipvsadmHas(t, "10.0.2.2:5353") || !ipvsadmHas(t, "10.0.3.2:5353") {
		t.Fatalf("after %q:\n%s", res.Summary, vm.Sh(t, "ipvsadm", "-Ln"))
	}
	if res.Details["restoreCommand"] != "ipvsadm -a -u 10.96.0.10:53 -r 10.0.2.2:5353 -m -w 1" {
		t.Errorf("restore %v", res.Details["restoreCommand"])
	}
	// The restore command restores it.
	vm.Sh(t, strings.Fields(res.Details["restoreCommand"].(string))...)
	if !ipvsadmHas(t, "10.0.2.2:5353") {
		t.Fatal("restoreCommand did not restore")
	}
	// maxPerCycle 1 within the window: the second delete is refused.
	_, err = a.Execute(ctx, f)
	wantSkip(t, err, "maxPerCycle 1")
	// Gone: a fresh action says so, the kernel's ENOENT is not an error.
	vm.Sh(t, "ipvsadm", "-d", "-u", vip.String(), "-r", b1.String())
	_, err = act(nil).Execute(ctx, f)
	wantSkip(t, err, "no longer exists")
	vm.Sh(t, "ipvsadm", "-D", "-u", vip.String())
	_, err = act(nil).Execute(ctx, f)
	wantSkip(t, err, "virtual server UDP/10.96.0.10:53 no longer exists")

	// TCP draining: weight 0 with a live connection counted by the kernel.
	lab := vm.SharedLab(t)
	client, hb1 := lab.Hosts["client"], lab.Hosts["b1"]
	vm.Serve(t, hb1, 5353)
	vm.IPVSService(t, "TCP", vip, netip.AddrPortFrom(hb1.V4, 5353))
	if name, _ := vm.TCPConnect(t, client, vip); name != "b1" {
		t.Fatalf("TCP answered by %q", name)
	}
	vm.Sh(t, "ipvsadm", "-e", "-t", vip.String(), "-r", "10.0.2.2:5353", "-m", "-w", "0")
	_, err = act(nil).Execute(ctx, vmRSFinding("TCP", "10.0.2.2"))
	wantSkip(t, err, "draining")
	if _, err := act(func(p any) { p.(*DeleteIPVSRealServerParams).DeleteDraining = true }).Execute(ctx, vmRSFinding("TCP", "10.0.2.2")); err != nil {
		t.Fatalf("deleteDraining: %v", err)
	}
	if ipvsadmHas(t, "10.0.2.2:5353") {
		t.Fatal("deleteDraining did not delete")
	}
}

// TestVMDeleteIPVSVirtualServer: a virtual server no Service wants is
// deleted with its real servers; one the view wants, one outside
// managedCIDRs, one that is gone and any against an empty or stale view
// are refused.
func TestVMDeleteIPVSVirtualServer(t *testing.T) {
	vm.Require(t)
	ctx := vmCtx(t)
	vm.IPVSService(t, "TCP", netip.MustParseAddrPort("10.96.0.1:443"), netip.MustParseAddrPort("10.0.9.9:6443"))
	vm.IPVSService(t, "UDP", netip.MustParseAddrPort("10.96.0.10:53"), netip.MustParseAddrPort("10.0.3.2:5353"))
	vm.IPVSService(t, "TCP", netip.MustParseAddrPort("10.96.5.5:80"), netip.MustParseAddrPort("10.0.2.2:8080"), netip.MustParseAddrPort("10.0.3.2:8080"))
	vm.IPVSService(t, "TCP", netip.MustParseAddrPort("172.16.0.1:80"), netip.MustParseAddrPort("10.0.2.2:8080"))
	n, view := vmActNode(t, "10.0.3.2")
	act := func() Action { return newIPVSAction(t, "DeleteIPVSVirtualServer", n, nil) }

	_, err := act().Execute(ctx, vsFinding("UDP", "10.96.0.10", 53))
	wantSkip(t, err, "should exist")
	_, err = act().Execute(ctx, vsFinding("TCP", "172.16.0.1", 80))
	wantSkip(t, err, "outside managedCIDRs")
	view.SetFreshness(cluster.Freshness{Synced: true, Connected: false})
	_, err = act().Execute(ctx, vsFinding("TCP", "10.96.5.5", 80))
	wantSkip(t, err, "disconnected")
	view.SetFreshness(cluster.Freshness{Synced: true, Connected: true, LastEvent: time.Now()})
	empty := &node.Node{Name: "vm", ProcRoot: "/proc", IPVS: n.IPVS, Cluster: clustertest.New(time.Now()), KubeProxy: n.KubeProxy}
	_, err = newIPVSAction(t, "DeleteIPVSVirtualServer", empty, nil).Execute(ctx, vsFinding("TCP", "10.96.5.5", 80))
	wantSkip(t, err, "no Services at all")
	for _, s := range []string{"10.96.0.10:53", "172.16.0.1:80", "10.96.5.5:80"} {
		if !ipvsadmHas(t, s) {
			t.Fatalf("a refusal deleted %s", s)
		}
	}

	a := act()
	res, err := a.Execute(ctx, vsFinding("TCP", "10.96.5.5", 80))
	if err != nil {
		t.Fatal(err)
	}
	if ipvsadmHas(t, "10.96.5.5:80") || !ipvsadmHas(t, "172.16.0.1:80") || !ipvsadmHas(t, "10.96.0.10:53") {
		t.Fatalf("after %q:\n%s", res.Summary, vm.Sh(t, "ipvsadm", "-Ln"))
	}
	if !strings.Contains(res.Summary, "and its 2 real servers") || len(res.Details["realServers"].([]string)) != 2 {
		t.Errorf("result %+v", res)
	}
	_, err = act().Execute(ctx, vsFinding("TCP", "10.96.5.5", 80))
	wantSkip(t, err, "no longer exists")
	vm.IPVSService(t, "TCP", netip.MustParseAddrPort("10.96.5.6:80"))
	_, err = a.Execute(ctx, vsFinding("TCP", "10.96.5.6", 80))
	wantSkip(t, err, "maxPerCycle 1")
}

// TestVMSetIPVSTimeouts: the UDP timeout is lowered in the kernel and read
// back; already low enough is a refusal; the restore command restores.
func TestVMSetIPVSTimeouts(t *testing.T) {
	vm.Require(t)
	ctx := vmCtx(t)
	n, _ := vmActNode(t, "10.0.3.2")
	a := newIPVSAction(t, "SetIPVSTimeouts", n, nil)
	f := finding.Finding{Detector: "IPVSUDPTimeoutHigh", Target: "ipvs/timeouts"}
	res, err := a.Execute(ctx, f)
	if err != nil {
		t.Fatal(err)
	}
	if out := vm.Sh(t, "ipvsadm", "-L", "--timeout"); !strings.Contains(out, "900 120 30") {
		t.Fatalf("kernel: %s", out)
	}
	if res.Details["previousUDPSeconds"] != 300 || res.Details["udpSeconds"] != 30 {
		t.Errorf("details %v", res.Details)
	}
	_, err = a.Execute(ctx, f)
	wantSkip(t, err, "already within bounds")
	vm.Sh(t, strings.Fields(res.Details["restoreCommand"].(string))...)
	if out := vm.Sh(t, "ipvsadm", "-L", "--timeout"); !strings.Contains(out, "900 120 300") {
		t.Fatalf("after restoreCommand: %s", out)
	}
	// Never raises: with the kernel at 10s, udpTimeout 30s is a refusal.
	vm.Sh(t, "ipvsadm", "--set", "0", "0", "10")
	_, err = a.Execute(ctx, f)
	wantSkip(t, err, "already within bounds")
	if out := vm.Sh(t, "ipvsadm", "-L", "--timeout"); !strings.Contains(out, "900 120 10") {
		t.Fatalf("raised: %s", out)
	}
}
