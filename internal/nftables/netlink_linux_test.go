//go:build linux

package nftables

import (
	"context"
	"errors"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	"github.com/remediate-dev/remediate/internal/netnstest"
	"github.com/remediate-dev/remediate/internal/testing/controlplane"
)

// nsPath is the file of a namespace made by netnstest.New.
func nsPath(ns string) string { return "/var/run/netns/" + ns }

// normalised is the documented difference between the two readers: the
// netlink listing has no nft version (NFTVersion is "") and does not count
// objects it does not model (Skipped is 0); nft 1.0.6's JSON leaves out
// table and chain comments and netdev chains' devices, which netlink has.
// Everything else must be equal.
func normalised(rs *Ruleset) *Ruleset {
	c := *rs
	c.NFTVersion, c.Skipped = "", 0
	c.Tables = nil
	for _, t := range rs.Tables {
		tc := *t
		tc.Comment = ""
		tc.Chains = nil
		for _, ch := range t.Chains {
			cc := *ch
			cc.Comment = ""
			if cc.Hook != nil {
				h := *cc.Hook
				h.Device = ""
				cc.Hook = &h
			}
			tc.Chains = append(tc.Chains, &cc)
		}
		c.Tables = append(c.Tables, &tc)
	}
	return &c
}

// equivalent lists the namespace both ways and fails on any difference.
func equivalent(t *testing.T, ns string) *Ruleset {
	t.Helper()
	want, err := ParseString(netnstest.Run(t, ns, "", "nft", "-j", "list", "ruleset"))
	if err != nil {
		t.Fatal(err)
	}
	got, _, err := listNetlink(context.Background(), nsPath(ns), time.Now().Add(30*time.Second), 0, "", "", nil)
	if err != nil {
		t.Fatal(err)
	}
	if d := cmp.Diff(normalised(want), normalised(got), cmpopts.IgnoreUnexported(Table{}, Set{})); d != "" {
		t.Errorf("netlink listing differs from nft -j (-nft +netlink):\n%s", d)
	}
	return got
}

// TestNetlinkEqualsJSONKubeProxy: kube-proxy v1.34.4's real table (the
// captured ruleset, both families) read over netlink is the Ruleset nft -j
// gives, and so is its ParseKubeProxy model.
func TestNetlinkEqualsJSONKubeProxy(t *testing.T) {
	netnstest.NeedRoot(t, "loads a table into a network namespace")
	netnstest.NeedCommands(t, "ip", "nft")
	ns := netnstest.New(t)
	text, err := os.ReadFile("testdata/kube-proxy-v1.34.4-ruleset.nft")
	if err != nil {
		t.Fatal(err)
	}
	netnstest.Run(t, ns, string(text), "nft", "-f", "-")
	got := equivalent(t, ns)
	for _, f := range []Family{FamilyIP, FamilyIP6} {
		k, err := ParseKubeProxy(got.Table(f, KubeProxyTableName))
		if err != nil {
			t.Fatal(err)
		}
		want, _ := ParseKubeProxy(loadFixture(t).Table(f, KubeProxyTableName))
		if d := cmp.Diff(want, k); d != "" {
			t.Errorf("%s: kube-proxy model differs from the captured JSON's:\n%s", f, d)
		}
	}
}

// otherRulesets are rulesets other programs write next to kube-proxy's:
// CNI portmap's hostport table, a host firewall (inet, policy drop, ct
// state, interfaces, anonymous and interval sets, counters, logs,
// limits), Docker-style nat, a netdev ingress chain, and IPv6 variants.
const otherRulesets = `
table ip cni_hostport {
	comment "portmap"
	chain hostports { tcp dport 8080 dnat to 10.244.0.5:80 comment "0123abcd"; }
	chain hostip_hostports { ip daddr 192.0.2.10 udp dport 5353 dnat to 10.244.0.5:53 comment "0123abcd"; }
	chain prerouting { type nat hook prerouting priority dstnat - 1; policy accept; fib daddr type local jump hostports; jump hostip_hostports; }
}
table inet filter {
	set blocked { type ipv4_addr; flags interval; elements = { 192.0.2.0/24, 198.51.100.7, 203.0.113.10-203.0.113.20 }; }
	set ports { type inet_service; elements = { 22, 80, 443 }; }
	map marks { type mark : verdict; elements = { 0x1 : accept, 0x2 : drop }; }
	chain input {
		type filter hook input priority filter; policy drop;
		ct state established,related accept
		ct state invalid drop
		iifname "lo" accept
		ip saddr @blocked counter drop
		ip saddr != { 10.0.0.0/8, 172.16.0.0/12 } tcp dport 22 log prefix "ssh " drop
		tcp dport @ports accept
		udp dport { 53, 123 } accept
		ip6 nexthdr ipv6-icmp accept
		meta l4proto icmp limit rate 10/second accept
		meta mark vmap @marks
		tcp dport 1000-2000 reject
		ip6 saddr fe80::/64 accept
		meta mark & 0x0000ff00 == 0x00000100 accept
		ct mark set 0x00000005
		meta nfproto ipv4 return
	}
	chain forward { type filter hook forward priority 10; policy accept; oifname "docker0" ct state new goto docker; }
	chain docker { ip daddr 172.17.0.2 tcp dport 80 accept; drop; }
	chain output { type filter hook output priority -150; policy accept; }
}
table ip nat {
	chain POSTROUTING { type nat hook postrouting priority srcnat; policy accept; ip saddr 172.17.0.0/16 oifname != "docker0" masquerade; ip saddr 10.0.0.1 snat to 192.0.2.1; }
	chain PREROUTING { type nat hook prerouting priority dstnat; policy accept; tcp dport 8443 redirect to :443; }
}
table ip6 kube-proxy-like {
	map service-ips { type ipv6_addr . inet_proto . inet_service : verdict; elements = { fd00::1 . tcp . 443 : goto svc, fd00::a . udp . 53 : goto svc }; }
	chain svc { numgen random mod 3 vmap { 0 : goto ep, 1 : goto ep, 2 : goto ep }; }
	chain ep { ip6 saddr fd00:10::5 jump masq-mark; meta l4proto tcp dnat to [fd00:10::5]:8080; }
	chain masq-mark { meta mark set meta mark | 0x00004000; }
	chain services { ip6 daddr . meta l4proto . th dport vmap @service-ips; }
}
table netdev ingress-guard {
	chain in { type filter hook ingress device "lo" priority -500; policy accept; ether type arp accept; }
}
`

// TestNetlinkEqualsJSONOtherRulesets: rulesets of other programs read over
// netlink equal nft -j's parse, rules' Text and Matches included.
func TestNetlinkEqualsJSONOtherRulesets(t *testing.T) {
	netnstest.NeedRoot(t, "loads rules into a network namespace")
	netnstest.NeedCommands(t, "ip", "nft")
	ns := netnstest.New(t)
	netnstest.Run(t, ns, otherRulesets, "nft", "-f", "-")
	equivalent(t, ns)
}

// TestNetlinkAdapter: the adapter lists over netlink where the namespace is
// known (NetNS), without running nft: the same kube-proxy model as the
// capture, one table by ListTable, a missing table is ErrNoTable, more
// objects than MaxObjects is ErrTooLarge, a listing past its bound is
// ErrTimeout and the caller's cancellation is not; listings are kept
// while the nf_tables generation does not move; with a namespace netlink
// cannot enter, the auto reader falls back to nft.
func TestNetlinkAdapter(t *testing.T) {
	netnstest.NeedRoot(t, "loads a table into a network namespace")
	netnstest.NeedCommands(t, "ip", "nft")
	ns := netnstest.New(t)
	text, err := os.ReadFile("testdata/kube-proxy-v1.34.4-ruleset.nft")
	if err != nil {
		t.Fatal(err)
	}
	netnstest.Run(t, ns, string(text), "nft", "-f", "-")
	ctx := context.Background()
	// nft is a path that does not exist: any nft run would fail.
	cfg := Config{Prefix: netnstest.Prefix(ns), NetNS: nsPath(ns), Binary: "/nonexistent/nft", CacheTTL: -1}
	r := New(cfg)
	s, err := r.ListRuleset(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if s.Reader != ReaderNetlink || s.Bytes == 0 || s.Seq != 1 {
		t.Errorf("snapshot %+v", s)
	}
	want := loadFixture(t)
	for _, f := range []Family{FamilyIP, FamilyIP6} {
		got, _ := ParseKubeProxy(s.Ruleset.Table(f, KubeProxyTableName))
		exp, _ := ParseKubeProxy(want.Table(f, KubeProxyTableName))
		if d := cmp.Diff(exp, got); d != "" {
			t.Errorf("%s: %s", f, d)
		}
	}
	ts, err := r.ListTable(ctx, FamilyIP6, KubeProxyTableName)
	if err != nil || len(ts.Ruleset.Tables) != 1 || ts.Ruleset.Tables[0].Family != FamilyIP6 {
		t.Fatalf("ListTable: %+v %v", ts, err)
	}
	if d := cmp.Diff(s.Ruleset.Table(FamilyIP6, KubeProxyTableName), ts.Ruleset.Tables[0], cmpopts.IgnoreUnexported(Table{}, Set{})); d != "" {
		t.Errorf("ListTable differs from the ruleset's table: %s", d)
	}
	if _, err := r.ListTable(ctx, FamilyInet, "nope"); !errors.Is(err, ErrNoTable) {
		t.Errorf("missing table: %v, want ErrNoTable", err)
	}
	// Kept while the generation does not move; listed again after a change.
	again, err := r.ListTable(ctx, FamilyIP6, KubeProxyTableName)
	if err != nil || again.Seq != ts.Seq {
		t.Errorf("unchanged generation: seq %d, want %d (%v)", again.Seq, ts.Seq, err)
	}
	netnstest.Run(t, ns, "", "nft", "add chain ip6 kube-proxy extra")
	moved, err := r.ListTable(ctx, FamilyIP6, KubeProxyTableName)
	if err != nil || moved.Seq == ts.Seq || moved.Ruleset.Tables[0].Chain("extra") == nil {
		t.Errorf("after a change: %+v %v", moved, err)
	}

	small := cfg
	small.MaxObjects = 20
	if _, err := New(small).ListRuleset(ctx); !errors.Is(err, ErrTooLarge) {
		t.Errorf("over MaxObjects: %v, want ErrTooLarge", err)
	}
	short := cfg
	short.Timeout = time.Nanosecond
	if _, err := New(short).ListRuleset(ctx); !errors.Is(err, ErrTimeout) {
		t.Errorf("past the bound: %v, want ErrTimeout", err)
	}
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	if _, err := New(cfg).ListRuleset(cctx); !errors.Is(err, context.Canceled) || errors.Is(err, ErrTimeout) {
		t.Errorf("cancelled caller: %v, want context.Canceled", err)
	}
	// Netlink cannot enter the namespace: nft (through the prefix) lists.
	fb := Config{Prefix: netnstest.Prefix(ns), NetNS: "/nonexistent/netns", CacheTTL: -1, ReuseFor: -1}
	fs, err := New(fb).ListRuleset(ctx)
	if err != nil || fs.Reader != ReaderNFT || fs.Ruleset.Table(FamilyIP, KubeProxyTableName) == nil {
		t.Errorf("fallback: %+v %v", fs, err)
	}
	fb.Reader = ReaderNetlink
	if _, err := New(fb).ListRuleset(ctx); err == nil {
		t.Errorf("netlink only, namespace unreachable: no error")
	}
}

// TestNetlinkAnonymousSetsKept: the elements of kube-proxy's constant
// anonymous vmaps are read once and kept; a service chain whose vmap is
// replaced (kube-proxy's answer to an endpoint change: a new anonymous
// set, possibly under the freed name) is read anew, and the listing still
// equals nft -j's. Sets gone are dropped from the cache.
func TestNetlinkAnonymousSetsKept(t *testing.T) {
	netnstest.NeedRoot(t, "loads a table into a network namespace")
	netnstest.NeedCommands(t, "ip", "nft")
	ns := netnstest.New(t)
	text, err := os.ReadFile("testdata/kube-proxy-v1.34.4-ruleset.nft")
	if err != nil {
		t.Fatal(err)
	}
	netnstest.Run(t, ns, string(text), "nft", "-f", "-")
	ctx := context.Background()
	r := New(Config{NetNS: nsPath(ns), Prefix: netnstest.Prefix(ns), Reader: ReaderNetlink, CacheTTL: -1, ReuseFor: -1})
	compare := func(what string) *Ruleset {
		t.Helper()
		s, err := r.ListRuleset(ctx)
		if err != nil {
			t.Fatal(err)
		}
		want, err := ParseString(netnstest.Run(t, ns, "", "nft", "-j", "list", "ruleset"))
		if err != nil {
			t.Fatal(err)
		}
		if d := cmp.Diff(normalised(want), normalised(s.Ruleset), cmpopts.IgnoreUnexported(Table{}, Set{})); d != "" {
			t.Errorf("%s: netlink listing differs from nft -j (-nft +netlink):\n%s", what, d)
		}
		return s.Ruleset
	}
	compare("cold")
	if n := len(r.anon.m); n != 4 {
		t.Fatalf("%d anonymous sets kept, want 4 (the numgen vmaps)", n)
	}
	compare("warm")
	// An endpoint goes: the vmap is replaced by one with one element.
	const svc = "service-L5PNJ65X-nft-capture/web/tcp/http"
	netnstest.Run(t, ns, "", "nft", "flush chain ip kube-proxy "+svc+"; add rule ip kube-proxy "+svc+
		" numgen random mod 1 vmap { 0 : goto endpoint-J7EXKJKS-nft-capture/web/tcp/http__10.244.0.6/8080 }")
	rs := compare("after the vmap was replaced")
	k, _ := ParseKubeProxy(rs.Table(FamilyIP, KubeProxyTableName))
	if eps := k.Services[svc].Endpoints; len(eps) != 1 || eps[0] != "endpoint-J7EXKJKS-nft-capture/web/tcp/http__10.244.0.6/8080" {
		t.Errorf("endpoints after the change: %v", eps)
	}
	if n := len(r.anon.m); n != 4 {
		t.Errorf("%d anonymous sets kept after the change, want 4", n)
	}
	// A rule replaced in place keeps its handle: its new bytes are read.
	const ep = "endpoint-666WUJ4G-nft-capture/web/tcp/http__10.244.0.5/8080"
	h := rs.Table(FamilyIP, KubeProxyTableName).Chain(ep).Rules[1].Handle
	netnstest.Run(t, ns, "", "nft", fmt.Sprintf("replace rule ip kube-proxy %s handle %d meta l4proto tcp dnat to 10.244.0.9:8080", ep, h))
	rs = compare("after a rule was replaced in place")
	if n := rs.Table(FamilyIP, KubeProxyTableName).Chain(ep).Rules[1].NAT; n == nil || n.Addr != "10.244.0.9" {
		t.Errorf("replaced rule read as %+v", n)
	}
	// Tables gone: nothing of them is kept.
	netnstest.Run(t, ns, "", "nft", "flush ruleset")
	compare("after the ruleset was flushed")
	if len(r.anon.m) != 0 || len(r.anon.rules) != 0 {
		t.Errorf("kept after a flush: %d anonymous sets, %d rules", len(r.anon.m), len(r.anon.rules))
	}
}

// TestNetlinkEqualsJSONRealKubeProxy: the real kube-proxy (v1.34.4,
// nftables mode, REMEDIATE_CONTROLPLANE_BIN) programs its tables for a
// Service with two endpoints, one without and a NodePort Service in a
// test-made namespace; the netlink listing of that namespace equals nft
// -j's, and its kube-proxy model has the three Services.
func TestNetlinkEqualsJSONRealKubeProxy(t *testing.T) {
	if os.Getenv("REMEDIATE_CONTROLPLANE_BIN") == "" {
		t.Skip("REMEDIATE_CONTROLPLANE_BIN is not set: no kube-proxy to run")
	}
	netnstest.NeedRoot(t, "runs kube-proxy in a network namespace")
	netnstest.NeedCommands(t, "ip", "nft")
	cp := controlplane.Start(t, controlplane.Options{})
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	const kns = "nft-netlink"
	CreateKubeProxyFixtureObjects(ctx, t, cp, kns)
	cp.StartKubeProxy(controlplane.KubeProxyOptions{Mode: "nftables"})
	r := New(Config{NetNS: nsPath(cp.NetNS.Name), Prefix: netnstest.Prefix(cp.NetNS.Name), Reader: ReaderNetlink, CacheTTL: -1, ReuseFor: -1})
	deadline := time.Now().Add(90 * time.Second)
	for {
		s, err := r.ListTable(ctx, FamilyIP, KubeProxyTableName)
		if err == nil {
			k, _ := ParseKubeProxy(s.Ruleset.Table(FamilyIP, KubeProxyTableName))
			web := 0
			for _, p := range k.Programmed() {
				if p.Service.Namespace == kns && p.Service.Name == "web" {
					web += len(p.Backends)
				}
			}
			if web == 4 && len(k.NoEndpointServices) >= 1 && len(k.NodePorts) >= 1 {
				break
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("kube-proxy did not program the services within 90 s (last: %v)", err)
		}
		time.Sleep(time.Second)
	}
	// kube-proxy may still be syncing: compare at a quiet moment (the
	// same generation before and after both listings).
	for i := 0; ; i++ {
		g1, _ := generation(nsPath(cp.NetNS.Name))
		want, err := ParseString(netnstest.Run(t, cp.NetNS.Name, "", "nft", "-j", "list", "ruleset"))
		if err != nil {
			t.Fatal(err)
		}
		got, err := r.ListRuleset(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if g2, _ := generation(nsPath(cp.NetNS.Name)); g1 != g2 && i < 10 {
			time.Sleep(time.Second)
			continue
		}
		if d := cmp.Diff(normalised(want), normalised(got.Ruleset), cmpopts.IgnoreUnexported(Table{}, Set{})); d != "" {
			t.Errorf("netlink listing differs from nft -j (-nft +netlink):\n%s", d)
		}
		return
	}
}
