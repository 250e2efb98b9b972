package detect

import (
	"context"
	"os"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/remediate-dev/remediate/internal/cluster"
	"github.com/remediate-dev/remediate/internal/cluster/clustertest"
	"github.com/remediate-dev/remediate/internal/finding"
	"github.com/remediate-dev/remediate/internal/iptables"
	"github.com/remediate-dev/remediate/internal/ipvs"
	"github.com/remediate-dev/remediate/internal/kubeproxy"
	"github.com/remediate-dev/remediate/internal/nftables"
	"github.com/remediate-dev/remediate/internal/node"
)

// ipvsModeSave() sketches kube-proxy v1.34's own iptables rules in IPVS mode
// (the chains of pkg/proxy/ipvs/proxier.go iptablesChains and jumps) with
// the canaries and the kubelet's chains a node also has, legacy backend.
// Its KUBE-IPVS-FILTER REJECT is IPVS mode's own. The real one, without
// the kubelet's chains, is testdata/iptables-save-ipvs-mode.txt.
var ipvsModeSave = testdataOnce("../internal/iptables/testdata/ipvs-mode-sketch.txt")

// iptablesModeRejects is what iptables mode leaves in the filter table
// for a Service without endpoints (kubernetes/kubernetes#102314).
const iptablesModeRejects = `*filter
:INPUT ACCEPT [0:0]
:FORWARD ACCEPT [0:0]
:OUTPUT ACCEPT [0:0]
:KUBE-EXTERNAL-SERVICES - [0:0]
:KUBE-SERVICES - [0:0]
-A INPUT -m conntrack --ctstate NEW -m comment --comment "kubernetes externally-visible service portals" -j KUBE-EXTERNAL-SERVICES
-A FORWARD -m conntrack --ctstate NEW -m comment --comment "kubernetes service portals" -j KUBE-SERVICES
-A OUTPUT -m conntrack --ctstate NEW -m comment --comment "kubernetes service portals" -j KUBE-SERVICES
-A KUBE-SERVICES -d 10.96.77.77/32 -p tcp -m comment --comment "ipvs-e2e/web:http has no endpoints" -m tcp --dport 80 -j REJECT --reject-with icmp-port-unreachable
COMMIT
`

// modeLeftoversNode is kube-proxy in mode with one iptables save (IPv4
// legacy; the other saves empty), no kube-proxy nftables table, IPVS
// holding vss and kube-ipvs0 in /proc/net/dev when kubeIPVS0.
func modeLeftoversNode(t *testing.T, mode kubeproxy.Mode, save string, kubeIPVS0 bool, vss ...ipvs.VirtualServer) (*node.Node, *ipvs.Fake) {
	t.Helper()
	kp := kubeproxy.NewFake(nil, 10*time.Second)
	kp.SetMode(mode, nil)
	ipt := iptables.NewFake()
	for _, f := range []iptables.Family{iptables.IPv4, iptables.IPv6} {
		for _, b := range []iptables.Backend{iptables.Legacy, iptables.NFT} {
			ipt.SetRules(f, b, "")
		}
	}
	ipt.SetRules(iptables.IPv4, iptables.Legacy, save)
	fk := ipvs.NewFake()
	for _, vs := range vss {
		if err := fk.AddVirtualServer(vs); err != nil {
			t.Fatal(err)
		}
	}
	view := clustertest.New(ipvsT0)
	view.SetService(cluster.Service{Namespace: "default", Name: "kubernetes", ClusterIPs: []string{"10.96.0.1"},
		Ports: []cluster.ServicePort{{Name: "https", Protocol: "TCP", Port: 443}}})
	view.SetService(cluster.Service{Namespace: "web", Name: "lb", ClusterIPs: []string{"10.96.0.50"}, ExternalIPs: []string{"203.0.113.9"},
		Ports: []cluster.ServicePort{{Name: "http", Protocol: "TCP", Port: 80}}})
	return &node.Node{Name: "node1", Clock: clocktesting.NewFakeClock(ipvsT0), Log: zap.NewNop(), ProcRoot: ipvsProcRoot(t, kubeIPVS0),
		KubeProxy: kp, IPTables: ipt, IPVS: fk, NFTables: nftables.NewFake(), Cluster: view}, fk
}

func TestKubeProxyModeLeftoversIPVS(t *testing.T) {
	ctx := context.Background()
	t.Run("IPVS mode, its own rules only", func(t *testing.T) {
		n, _ := modeLeftoversNode(t, kubeproxy.ModeIPVS, ipvsModeSave(), true, tVS("TCP", "10.96.0.1", 443))
		fs, err := newDetector(t, "KubeProxyModeLeftovers", n, nil).Detect(ctx)
		wantTargets(t, "clean IPVS mode", fs, err)
	})
	t.Run("IPVS mode, iptables mode's REJECT hooked", func(t *testing.T) {
		// the rejects' filter table beside IPVS mode's nat table
		nat := ipvsModeSave()[strings.Index(ipvsModeSave(), "*nat"):]
		n, _ := modeLeftoversNode(t, kubeproxy.ModeIPVS, iptablesModeRejects+nat, true)
		fs, err := newDetector(t, "KubeProxyModeLeftovers", n, nil).Detect(ctx)
		wantTargets(t, "rejects", fs, err, "iptables/IPv4/legacy/iptables-mode-leftovers")
		f := fs[0]
		if f.Severity != finding.Critical || !strings.Contains(f.Message, "kubernetes/kubernetes#102314") || f.Evidence["rejects"] != 1 {
			t.Fatalf("finding %+v", f)
		}
	})
	t.Run("IPVS mode, iptables mode's chains", func(t *testing.T) {
		legacy, err := os.ReadFile("testdata/iptables-save-legacy.txt")
		if err != nil {
			t.Fatal(err)
		}
		n, _ := modeLeftoversNode(t, kubeproxy.ModeIPVS, string(legacy), true)
		fs, err := newDetector(t, "KubeProxyModeLeftovers", n, nil).Detect(ctx)
		wantTargets(t, "chains", fs, err, "iptables/IPv4/legacy/iptables-mode-leftovers")
		if fs[0].Severity != finding.Warning {
			t.Fatalf("finding %+v", fs[0])
		}
	})
	for _, mode := range []kubeproxy.Mode{kubeproxy.ModeIPTables, kubeproxy.ModeNFTables} {
		t.Run(string(mode)+" mode, IPVS virtual servers left", func(t *testing.T) {
			n, _ := modeLeftoversNode(t, mode, "", true,
				tVS("TCP", "10.96.0.1", 443),   // a ClusterIP (in 10.96.0.0/12)
				tVS("TCP", "203.0.113.9", 80),  // a Service's external IP (the view)
				tVS("TCP", "192.168.50.5", 80), // keepalived's: not kube-proxy's
				ipvs.VirtualServer{FWMark: 7})  // a firewall mark: not kube-proxy's
			fs, err := newDetector(t, "KubeProxyModeLeftovers", n, nil).Detect(ctx)
			wantTargets(t, "ipvs leftovers", fs, err, "ipvs/kube-proxy-leftovers")
			ev := fs[0].Evidence
			if ev["virtualServers"] != 2 || ev["otherVirtualServers"] != 2 || ev["kubeIPVS0"] != true ||
				strings.Join(ev["shown"].([]string), ",") != "TCP/10.96.0.1:443,TCP/203.0.113.9:80" {
				t.Fatalf("evidence %v", ev)
			}
		})
		t.Run(string(mode)+" mode, IPVS leftovers without iptables or nft to read", func(t *testing.T) {
			n, _ := modeLeftoversNode(t, mode, "", true, tVS("TCP", "10.96.0.1", 443))
			n.IPTables, n.NFTables = nil, nil
			fs, err := newDetector(t, "KubeProxyModeLeftovers", n, nil).Detect(ctx)
			wantTargets(t, "ipvs leftovers alone", fs, err, "ipvs/kube-proxy-leftovers")
		})
		t.Run(string(mode)+" mode, only kube-ipvs0 left", func(t *testing.T) {
			n, _ := modeLeftoversNode(t, mode, "", true, tVS("TCP", "192.168.50.5", 80))
			fs, err := newDetector(t, "KubeProxyModeLeftovers", n, nil).Detect(ctx)
			wantTargets(t, "kube-ipvs0", fs, err, "ipvs/kube-proxy-leftovers")
		})
		t.Run(string(mode)+" mode, IPVS clean", func(t *testing.T) {
			n, fk := modeLeftoversNode(t, mode, "", false, tVS("TCP", "192.168.50.5", 80))
			fs, err := newDetector(t, "KubeProxyModeLeftovers", n, nil).Detect(ctx)
			wantTargets(t, "clean", fs, err)
			fk.SetUnavailable("no ip_vs module")
			fs, err = newDetector(t, "KubeProxyModeLeftovers", n, nil).Detect(ctx)
			wantTargets(t, "no ip_vs", fs, err)
		})
	}
}
