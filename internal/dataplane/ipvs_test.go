package dataplane

import (
	"net/netip"
	"testing"
	"time"

	"github.com/remediate-dev/remediate/internal/cluster"
	"github.com/remediate-dev/remediate/internal/cluster/clustertest"
	"github.com/remediate-dev/remediate/internal/ipvs"
)

func TestFromIPVS(t *testing.T) {
	v := clustertest.New(time.Now())
	r := func(a string) cluster.Endpoint {
		return cluster.Endpoint{Address: a, Port: 8080, Protocol: "TCP", PortName: "web", NodeName: "n1", Ready: true, Serving: true}
	}
	v.SetService(cluster.Service{Namespace: "ns", Name: "a", ClusterIPs: []string{"10.0.0.1"}, Type: "NodePort",
		Ports: []cluster.ServicePort{{Name: "web", Protocol: "TCP", Port: 80, NodePort: 30080}}}, r("10.1.0.1"), r("10.1.0.2"))
	v.SetService(cluster.Service{Namespace: "ns", Name: "empty", ClusterIPs: []string{"10.0.0.2"},
		Ports: []cluster.ServicePort{{Name: "web", Protocol: "TCP", Port: 80}}})
	v.SetService(cluster.Service{Namespace: "ns", Name: "new", ClusterIPs: []string{"10.0.0.3"},
		Ports: []cluster.ServicePort{{Name: "web", Protocol: "TCP", Port: 80}}}, r("10.1.0.3"))
	want := Desire(v, IPv4, "n1")
	rs := func(a string, w int) ipvs.RealServer {
		ap := netip.MustParseAddrPort(a)
		return ipvs.RealServer{Address: ap.Addr(), Port: ap.Port(), Weight: w}
	}
	vs := func(a string) ipvs.VirtualServer {
		ap := netip.MustParseAddrPort(a)
		return ipvs.VirtualServer{Address: ap.Addr(), Protocol: "TCP", Port: ap.Port()}
	}
	got := FromIPVS([]IPVSService{
		// ClusterIP: one real server missing (a new pod never programmed),
		// a draining one (weight 0) ignored.
		{VS: vs("10.0.0.1:80"), Reals: []ipvs.RealServer{rs("10.1.0.1:8080", 1), rs("10.1.0.9:8080", 0)}},
		// NodePort on the node's address: complete.
		{VS: vs("192.168.1.10:30080"), Reals: []ipvs.RealServer{rs("10.1.0.1:8080", 1), rs("10.1.0.2:8080", 1)}},
		// No endpoints: a virtual server without real servers, as kube-proxy does.
		{VS: vs("10.0.0.2:80")},
		// Unknown to the view.
		{VS: vs("10.0.0.99:80"), Reals: []ipvs.RealServer{rs("10.1.0.7:8080", 1)}},
		// ns/new has no virtual server at all.
	}, want)
	if len(got.Unattributed) != 1 {
		t.Errorf("unattributed %v", got.Unattributed)
	}
	equalLines(t, diffLines(Compare(got, want, true)), []string{
		"ns/a:web TCP/10.0.0.1:80 missing-backends want=forward got=forward missing=[10.1.0.2:8080] stale=[]",
		"ns/new:web TCP/10.0.0.3:80 missing-entry want=forward got= missing=[10.1.0.3:8080] stale=[]",
	})
}
