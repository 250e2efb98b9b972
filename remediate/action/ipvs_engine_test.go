package action_test

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"testing"
	"time"

	clocktesting "k8s.io/utils/clock/testing"

	"github.com/remediate-dev/remediate/internal/cluster"
	"github.com/remediate-dev/remediate/internal/cluster/clustertest"
	"github.com/remediate-dev/remediate/internal/conntrack"
	"github.com/remediate-dev/remediate/internal/ipvs"
	"github.com/remediate-dev/remediate/internal/kubeproxy"
	"github.com/remediate-dev/remediate/internal/node"
	"github.com/remediate-dev/remediate/policy"
	"github.com/remediate-dev/remediate/remediate"
	"github.com/remediate-dev/remediate/remediate/journal"
)

const ipvsPolicy = `apiVersion: remediate.dev/v1alpha1
kind: RemediationPolicy
mode: %s
guardrails: {maxTargetsPerCycle: 10, maxActionsPerHour: 20}
rules:
- name: ipvs-stale-real-server
  detector: {type: IPVSStaleRealServer}
  action: {type: DeleteIPVSRealServer, maxPerCycle: 1, cycleWindow: 30s}
- name: ipvs-stale-virtual-server
  detector: {type: IPVSStaleVirtualServer, managedCIDRs: [10.96.0.0/12]}
  action: {type: DeleteIPVSVirtualServer, maxPerCycle: 1, managedCIDRs: [10.96.0.0/12]}
- name: ipvs-missing-virtual-server
  detector: {type: IPVSMissingVirtualServer}
- name: ipvs-udp-dead-backend
  detector: {type: IPVSUDPDeadBackend, minConnections: 1}
  action: {type: FlushConntrack, maxEntries: 1000}
- name: ipvs-udp-timeout
  detector: {type: IPVSUDPTimeoutHigh, ceiling: 60s}
  action: {type: SetIPVSTimeouts, udpTimeout: 30s}
`

// TestIPVSRulesThroughTheEngine loads IPVS rules through the policy loader
// and runs one --once cycle of the real engine over the CoreDNS rolling
// update (fake IPVS, fake view): in audit mode nothing changes; in enforce
// mode the stale real server, the stale virtual server and the UDP timeout
// are fixed, and FlushConntrack, paired with the dead-backend finding,
// removes exactly the dead pod's nf_conntrack entries.
func TestIPVSRulesThroughTheEngine(t *testing.T) {
	for _, mode := range []string{"audit", "enforce"} {
		t.Run(mode, func(t *testing.T) {
			p, err := policy.Parse("ipvs.yaml", []byte(fmt.Sprintf(ipvsPolicy, mode)), remediate.Catalog{})
			if err != nil {
				t.Fatal(err)
			}
			t0 := time.Date(2026, 11, 21, 12, 0, 0, 0, time.UTC)
			clk := clocktesting.NewFakeClock(t0)
			fk, view := ipvs.NewFake(), clustertest.New(t0)
			buildCoreDNS(t, fk, view)
			proc := t.TempDir()
			if err := os.MkdirAll(filepath.Join(proc, "net"), 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(proc, "net", "dev"), []byte("Inter-| Receive\n face |bytes\nkube-ipvs0: 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0\n"), 0o644); err != nil {
				t.Fatal(err)
			}
			// kube-proxy in IPVS mode: its /configz answers, with no
			// excludeCIDRs (DeleteIPVSVirtualServer refuses without it).
			kp := kubeproxy.NewFake(clk, 30*time.Second)
			kp.SetMode(kubeproxy.ModeIPVS, nil)
			kp.SetConfigz(&kubeproxy.Configz{SyncPeriod: 30 * time.Second, Mode: "ipvs"}, nil)
			dir := t.TempDir()
			j, err := journal.Open(dir, 0, 0)
			if err != nil {
				t.Fatal(err)
			}
			// nf_conntrack: one DNS flow answered by the dead pod, one by a
			// live one.
			ct := conntrack.NewFake(262144, 65536)
			ct.Flows = []conntrack.Flow{
				{Proto: 17, OrigSrc: netip.MustParseAddrPort("10.0.0.5:54177"), OrigDst: netip.MustParseAddrPort("10.96.0.10:53"),
					ReplySrc: netip.MustParseAddrPort("10.244.0.12:53"), ReplyDst: netip.MustParseAddrPort("10.0.0.5:54177")},
				{Proto: 17, OrigSrc: netip.MustParseAddrPort("10.0.0.6:40000"), OrigDst: netip.MustParseAddrPort("10.96.0.10:53"),
					ReplySrc: netip.MustParseAddrPort("10.244.1.21:53"), ReplyDst: netip.MustParseAddrPort("10.0.0.6:40000")},
			}
			e, err := remediate.New(p, remediate.Options{
				Node:     &node.Node{Name: "node1", ProcRoot: proc, Clock: clk, IPVS: fk, Cluster: view, Conntrack: ct, KubeProxy: kp},
				StateDir: dir, Journal: j, Clock: clk, Once: true, LockTimeout: time.Second,
			})
			if err != nil {
				t.Fatal(err)
			}
			rep, err := e.Cycle(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			byTarget := map[string]remediate.Decision{}
			for _, d := range rep.Decisions {
				byTarget[d.Target] = d
				t.Logf("decision %s %s: %s (%s)", d.Rule, d.Target, d.Outcome, d.Reason)
			}
			found := map[string]bool{}
			for _, f := range rep.Findings {
				found[f.Target] = true
				if f.Target == "ipvs-conn/UDP/10.244.0.12:53" {
					if f.Evidence["backendIP"] != "10.244.0.12" || f.Evidence["backendPort"] != 53 || f.Evidence["protocol"] != "UDP" {
						t.Errorf("dead-backend evidence = %v", f.Evidence)
					}
				}
			}
			for _, want := range []string{"ipvs-rs/UDP/10.96.0.10:53/10.244.0.12:53", "ipvs-vs/TCP/10.96.5.5:80",
				"ipvs-conn/UDP/10.244.0.12:53", "ipvs/timeouts"} {
				if !found[want] {
					t.Errorf("no finding for %s; findings %v", want, rep.Findings)
				}
			}
			wantOutcome := remediate.OutcomeDryRun
			if mode == "enforce" {
				wantOutcome = remediate.OutcomeExecuted
			}
			for _, target := range []string{"ipvs-rs/UDP/10.96.0.10:53/10.244.0.12:53", "ipvs-vs/TCP/10.96.5.5:80", "ipvs/timeouts", "ipvs-conn/UDP/10.244.0.12:53"} {
				if d := byTarget[target]; d.Outcome != wantOutcome {
					t.Errorf("%s: outcome %s (%s), want %s", target, d.Outcome, d.Reason, wantOutcome)
				}
			}
			ctx := context.Background()
			tmo, _ := fk.Timeouts(ctx)
			vss, _ := fk.VirtualServers(ctx)
			rss, _ := fk.RealServers(ctx, ipvs.VirtualServer{Address: netip.MustParseAddr("10.96.0.10"), Protocol: ipvs.UDP, Port: 53})
			changed := tmo.UDP != 300*time.Second || len(vss) != 3 || len(rss) != 2
			var flows []conntrack.Flow
			ct.Do(func(f *conntrack.Fake) { flows = append(flows, f.Flows...) })
			if mode == "audit" && len(flows) != 2 {
				t.Errorf("audit mode flushed conntrack: %v", flows)
			}
			if mode == "enforce" && (len(flows) != 1 || flows[0].ReplySrc.Addr().String() != "10.244.1.21") {
				t.Errorf("enforce: conntrack left %v, want only the live backend's flow", flows)
			}
			if mode == "audit" && changed {
				t.Errorf("audit mode changed IPVS: timeouts %+v, %d virtual servers, %d real servers", tmo, len(vss), len(rss))
			}
			if mode == "enforce" && (tmo.UDP != 30*time.Second || len(vss) != 2 || len(rss) != 1) {
				t.Errorf("enforce: timeouts %+v, virtual servers %v, real servers %v", tmo, vss, rss)
			}
		})
	}
}

func buildCoreDNS(t *testing.T, fk *ipvs.Fake, view *clustertest.Fake) {
	t.Helper()
	view.SetService(cluster.Service{Namespace: "default", Name: "kubernetes", ClusterIPs: []string{"10.96.0.1"},
		Ports: []cluster.ServicePort{{Name: "https", Protocol: "TCP", Port: 443}}},
		cluster.Endpoint{Address: "10.200.0.1", Port: 6443, Protocol: "TCP", PortName: "https", Ready: true, Serving: true})
	apiVS := ipvs.VirtualServer{Address: netip.MustParseAddr("10.96.0.1"), Protocol: ipvs.TCP, Port: 443}
	if err := fk.AddVirtualServer(apiVS); err != nil {
		t.Fatal(err)
	}
	if err := fk.AddRealServer(apiVS, ipvs.RealServer{Address: netip.MustParseAddr("10.200.0.1"), Port: 6443, Weight: 1}); err != nil {
		t.Fatal(err)
	}
	view.SetService(cluster.Service{
		Namespace: "kube-system", Name: "kube-dns", ClusterIPs: []string{"10.96.0.10"},
		Ports: []cluster.ServicePort{{Name: "dns", Protocol: "UDP", Port: 53}},
	}, cluster.Endpoint{Address: "10.244.1.21", Port: 53, Protocol: "UDP", PortName: "dns", Ready: true, Serving: true})
	dns := ipvs.VirtualServer{Address: netip.MustParseAddr("10.96.0.10"), Protocol: ipvs.UDP, Port: 53}
	stale := ipvs.VirtualServer{Address: netip.MustParseAddr("10.96.5.5"), Protocol: ipvs.TCP, Port: 80}
	for _, err := range []error{
		fk.AddVirtualServer(dns),
		fk.AddRealServer(dns, ipvs.RealServer{Address: netip.MustParseAddr("10.244.0.12"), Port: 53, Weight: 1}),
		fk.AddRealServer(dns, ipvs.RealServer{Address: netip.MustParseAddr("10.244.1.21"), Port: 53, Weight: 1}),
		fk.AddVirtualServer(stale),
	} {
		if err != nil {
			t.Fatal(err)
		}
	}
	fk.AddConn(ipvs.Conn{Protocol: ipvs.UDP, Client: netip.MustParseAddrPort("10.0.0.5:54177"),
		Virtual: netip.MustParseAddrPort("10.96.0.10:53"), Dest: netip.MustParseAddrPort("10.244.0.12:53"), State: "UDP", Expires: 297 * time.Second})
}
