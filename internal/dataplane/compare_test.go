package dataplane

import (
	"fmt"
	"net/netip"
	"testing"
	"time"

	"github.com/remediate-dev/remediate/internal/cluster"
	"github.com/remediate-dev/remediate/internal/cluster/clustertest"
	"github.com/remediate-dev/remediate/internal/iptables"
)

func diffLines(ds []Diff) []string {
	var out []string
	for _, d := range ds {
		out = append(out, fmt.Sprintf("%s %s %s want=%s got=%s missing=%v stale=%v", d.Port, d.Key, d.Problem, d.Want, d.Got, d.Missing, d.Stale))
	}
	return out
}

// The desired state of the synthetic save's cluster, then one change at a
// time.
func syntheticView() *clustertest.Fake {
	v := clustertest.New(time.Now())
	r := func(a string, port int32, name, proto, node string) cluster.Endpoint {
		return cluster.Endpoint{Address: a, Port: port, Protocol: proto, PortName: name, NodeName: node, Ready: true, Serving: true}
	}
	v.SetService(cluster.Service{Namespace: "ns1", Name: "a", ClusterIPs: []string{"10.0.0.1"}, Ports: []cluster.ServicePort{{Name: "web", Protocol: "TCP", Port: 80}}},
		r("10.244.1.1", 8080, "web", "TCP", "n1"), r("10.244.1.2", 8080, "web", "TCP", "n2"))
	v.SetService(cluster.Service{Namespace: "ns2", Name: "b", ClusterIPs: []string{"10.0.0.2"}, ExternalIPs: []string{"192.0.2.22"}, Type: "NodePort", ExternalPolicyLocal: true,
		Ports: []cluster.ServicePort{{Name: "web", Protocol: "TCP", Port: 80, NodePort: 30002}}},
		r("10.244.2.1", 80, "web", "TCP", "elsewhere"))
	v.SetService(cluster.Service{Namespace: "ns3", Name: "c", ClusterIPs: []string{"10.0.0.3"}, LoadBalancerIPs: []string{"198.51.100.3"}, Type: "LoadBalancer",
		Ports: []cluster.ServicePort{{Name: "dns", Protocol: "UDP", Port: 53, NodePort: 30003}}},
		r("10.244.3.1", 5353, "dns", "UDP", "n1"))
	v.SetService(cluster.Service{Namespace: "ns6", Name: "empty", ClusterIPs: []string{"10.0.0.6"}, Type: "NodePort",
		Ports: []cluster.ServicePort{{Name: "web", Protocol: "TCP", Port: 80, NodePort: 30006}}})
	v.SetService(cluster.Service{Namespace: "ns9", Name: "u", ClusterIPs: []string{"10.0.0.9"}, Ports: []cluster.ServicePort{{Protocol: "SCTP", Port: 9}}},
		r("10.244.9.1", 9, "", "SCTP", "n1"))
	return v
}

func TestCompare(t *testing.T) {
	rs, err := iptables.ParseString(syntheticSave)
	if err != nil {
		t.Fatal(err)
	}
	got := FromIPTables(rs, IPv4, "iptables-legacy")
	r := func(a string, port int32) cluster.Endpoint {
		return cluster.Endpoint{Address: a, Port: port, Protocol: "TCP", PortName: "web", Ready: true, Serving: true}
	}
	for _, tc := range []struct {
		name   string
		change func(v *clustertest.Fake)
		want   []string
	}{
		{"in sync", func(*clustertest.Fake) {}, nil},
		{"service created after the rules", func(v *clustertest.Fake) {
			v.SetService(cluster.Service{Namespace: "new", Name: "late", ClusterIPs: []string{"10.0.0.50"}, Ports: []cluster.ServicePort{{Name: "web", Protocol: "TCP", Port: 80}}}, r("10.244.50.1", 80))
		}, []string{"new/late:web TCP/10.0.0.50:80 missing-entry want=forward got= missing=[10.244.50.1:80] stale=[]"}},
		{"scaled up, new pod not programmed", func(v *clustertest.Fake) {
			v.SetEndpoints("ns1", "a", r("10.244.1.1", 8080), r("10.244.1.2", 8080), r("10.244.1.3", 8080))
		}, []string{"ns1/a:web TCP/10.0.0.1:80 missing-backends want=forward got=forward missing=[10.244.1.3:8080] stale=[]"}},
		{"pod gone, still programmed", func(v *clustertest.Fake) {
			v.SetEndpoints("ns1", "a", r("10.244.1.1", 8080))
		}, []string{"ns1/a:web TCP/10.0.0.1:80 stale-backends want=forward got=forward missing=[] stale=[10.244.1.2:8080]"}},
		{"scaled to zero, still forwarding", func(v *clustertest.Fake) {
			v.SetEndpoints("ns3", "c")
		}, []string{
			"ns3/c:dns UDP/nodePort:30003 stale-backends want=reject got=forward missing=[] stale=[10.244.3.1:5353]",
			"ns3/c:dns UDP/10.0.0.3:53 stale-backends want=reject got=forward missing=[] stale=[10.244.3.1:5353]",
			"ns3/c:dns UDP/198.51.100.3:53 stale-backends want=reject got=forward missing=[] stale=[10.244.3.1:5353]",
		}},
		{"endpoints appeared, still rejecting", func(v *clustertest.Fake) {
			v.SetEndpoints("ns6", "empty", r("10.244.6.1", 80))
		}, []string{
			"ns6/empty:web TCP/nodePort:30006 wrong-verdict want=forward got=reject missing=[] stale=[]",
			"ns6/empty:web TCP/10.0.0.6:80 wrong-verdict want=forward got=reject missing=[] stale=[]",
		}},
		{"service deleted, still programmed", func(v *clustertest.Fake) {
			v.DeleteService("ns9", "u")
		}, []string{"ns9/u SCTP/10.0.0.9:9 stale-entry want= got=forward missing=[] stale=[10.244.9.1:9]"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			v := syntheticView()
			tc.change(v)
			equalLines(t, diffLines(Compare(got, Desire(v, IPv4, "n1"), false)), tc.want)
		})
	}
}

func TestCompareSubsetAndNoVerdicts(t *testing.T) {
	a, b := mustAP("10.1.0.1:80"), mustAP("10.1.0.2:80")
	k := EntryKey{Addr: mustAP("10.0.0.1:80").Addr(), Protocol: "TCP", Port: 80}
	n := PortName{"ns", "s", "p"}
	want := &Desired{Family: IPv4, Ports: map[PortName]*DesiredPort{n: {ServicePort: ServicePort{Name: n, Entries: []Entry{{Kind: ClusterIP, Key: k, Verdict: Forward, Backends: []netip.AddrPort{a, b}}}}, Subset: true}}}
	got := NewState(IPv4, "x")
	got.port(n, "TCP").add(Entry{Kind: ClusterIP, Key: k, Verdict: Forward, Backends: []netip.AddrPort{a}})
	if ds := Compare(got, want, false); len(ds) != 0 {
		t.Errorf("topology subset reported: %v", diffLines(ds))
	}
	want.Ports[n].Subset = false
	if ds := Compare(got, want, false); len(ds) != 1 || ds[0].Problem != MissingBackends {
		t.Errorf("missing backend not reported: %v", diffLines(ds))
	}
	// IPVS: no reject; an empty virtual server matches a desired reject.
	want.Ports[n].Entries[0] = Entry{Kind: ClusterIP, Key: k, Verdict: Reject}
	got.Ports[n].Entries[0] = Entry{Kind: ClusterIP, Key: k, Verdict: Forward}
	if ds := Compare(got, want, true); len(ds) != 0 {
		t.Errorf("ipvs empty vs reject: %v", diffLines(ds))
	}
	if ds := Compare(got, want, false); len(ds) != 1 || ds[0].Problem != WrongVerdict {
		t.Errorf("iptables forward-to-nobody vs reject: %v", diffLines(ds))
	}
}

func mustAP(s string) netip.AddrPort { return netip.MustParseAddrPort(s) }
