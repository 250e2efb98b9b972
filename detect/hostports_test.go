package detect

import (
	"context"
	"strings"
	"testing"
	"time"

	clocktesting "k8s.io/utils/clock/testing"

	"github.com/remediate-dev/remediate/internal/cluster"
	"github.com/remediate-dev/remediate/internal/cluster/clustertest"
	"github.com/remediate-dev/remediate/internal/finding"
	"github.com/remediate-dev/remediate/internal/iptables"
	"github.com/remediate-dev/remediate/internal/nftables"
	"github.com/remediate-dev/remediate/internal/node"
	"github.com/remediate-dev/remediate/internal/portmap"
)

// portmapSave() is the nat table as portmap 1.x leaves it for one pod
// (10.244.0.5) mapping hostPort 8080/tcp to 80 and 5353/udp to 53 on
// hostIP 192.0.2.10, beside kube-proxy's chains.
var portmapSave = testdataOnce("../internal/portmap/testdata/save.txt")

// flushedSave() is the same nat table after a flush and kube-proxy's
// resync: kube-proxy's chains are back, portmap's are not.
var flushedSave = testdataOnce("../internal/portmap/testdata/flushed-save.txt")

// portmapNFT() is portmap's nftables backend table for the same pod.
var portmapNFT = testdataOnce("../internal/portmap/testdata/nft.json")

func hostPortPod(name string, ips ...string) cluster.Pod {
	p := running(name)
	p.ControllerKind, p.ControllerName = "ReplicaSet", name+"-rs"
	p.IPs = ips
	p.HostPorts = []cluster.HostPort{{Container: "web", HostPort: 8080, ContainerPort: 80, Protocol: "TCP"},
		{Container: "dns", HostPort: 5353, ContainerPort: 53, Protocol: "UDP", HostIP: "192.0.2.10"}}
	return p
}

func TestClassifyHostPorts(t *testing.T) {
	rs, _ := iptables.ParseString(portmapSave())
	all, _ := portmap.FromIPTables(rs, iptables.IPv4, "iptables-legacy")
	now := podsT0
	pod := hostPortPod("web-1", "10.244.0.5")
	cases := []struct {
		name    string
		pods    []cluster.Pod
		rules   HostPortRules
		missing []string
		checked int
	}{
		{name: "both present", pods: []cluster.Pod{pod}, rules: HostPortRules{DNATs: all}, checked: 2},
		{name: "flushed", pods: []cluster.Pod{pod}, checked: 2,
			missing: []string{"IPv4 8080/TCP -> 10.244.0.5:80", "192.0.2.10:IPv4 5353/UDP -> 10.244.0.5:53"}},
		{name: "one gone", pods: []cluster.Pod{pod}, rules: HostPortRules{DNATs: all[1:]}, checked: 2,
			missing: []string{"IPv4 8080/TCP -> 10.244.0.5:80"}},
		{name: "DNAT to another pod (a recycled IP)", pods: []cluster.Pod{hostPortPod("web-2", "10.244.0.6")}, rules: HostPortRules{DNATs: all}, checked: 2,
			missing: []string{"IPv4 8080/TCP -> 10.244.0.6:80", "192.0.2.10:IPv4 5353/UDP -> 10.244.0.6:53"}},
		{name: "family unknown", pods: []cluster.Pod{pod}, rules: HostPortRules{Unknown: map[iptables.Family]string{iptables.IPv4: "timeout"}}},
		{name: "dual-stack: v6 missing, hostIP only v4", pods: []cluster.Pod{hostPortPod("web-3", "10.244.0.5", "fd00::5")}, rules: HostPortRules{DNATs: all}, checked: 3,
			missing: []string{"IPv6 8080/TCP -> fd00::5:80"}},
	}
	young := pod
	young.SandboxReady.Since = now.Add(-10 * time.Second)
	hostNet := pod
	hostNet.HostNetwork = true
	term := pod
	term.Terminating = true
	pending := pod
	pending.Phase = "Pending"
	noIP := pod
	noIP.IPs = nil
	for _, p := range []cluster.Pod{young, hostNet, term, pending, noIP} {
		cases = append(cases, struct {
			name    string
			pods    []cluster.Pod
			rules   HostPortRules
			missing []string
			checked int
		}{name: "not judged", pods: []cluster.Pod{p}})
	}
	for _, c := range cases {
		missing, checked := ClassifyHostPorts(c.pods, c.rules, now, time.Minute)
		var got []string
		for _, m := range missing {
			got = append(got, m.String())
		}
		if strings.Join(got, "|") != strings.Join(c.missing, "|") || checked != c.checked {
			t.Errorf("%s: missing %q checked %d, want %q checked %d", c.name, got, checked, c.missing, c.checked)
		}
	}
}

func TestHostPortsDetect(t *testing.T) {
	ctx := context.Background()
	clk := clocktesting.NewFakePassiveClock(podsT0)
	view := clustertest.NewPods(podsT0)
	bare := hostPortPod("bare", "10.244.0.7")
	bare.ControllerKind, bare.ControllerName = "", ""
	view.Set(hostPortPod("web-1", "10.244.0.5"), bare, running("plain"))
	ipt := iptables.NewFake()
	ipt.SetRules(iptables.IPv4, iptables.NFT, portmapSave())
	nft := nftables.NewFake()
	n := &node.Node{Name: "node1", Clock: clk, Pods: view, IPTables: ipt, NFTables: nft}
	d := newIssue3Detector(t, "HostPorts", n, nil)
	fs, err := d.Detect(ctx)
	if err != nil {
		t.Fatal(err)
	}
	// web-1 has its rules; the bare pod's IP has none.
	if len(fs) != 1 || fs[0].Target != "pod/app/bare" || !strings.Contains(fs[0].Message, "bare pod") {
		t.Fatalf("before flush: %+v", fs)
	}
	// The flush: portmap's chains gone from every backend; remembered.
	ipt.SetRules(iptables.IPv4, iptables.NFT, flushedSave())
	fs, err = d.Detect(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(fs) != 2 || fs[1].Target != "pod/app/web-1" || fs[1].Severity != finding.Critical ||
		!strings.Contains(fs[1].Message, "IPv4 8080/TCP -> 10.244.0.5:80") || !strings.Contains(fs[1].Message, "ReplicaSet web-1-rs") {
		t.Fatalf("after flush: %+v", fs)
	}
	if sp := fs[1].Subject.Pod; sp == nil || sp.UID != "uid-web-1" || fs[1].Subject.Kind != finding.KindPod {
		t.Errorf("subject %+v: the remedy needs the judged pod's UID", fs[1].Subject)
	}
	// portmap's nftables backend serves the same mappings.
	if err := nft.SetRuleset(portmapNFT()); err != nil {
		t.Fatal(err)
	}
	fs, _ = d.Detect(ctx)
	if len(fs) != 1 || fs[0].Target != "pod/app/bare" {
		t.Fatalf("nftables backend: %+v", fs)
	}
	// A node that never had portmap and whose CNI does not chain it: skip.
	ipt2 := iptables.NewFake()
	ipt2.SetRules(iptables.IPv4, iptables.NFT, flushedSave())
	n2 := &node.Node{Name: "node1", Clock: clk, Pods: view, IPTables: ipt2}
	d2 := newIssue3Detector(t, "HostPorts", n2, nil)
	if fs, err := d2.Detect(ctx); len(fs) != 0 || !isSkipErr(err) {
		t.Fatalf("no portmap: %+v %v", fs, err)
	}
	// A save that fails leaves its family unjudged.
	ipt.SetError(iptables.IPv4, iptables.Legacy, context.DeadlineExceeded)
	_ = nft.SetRuleset(`{"nftables":[]}`)
	if fs, err := d.Detect(ctx); err != nil || len(fs) != 0 {
		t.Fatalf("failed save: %+v %v", fs, err)
	}
}

func isSkipErr(err error) bool { _, ok := finding.IsSkip(err); return ok }
