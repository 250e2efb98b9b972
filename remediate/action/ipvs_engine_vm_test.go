//go:build linux

package action_test

import (
	"context"
	"fmt"
	"net/netip"
	"strings"
	"testing"
	"time"

	clocktesting "k8s.io/utils/clock/testing"

	"github.com/remediate-dev/remediate/internal/cluster"
	"github.com/remediate-dev/remediate/internal/cluster/clustertest"
	"github.com/remediate-dev/remediate/internal/ipvs"
	"github.com/remediate-dev/remediate/internal/node"
	"github.com/remediate-dev/remediate/internal/testing/vm"
	"github.com/remediate-dev/remediate/policy"
	"github.com/remediate-dev/remediate/remediate"
	"github.com/remediate-dev/remediate/remediate/journal"
)

const affinityPolicy = `apiVersion: remediate.dev/v1alpha1
kind: RemediationPolicy
mode: %s
rules:
- name: ipvs-udp-dead-backend
  detector: {type: IPVSUDPDeadBackend}
  action: {type: ClearIPVSUDPAffinity}
`

// TestVMUDPAffinityThroughTheEngine: the examples' rule through the real
// engine on the real kernel. A UDP client pinned to a backend that died
// and left the endpoints: audit mode changes nothing and journals the
// dry run; enforce mode journals intent and outcome (with the previous
// sysctl value and restore commands), and the same client socket's next
// queries reach the live backend.
func TestVMUDPAffinityThroughTheEngine(t *testing.T) {
	vm.Require(t)
	lab := vm.SharedLab(t)
	client := lab.Hosts["client"]
	servers := map[string]*vm.Server{}
	for _, b := range []string{"b1", "b2"} {
		servers[b] = vm.Serve(t, lab.Hosts[b], 5353)
	}
	vip := netip.AddrPortFrom(vm.VIPDNS, 53)
	vm.IPVSService(t, "UDP", vip, netip.AddrPortFrom(lab.Hosts["b1"].V4, 5353), netip.AddrPortFrom(lab.Hosts["b2"].V4, 5353))
	u := vm.NewUDPClient(t, client, vm.ClientPort(), vip)
	dead, err := u.Query(2 * time.Second)
	if err != nil || (dead != "b1" && dead != "b2") {
		t.Fatalf("first query: %q, %v", dead, err)
	}
	live := map[string]string{"b1": "b2", "b2": "b1"}[dead]
	servers[dead].Stop()

	view := clustertest.New(time.Now())
	view.SetService(cluster.Service{Namespace: "default", Name: "kubernetes", ClusterIPs: []string{"10.96.0.1"},
		Ports: []cluster.ServicePort{{Name: "https", Protocol: "TCP", Port: 443}}},
		cluster.Endpoint{Address: "10.0.9.9", Port: 6443, Protocol: "TCP", PortName: "https", Ready: true, Serving: true})
	view.SetService(cluster.Service{Namespace: "kube-system", Name: "kube-dns", ClusterIPs: []string{vm.VIPDNS.String()},
		Ports: []cluster.ServicePort{{Name: "dns", Protocol: "UDP", Port: 53}}},
		cluster.Endpoint{Address: lab.Hosts[live].V4.String(), Port: 5353, Protocol: "UDP", PortName: "dns", Ready: true, Serving: true})
	real := ipvs.New(ipvs.Options{ProcRoot: "/proc"})
	t.Cleanup(func() { _ = real.Close(context.Background()) })
	deadRS := netip.AddrPortFrom(lab.Hosts[dead].V4, 5353).String()
	target := "ipvs-conn/UDP/" + deadRS

	for _, mode := range []string{"audit", "enforce"} {
		p, err := policy.Parse("affinity.yaml", []byte(fmt.Sprintf(affinityPolicy, mode)), remediate.Catalog{})
		if err != nil {
			t.Fatal(err)
		}
		clk := clocktesting.NewFakeClock(time.Now())
		dir := t.TempDir()
		j, err := journal.Open(dir, 0, 0)
		if err != nil {
			t.Fatal(err)
		}
		e, err := remediate.New(p, remediate.Options{
			Node:     &node.Node{Name: "vm", ProcRoot: "/proc", Clock: clk, IPVS: real, Cluster: view},
			StateDir: dir, Journal: j, Clock: clk, Once: true, LockTimeout: time.Second,
		})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		rep, err := e.Cycle(ctx)
		cancel()
		if err != nil {
			t.Fatal(err)
		}
		e.Close(context.Background())
		want := remediate.OutcomeDryRun
		if mode == "enforce" {
			want = remediate.OutcomeExecuted
		}
		if len(rep.Decisions) != 1 || rep.Decisions[0].Target != target || rep.Decisions[0].Outcome != want {
			t.Fatalf("%s: decisions %+v, want %s on %s; findings %+v", mode, rep.Decisions, want, target, rep.Findings)
		}
		recs, err := journal.ReadAll(dir)
		if err != nil {
			t.Fatal(err)
		}
		var kinds []string
		for _, r := range recs {
			kinds = append(kinds, r.Kind)
			if r.Kind == journal.KindOutcome && (r.Details["previousExpireNodestConn"] != "0" || r.Details["restoreCommands"] == nil) {
				t.Errorf("outcome record lacks the undo: %+v", r)
			}
		}
		t.Logf("%s: %s; journal %v", mode, rep.Decisions[0].Reason, kinds)
		nodest := vm.ReadSysctl(t, "net/ipv4/vs/expire_nodest_conn")
		hasRS := strings.Contains(vm.Sh(t, "ipvsadm", "-Ln"), deadRS)
		switch mode {
		case "audit":
			if strings.Join(kinds, ",") != journal.KindDryRun || nodest != "0" || !hasRS {
				t.Fatalf("audit: journal %v, expire_nodest_conn %s, real server present %v", kinds, nodest, hasRS)
			}
			if got, _ := u.Query(300 * time.Millisecond); got != "" {
				t.Fatalf("audit: the pinned client got an answer from %q", got)
			}
		case "enforce":
			if strings.Join(kinds, ",") != journal.KindIntent+","+journal.KindOutcome || nodest != "1" || hasRS {
				t.Fatalf("enforce: journal %v, expire_nodest_conn %s, real server present %v", kinds, nodest, hasRS)
			}
			var got []string
			for i := 0; i < 3; i++ {
				a, err := u.Query(300 * time.Millisecond)
				if err != nil {
					t.Fatal(err)
				}
				got = append(got, a)
			}
			if got[1] != live || got[2] != live || (got[0] != live && got[0] != "") {
				t.Fatalf("enforce: the client's next answers %q, want %s", got, live)
			}
		}
	}
}
