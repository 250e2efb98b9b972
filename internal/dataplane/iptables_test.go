package dataplane

import (
	"fmt"
	"net/netip"
	"os"
	"strings"
	"testing"

	"github.com/remediate-dev/remediate/internal/iptables"
)

// entries renders a state as sorted lines "port kind key verdict backends".
func entries(s *State) []string {
	var out []string
	for _, sp := range s.Ports {
		for _, e := range sp.Entries {
			var bs []string
			for _, b := range e.Backends {
				bs = append(bs, b.String())
			}
			out = append(out, fmt.Sprintf("%s %s %s %s [%s]", sp.Name, e.Kind, e.Key, e.Verdict, strings.Join(bs, " ")))
		}
	}
	sortStrings(out)
	return out
}

func sortStrings(s []string) {
	for i := 1; i < len(s); i++ {
		for j := i; j > 0 && s[j] < s[j-1]; j-- {
			s[j], s[j-1] = s[j-1], s[j]
		}
	}
}

func equalLines(t *testing.T, got, want []string) {
	t.Helper()
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Fatalf("got:\n  %s\nwant:\n  %s", strings.Join(got, "\n  "), strings.Join(want, "\n  "))
	}
}

// The real capture of kube-proxy v1.34.4 in iptables mode (legacy backend).
func TestFromIPTablesRealCapture(t *testing.T) {
	b, err := os.ReadFile("../iptables/testdata/iptables-save-legacy.txt")
	if err != nil {
		t.Fatal(err)
	}
	rs, err := iptables.ParseString(string(b))
	if err != nil {
		t.Fatal(err)
	}
	st := FromIPTables(rs, IPv4, "iptables-legacy")
	equalLines(t, entries(st), []string{
		"default/kubernetes:https ClusterIP TCP/10.96.0.1:443 forward [10.200.0.1:6443]",
		"default/web:dns ClusterIP UDP/10.96.91.18:53 forward [10.244.0.5:53 10.244.0.6:53]",
		"default/web:http ClusterIP TCP/10.96.91.18:80 forward [10.244.0.5:8080 10.244.0.6:8080]",
	})
	if len(st.Notes) != 0 {
		t.Errorf("notes: %v", st.Notes)
	}
}

// A rule set in kube-proxy's v1.34 iptables format covering external IPs,
// load balancers with source ranges, NodePorts (with the localhost
// variant), traffic policy Local without local endpoints, session
// affinity, a Service without endpoints and an unnamed port, IPv6.
const syntheticSave = `*filter
:KUBE-NODEPORTS - [0:0]
:KUBE-SERVICES - [0:0]
:KUBE-EXTERNAL-SERVICES - [0:0]
-A KUBE-NODEPORTS -m comment --comment "ns2/b:web health check node port" -m tcp -p tcp --dport 31000 -j ACCEPT
-A KUBE-SERVICES -d 10.0.0.6/32 -p tcp -m comment --comment "ns6/empty:web has no endpoints" -m tcp --dport 80 -j REJECT --reject-with icmp-port-unreachable
-A KUBE-EXTERNAL-SERVICES -d 192.0.2.22/32 -p tcp -m comment --comment "ns2/b:web has no local endpoints" -m tcp --dport 80 -j DROP
-A KUBE-EXTERNAL-SERVICES -p tcp -m comment --comment "ns2/b:web has no local endpoints" -m addrtype --dst-type LOCAL -m tcp --dport 30002 -j DROP
-A KUBE-EXTERNAL-SERVICES -p tcp -m comment --comment "ns6/empty:web has no endpoints" -m addrtype --dst-type LOCAL -m tcp --dport 30006 -j REJECT --reject-with icmp-port-unreachable
COMMIT
*nat
:PREROUTING ACCEPT [0:0]
:KUBE-NODEPORTS - [0:0]
:KUBE-SERVICES - [0:0]
:KUBE-MARK-MASQ - [0:0]
:KUBE-EXT-B - [0:0]
:KUBE-EXT-C - [0:0]
:KUBE-FW-C - [0:0]
:KUBE-SVC-A - [0:0]
:KUBE-SVC-B - [0:0]
:KUBE-SVC-C - [0:0]
:KUBE-SVC-U - [0:0]
:KUBE-SEP-A1 - [0:0]
:KUBE-SEP-A2 - [0:0]
:KUBE-SEP-B1 - [0:0]
:KUBE-SEP-C1 - [0:0]
:KUBE-SEP-U1 - [0:0]
-A PREROUTING -m comment --comment "kubernetes service portals" -j KUBE-SERVICES
-A KUBE-NODEPORTS -d 127.0.0.0/8 -p tcp -m comment --comment ns2/b:web -m tcp --dport 30002 -m nfacct --nfacct-name localhost_nps_accepted_pkts -j KUBE-EXT-B
-A KUBE-NODEPORTS -p tcp -m comment --comment ns2/b:web -m tcp --dport 30002 -j KUBE-EXT-B
-A KUBE-NODEPORTS -p udp -m comment --comment ns3/c:dns -m udp --dport 30003 -j KUBE-EXT-C
-A KUBE-SERVICES -d 10.0.0.1/32 -p tcp -m comment --comment "ns1/a:web cluster IP" -m tcp --dport 80 -j KUBE-SVC-A
-A KUBE-SERVICES -d 10.0.0.2/32 -p tcp -m comment --comment "ns2/b:web cluster IP" -m tcp --dport 80 -j KUBE-SVC-B
-A KUBE-SERVICES -d 192.0.2.22/32 -p tcp -m comment --comment "ns2/b:web external IP" -m tcp --dport 80 -j KUBE-EXT-B
-A KUBE-SERVICES -d 10.0.0.3/32 -p udp -m comment --comment "ns3/c:dns cluster IP" -m udp --dport 53 -j KUBE-SVC-C
-A KUBE-SERVICES -d 198.51.100.3/32 -p udp -m comment --comment "ns3/c:dns loadbalancer IP" -m udp --dport 53 -j KUBE-FW-C
-A KUBE-SERVICES -d 10.0.0.9/32 -p sctp -m comment --comment "ns9/u cluster IP" -m sctp --dport 9 -j KUBE-SVC-U
-A KUBE-SERVICES -m comment --comment "kubernetes service nodeports; NOTE: this must be the last rule in this chain" -m addrtype --dst-type LOCAL -j KUBE-NODEPORTS
-A KUBE-EXT-B -s 10.244.0.0/16 -m comment --comment "pod traffic for ns2/b:web external destinations" -j KUBE-SVC-B
-A KUBE-EXT-B -m comment --comment "masquerade LOCAL traffic for ns2/b:web external destinations" -m addrtype --src-type LOCAL -j KUBE-MARK-MASQ
-A KUBE-EXT-B -m comment --comment "route LOCAL traffic for ns2/b:web external destinations" -m addrtype --src-type LOCAL -j KUBE-SVC-B
-A KUBE-EXT-C -m comment --comment "masquerade traffic for ns3/c:dns external destinations" -j KUBE-MARK-MASQ
-A KUBE-EXT-C -j KUBE-SVC-C
-A KUBE-FW-C -s 203.0.113.0/25 -m comment --comment "ns3/c:dns loadbalancer IP" -j KUBE-EXT-C
-A KUBE-FW-C -m comment --comment "other traffic to ns3/c:dns will be dropped by KUBE-PROXY-FIREWALL"
-A KUBE-SEP-A1 -s 10.244.1.1/32 -m comment --comment ns1/a:web -j KUBE-MARK-MASQ
-A KUBE-SEP-A1 -p tcp -m comment --comment ns1/a:web -m tcp -j DNAT --to-destination 10.244.1.1:8080
-A KUBE-SEP-A2 -s 10.244.1.2/32 -m comment --comment ns1/a:web -j KUBE-MARK-MASQ
-A KUBE-SEP-A2 -p tcp -m comment --comment ns1/a:web -m recent --set --name KUBE-SEP-A2 --mask 255.255.255.255 --rsource -m tcp -j DNAT --to-destination 10.244.1.2:8080
-A KUBE-SEP-B1 -p tcp -m comment --comment ns2/b:web -m tcp -j DNAT --to-destination 10.244.2.1:80
-A KUBE-SEP-C1 -p udp -m comment --comment ns3/c:dns -m udp -j DNAT --to-destination 10.244.3.1:5353
-A KUBE-SEP-U1 -p sctp -m comment --comment ns9/u -m sctp -j DNAT --to-destination 10.244.9.1:9
-A KUBE-SVC-A ! -s 10.244.0.0/16 -d 10.0.0.1/32 -p tcp -m comment --comment "ns1/a:web cluster IP" -m tcp --dport 80 -j KUBE-MARK-MASQ
-A KUBE-SVC-A -m comment --comment "ns1/a:web -> 10.244.1.2:8080" -m recent --rcheck --seconds 10800 --reap --name KUBE-SEP-A2 --mask 255.255.255.255 --rsource -j KUBE-SEP-A2
-A KUBE-SVC-A -m comment --comment "ns1/a:web -> 10.244.1.1:8080" -m statistic --mode random --probability 0.50000000000 -j KUBE-SEP-A1
-A KUBE-SVC-A -m comment --comment "ns1/a:web -> 10.244.1.2:8080" -j KUBE-SEP-A2
-A KUBE-SVC-B -m comment --comment "ns2/b:web -> 10.244.2.1:80" -j KUBE-SEP-B1
-A KUBE-SVC-C -m comment --comment "ns3/c:dns -> 10.244.3.1:5353" -j KUBE-SEP-C1
-A KUBE-SVC-U -m comment --comment "ns9/u -> 10.244.9.1:9" -j KUBE-SEP-U1
COMMIT
`

func TestFromIPTablesSynthetic(t *testing.T) {
	rs, err := iptables.ParseString(syntheticSave)
	if err != nil {
		t.Fatal(err)
	}
	st := FromIPTables(rs, IPv4, "iptables-legacy")
	equalLines(t, entries(st), []string{
		"ns1/a:web ClusterIP TCP/10.0.0.1:80 forward [10.244.1.1:8080 10.244.1.2:8080]",
		"ns2/b:web ClusterIP TCP/10.0.0.2:80 forward [10.244.2.1:80]",
		"ns2/b:web ExternalIP TCP/192.0.2.22:80 drop []",
		"ns2/b:web NodePort TCP/nodePort:30002 drop []",
		"ns3/c:dns ClusterIP UDP/10.0.0.3:53 forward [10.244.3.1:5353]",
		"ns3/c:dns LoadBalancer UDP/198.51.100.3:53 forward [10.244.3.1:5353]",
		"ns3/c:dns NodePort UDP/nodePort:30003 forward [10.244.3.1:5353]",
		"ns6/empty:web ClusterIP TCP/10.0.0.6:80 reject []",
		"ns6/empty:web NodePort TCP/nodePort:30006 reject []",
		"ns9/u ClusterIP SCTP/10.0.0.9:9 forward [10.244.9.1:9]",
	})
}

func TestFromIPTablesIPv6AndEmpty(t *testing.T) {
	rs, err := iptables.ParseString(`*nat
:KUBE-SERVICES - [0:0]
:KUBE-SVC-X - [0:0]
:KUBE-SEP-X - [0:0]
-A KUBE-SERVICES -d fd00:10:96::a/128 -p tcp -m comment --comment "ns/x:p cluster IP" -m tcp --dport 443 -j KUBE-SVC-X
-A KUBE-SVC-X -m comment --comment "ns/x:p -> [fd00:10:244::5]:6443" -j KUBE-SEP-X
-A KUBE-SEP-X -p tcp -m comment --comment ns/x:p -m tcp -j DNAT --to-destination [fd00:10:244::5]:6443
COMMIT
`)
	if err != nil {
		t.Fatal(err)
	}
	equalLines(t, entries(FromIPTables(rs, IPv6, "iptables-legacy")), []string{
		"ns/x:p ClusterIP TCP/[fd00:10:96::a]:443 forward [[fd00:10:244::5]:6443]",
	})
	if st := FromIPTables(&iptables.Ruleset{}, IPv4, "x"); len(st.Ports) != 0 {
		t.Fatalf("empty ruleset gave %v", entries(st))
	}
	if st := FromIPTables(nil, IPv4, "x"); len(st.Ports) != 0 {
		t.Fatal("nil ruleset gave ports")
	}
}

func TestParsePortName(t *testing.T) {
	for s, want := range map[string]PortName{
		"ns/name:port": {"ns", "name", "port"},
		"ns/name":      {"ns", "name", ""},
	} {
		got, ok := ParsePortName(s)
		if !ok || got != want || got.String() != s {
			t.Errorf("%q: %+v %v", s, got, ok)
		}
	}
	for _, s := range []string{"", "kubernetes service portals", "/x", "ns/", "a:b/c", "ns/n:p:q"} {
		if _, ok := ParsePortName(s); ok {
			t.Errorf("%q parsed", s)
		}
	}
	_ = netip.Addr{}
}

func FuzzFromIPTables(f *testing.F) {
	f.Add(syntheticSave)
	f.Fuzz(func(t *testing.T, s string) {
		rs, err := iptables.ParseString(s)
		if err != nil {
			return
		}
		st := FromIPTables(rs, IPv4, "fuzz")
		for _, sp := range st.Ports {
			for _, e := range sp.Entries {
				if e.Verdict != Forward && len(e.Backends) > 0 {
					t.Fatalf("non-forward entry with backends: %+v", e)
				}
			}
		}
	})
}

// TestMemoKeepsOnlyTheLatestSave: each new save of a family (a new
// *Ruleset, every cycle under churn) takes the place of the one kept
// before: the memos hold no older save, programmed model or comparison
// alive (they kept the last 4: ~80 MB more heap at 5,000 Services under
// churn). The latest is still shared.
func TestMemoKeepsOnlyTheLatestSave(t *testing.T) {
	const source = "iptables-memo-test"
	want := &Desired{Family: IPv4, Ports: map[PortName]*DesiredPort{}}
	var saves []*iptables.Ruleset
	var states []*State
	for i := 0; i < 3; i++ {
		rs, err := iptables.ParseString(syntheticSave)
		if err != nil {
			t.Fatal(err)
		}
		saves = append(saves, rs)
		got := FromIPTablesCached(rs, IPv4, source)
		states = append(states, got)
		CompareCached(got, want, false)
	}
	programmedMemo.mu.Lock()
	for _, k := range programmedMemo.keys {
		if k.source == source && k.rs != saves[2] {
			t.Errorf("an older save is kept: %p (saves %p)", k.rs, saves)
		}
	}
	programmedMemo.mu.Unlock()
	compareMemo.mu.Lock()
	for _, k := range compareMemo.keys {
		if k.got != nil && k.got.Source == source && k.got != states[2] {
			t.Errorf("an older programmed model is kept in the comparisons")
		}
	}
	compareMemo.mu.Unlock()
	if FromIPTablesCached(saves[2], IPv4, source) != states[2] {
		t.Error("the latest save's model is not shared")
	}
	// Another family's save is not displaced by these.
	rs6, err := iptables.ParseString(syntheticSave)
	if err != nil {
		t.Fatal(err)
	}
	s6 := FromIPTablesCached(rs6, IPv6, source)
	if FromIPTablesCached(saves[2], IPv4, source) != states[2] || FromIPTablesCached(rs6, IPv6, source) != s6 {
		t.Error("one family's save displaced the other's")
	}
}
