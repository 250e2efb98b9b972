package dataplane

import (
	"strings"
	"testing"
	"time"

	"github.com/remediate-dev/remediate/internal/cluster"
	"github.com/remediate-dev/remediate/internal/cluster/clustertest"
)

const node = "node-a"

func ep(addr string, port int32, nodeName string, ready, serving, terminating bool) cluster.Endpoint {
	return cluster.Endpoint{Address: addr, Port: port, Protocol: "TCP", PortName: "web", NodeName: nodeName, Ready: ready, Serving: serving, Terminating: terminating}
}

func svc(mut func(*cluster.Service)) cluster.Service {
	s := cluster.Service{Namespace: "ns", Name: "s", ClusterIPs: []string{"10.0.0.1"}, Type: "ClusterIP",
		Ports: []cluster.ServicePort{{Name: "web", Protocol: "TCP", Port: 80}}}
	if mut != nil {
		mut(&s)
	}
	return s
}

func desiredLines(d *Desired) []string {
	st := NewState(d.Family, "desired")
	for n, dp := range d.Ports {
		sp := dp.ServicePort
		st.Ports[n] = &sp
	}
	return entries(st)
}

// One case per rule of kube-proxy's semantics (see Desire's doc and
// pkg/proxy/topology.go, serviceport.go, endpointslicecache.go,
// iptables/proxier.go of v1.34.4).
func TestDesireKubeProxySemantics(t *testing.T) {
	ready := func(a, n string) cluster.Endpoint { return ep(a, 8080, n, true, true, false) }
	servingTerm := func(a, n string) cluster.Endpoint { return ep(a, 8080, n, false, true, true) }
	notServing := func(a, n string) cluster.Endpoint { return ep(a, 8080, n, false, false, true) }
	for _, tc := range []struct {
		name string
		svc  cluster.Service
		eps  []cluster.Endpoint
		want []string
	}{
		{"ready endpoints only", svc(nil),
			[]cluster.Endpoint{ready("10.1.0.1", "n1"), servingTerm("10.1.0.2", "n1"), ep("10.1.0.3", 8080, "n1", false, false, false)},
			[]string{"ns/s:web ClusterIP TCP/10.0.0.1:80 forward [10.1.0.1:8080]"}},
		{"no ready: serving terminating fallback", svc(nil),
			[]cluster.Endpoint{servingTerm("10.1.0.2", "n1"), notServing("10.1.0.3", "n1")},
			[]string{"ns/s:web ClusterIP TCP/10.0.0.1:80 forward [10.1.0.2:8080]"}},
		{"no usable endpoint: reject", svc(nil),
			[]cluster.Endpoint{notServing("10.1.0.3", "n1")},
			[]string{"ns/s:web ClusterIP TCP/10.0.0.1:80 reject []"}},
		{"no endpoints at all: reject on every entry", svc(func(s *cluster.Service) { s.Ports[0].NodePort = 30080; s.ExternalIPs = []string{"192.0.2.1"} }),
			nil,
			[]string{"ns/s:web ClusterIP TCP/10.0.0.1:80 reject []", "ns/s:web ExternalIP TCP/192.0.2.1:80 reject []", "ns/s:web NodePort TCP/nodePort:30080 reject []"}},
		{"internal traffic policy Local", svc(func(s *cluster.Service) { s.InternalPolicyLocal = true }),
			[]cluster.Endpoint{ready("10.1.0.1", node), ready("10.1.0.2", "other")},
			[]string{"ns/s:web ClusterIP TCP/10.0.0.1:80 forward [10.1.0.1:8080]"}},
		{"internal Local without local endpoints: drop", svc(func(s *cluster.Service) { s.InternalPolicyLocal = true }),
			[]cluster.Endpoint{ready("10.1.0.2", "other")},
			[]string{"ns/s:web ClusterIP TCP/10.0.0.1:80 drop []"}},
		{"internal Local: local serving terminating fallback", svc(func(s *cluster.Service) { s.InternalPolicyLocal = true }),
			[]cluster.Endpoint{servingTerm("10.1.0.1", node), ready("10.1.0.2", "other")},
			[]string{"ns/s:web ClusterIP TCP/10.0.0.1:80 forward [10.1.0.1:8080]"}},
		{"external traffic policy Local: cluster IP uses all, external only local", svc(func(s *cluster.Service) {
			s.ExternalPolicyLocal, s.Type = true, "LoadBalancer"
			s.Ports[0].NodePort = 30080
			s.LoadBalancerIPs = []string{"198.51.100.1"}
		}),
			[]cluster.Endpoint{ready("10.1.0.1", node), ready("10.1.0.2", "other")},
			[]string{
				"ns/s:web ClusterIP TCP/10.0.0.1:80 forward [10.1.0.1:8080 10.1.0.2:8080]",
				"ns/s:web LoadBalancer TCP/198.51.100.1:80 forward [10.1.0.1:8080]",
				"ns/s:web NodePort TCP/nodePort:30080 forward [10.1.0.1:8080]",
			}},
		{"external Local without local endpoints: drop external, forward cluster IP", svc(func(s *cluster.Service) {
			s.ExternalPolicyLocal, s.Type = true, "NodePort"
			s.Ports[0].NodePort = 30080
		}),
			[]cluster.Endpoint{ready("10.1.0.2", "other")},
			[]string{"ns/s:web ClusterIP TCP/10.0.0.1:80 forward [10.1.0.2:8080]", "ns/s:web NodePort TCP/nodePort:30080 drop []"}},
		{"another service proxy", svc(func(s *cluster.Service) { s.ProxyName = "cilium" }), []cluster.Endpoint{ready("10.1.0.1", "n1")}, nil},
		{"headless", svc(func(s *cluster.Service) { s.ClusterIPs = nil }), []cluster.Endpoint{ready("10.1.0.1", "n1")}, nil},
		{"ExternalName", svc(func(s *cluster.Service) { s.Type, s.ClusterIPs = "ExternalName", nil }), nil, nil},
		{"only addresses[0], only the port's name and protocol, only the family", svc(nil),
			[]cluster.Endpoint{ready("10.1.0.1", "n1"), func() cluster.Endpoint { e := ready("10.1.0.9", "n1"); e.Secondary = true; return e }(),
				func() cluster.Endpoint { e := ready("10.1.0.8", "n1"); e.PortName = "other"; return e }(),
				func() cluster.Endpoint { e := ready("10.1.0.7", "n1"); e.Protocol = "UDP"; return e }(),
				ready("fd00::1", "n1")},
			[]string{"ns/s:web ClusterIP TCP/10.0.0.1:80 forward [10.1.0.1:8080]"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			v := clustertest.New(time.Now())
			v.SetService(tc.svc, tc.eps...)
			got := desiredLines(Desire(v, IPv4, node))
			if strings.Join(got, "\n") != strings.Join(tc.want, "\n") {
				t.Fatalf("got:\n  %s\nwant:\n  %s", strings.Join(got, "\n  "), strings.Join(tc.want, "\n  "))
			}
		})
	}
}

func TestDesireFamiliesHintsAndTimes(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	v := clustertest.New(t0)
	s := svc(func(s *cluster.Service) {
		s.ClusterIPs = []string{"10.0.0.1", "fd00::a"}
		s.Created, s.Changed = t0, t0.Add(time.Minute)
	})
	e4 := ep("10.1.0.1", 8080, "n1", true, true, false)
	e4.Hinted, e4.SliceChanged = true, t0.Add(2*time.Minute)
	e6 := ep("fd00:1::1", 8080, "n1", true, true, false)
	v.SetService(s, e4, e6)
	d4, d6 := Desire(v, IPv4, node), Desire(v, IPv6, node)
	p4, p6 := d4.Ports[PortName{"ns", "s", "web"}], d6.Ports[PortName{"ns", "s", "web"}]
	if p4 == nil || p6 == nil {
		t.Fatalf("ports %v %v", d4.Ports, d6.Ports)
	}
	if !p4.Subset || p6.Subset {
		t.Errorf("subset: v4 %v (all ready hinted) v6 %v (not hinted)", p4.Subset, p6.Subset)
	}
	if !p4.Changed.Equal(t0.Add(2*time.Minute)) || !p6.Changed.Equal(t0.Add(time.Minute)) || !p4.Created.Equal(t0) {
		t.Errorf("changed v4 %v v6 %v created %v", p4.Changed, p6.Changed, p4.Created)
	}
	// An emptied slice is newer than any endpoint left: the view's slice
	// times win.
	v.SetEndpointsChanged("ns", "s", t0.Add(5*time.Minute))
	if p := Desire(v, IPv6, node).Ports[PortName{"ns", "s", "web"}]; !p.Changed.Equal(t0.Add(5 * time.Minute)) {
		t.Errorf("changed with slice times %v", p.Changed)
	}
	if got := desiredLines(d6); len(got) != 1 || got[0] != "ns/s:web ClusterIP TCP/[fd00::a]:80 forward [[fd00:1::1]:8080]" {
		t.Errorf("v6 %v", got)
	}
}
