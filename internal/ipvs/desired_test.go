package ipvs

import (
	"net/netip"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/remediate-dev/remediate/internal/cluster"
	"github.com/remediate-dev/remediate/internal/cluster/clustertest"
)

func dep(addr string, port int32, proto, name string, ready, serving, terminating bool) cluster.Endpoint {
	return cluster.Endpoint{Address: addr, Port: port, Protocol: proto, PortName: name, Ready: ready, Serving: serving, Terminating: terminating}
}

func TestExpectedEndpointsAndClassify(t *testing.T) {
	ready := dep("10.244.1.1", 53, "UDP", "dns", true, true, false)
	termServing := dep("10.244.1.2", 53, "UDP", "dns", false, true, true)
	termDead := dep("10.244.1.3", 53, "UDP", "dns", false, false, true)
	starting := dep("10.244.1.4", 53, "UDP", "dns", false, false, false)
	otherPort := dep("10.244.1.5", 9153, "TCP", "metrics", true, true, false)
	cases := []struct {
		name     string
		eps      []cluster.Endpoint
		expected []string
		classes  map[string]string
	}{
		{
			name:     "ready endpoints win",
			eps:      []cluster.Endpoint{ready, termServing, termDead, starting, otherPort},
			expected: []string{"10.244.1.1:53"},
			classes: map[string]string{
				"10.244.1.1:53":   BackendExpected,
				"10.244.1.2:53":   BackendTerminatingWhileReady,
				"10.244.1.3:53":   BackendNotServing,
				"10.244.1.4:53":   BackendNotServing,
				"10.244.1.5:9153": BackendNotEndpoint, // another port's endpoint
				"10.244.9.9:53":   BackendNotEndpoint,
			},
		},
		{
			name:     "no ready endpoint: terminating but serving ones are used",
			eps:      []cluster.Endpoint{termServing, termDead, starting},
			expected: []string{"10.244.1.2:53"},
			classes:  map[string]string{"10.244.1.2:53": BackendExpected, "10.244.1.3:53": BackendNotServing},
		},
		{
			name:     "nothing serving",
			eps:      []cluster.Endpoint{termDead, starting},
			expected: []string{},
			classes:  map[string]string{"10.244.1.3:53": BackendNotServing},
		},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			v := clustertest.New(time.Now())
			v.SetService(cluster.Service{Namespace: "kube-system", Name: "kube-dns", ClusterIPs: []string{"10.96.0.10"},
				Ports: []cluster.ServicePort{{Name: "dns", Protocol: "UDP", Port: 53}}}, c.eps...)
			fe, ok := NewDesired(v, nil).Lookup(VirtualServer{Address: netip.MustParseAddr("10.96.0.10"), Protocol: UDP, Port: 53})
			if !ok {
				t.Fatal("ClusterIP frontend not found")
			}
			if len(fe.SP.Expected) != len(c.expected) {
				t.Fatalf("expected = %v, want %v", fe.SP.Expected, c.expected)
			}
			for _, e := range c.expected {
				if _, ok := fe.SP.Expected[netip.MustParseAddrPort(e)]; !ok {
					t.Errorf("%s not expected", e)
				}
			}
			for ap, want := range c.classes {
				if got := fe.SP.Classify(netip.MustParseAddrPort(ap)); got != want {
					t.Errorf("Classify(%s) = %s, want %s", ap, got, want)
				}
			}
		})
	}
}

func TestDesiredLookup(t *testing.T) {
	v := clustertest.New(time.Now())
	v.SetService(cluster.Service{Namespace: "default", Name: "web", ClusterIPs: []string{"10.96.1.1", "fd00::1:1"},
		ExternalIPs: []string{"203.0.113.1"}, LoadBalancerIPs: []string{"198.51.100.1"},
		Ports: []cluster.ServicePort{{Name: "http", Protocol: "TCP", Port: 80, NodePort: 30080}}})
	node := netip.MustParseAddr("192.168.1.10")
	for _, nodeIPs := range [][]netip.Addr{nil, {node}} {
		d := NewDesired(v, nodeIPs)
		cases := []struct {
			vs   VirtualServer
			kind string // "" = not found
		}{
			{VirtualServer{Address: netip.MustParseAddr("10.96.1.1"), Protocol: TCP, Port: 80}, KindClusterIP},
			{VirtualServer{Address: netip.MustParseAddr("::ffff:10.96.1.1"), Protocol: TCP, Port: 80}, KindClusterIP},
			{VirtualServer{Address: netip.MustParseAddr("fd00::1:1"), Protocol: TCP, Port: 80}, KindClusterIP},
			{VirtualServer{Address: netip.MustParseAddr("203.0.113.1"), Protocol: TCP, Port: 80}, KindExternalIP},
			{VirtualServer{Address: netip.MustParseAddr("198.51.100.1"), Protocol: TCP, Port: 80}, KindLoadBalancer},
			{VirtualServer{Address: node, Protocol: TCP, Port: 30080}, KindNodePort},
			// Another local address kube-proxy also binds NodePorts on.
			{VirtualServer{Address: netip.MustParseAddr("172.17.0.1"), Protocol: TCP, Port: 30080}, KindNodePort},
			{VirtualServer{Address: netip.MustParseAddr("10.96.1.1"), Protocol: UDP, Port: 80}, ""},
			{VirtualServer{Address: netip.MustParseAddr("10.96.1.1"), Protocol: TCP, Port: 81}, ""},
			// A Service address is never a NodePort frontend.
			{VirtualServer{Address: netip.MustParseAddr("10.96.1.1"), Protocol: TCP, Port: 30080}, ""},
			{VirtualServer{Address: node, Protocol: UDP, Port: 30080}, ""},
			{VirtualServer{FWMark: 1}, ""},
		}
		for _, c := range cases {
			fe, ok := d.Lookup(c.vs)
			if (c.kind == "") == ok || (ok && fe.Kind != c.kind) {
				t.Errorf("nodeIPs %v: Lookup(%s) = %v %v, want %q", nodeIPs, c.vs.Key(), fe.Kind, ok, c.kind)
			}
		}
		want := 4
		if nodeIPs != nil {
			want = 5
		}
		if got := len(d.Frontends()); got != want {
			t.Errorf("nodeIPs %v: %d frontends, want %d", nodeIPs, got, want)
		}
	}
}

func TestKubeIPVSInterfacePresent(t *testing.T) {
	root := t.TempDir()
	if _, err := KubeIPVSInterfacePresent(root); err == nil {
		t.Fatal("missing net/dev must be an error")
	}
	_ = os.MkdirAll(filepath.Join(root, "net"), 0o755)
	dev := "Inter-|   Receive |  Transmit\n face |bytes\n    lo: 1 2 3\nkube-ipvs0:       0       0\n"
	_ = os.WriteFile(filepath.Join(root, "net", "dev"), []byte(dev), 0o644)
	if ok, err := KubeIPVSInterfacePresent(root); !ok || err != nil {
		t.Fatalf("= %v %v", ok, err)
	}
	_ = os.WriteFile(filepath.Join(root, "net", "dev"), []byte("Inter-|\n face |\n  eth0: 1 2\n kube-ipvs1: 0\n"), 0o644)
	if ok, err := KubeIPVSInterfacePresent(root); ok || err != nil {
		t.Fatalf("= %v %v", ok, err)
	}
}
