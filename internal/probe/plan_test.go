package probe

import (
	"strings"
	"testing"
	"time"

	"github.com/remediate-dev/remediate/internal/cluster"
	"github.com/remediate-dev/remediate/internal/cluster/clustertest"
)

// FuzzParseCanary: a policy's canary (outside data) is never a panic; one
// accepted names DNS labels and a port in range, and reads back as written.
func FuzzParseCanary(f *testing.F) {
	for _, s := range []string{"a/b", "kube-system/kube-dns/53", "team/web/http", "a/b/0", "a/b/70000", "a/B", "a/b/c/d", "", "/", "a//b", "-a/b", "a/b/-1"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, c string) {
		s, err := ParseCanary(c)
		if err != nil {
			return
		}
		if s.String() != c {
			t.Fatalf("%q read back as %q", c, s.String())
		}
		for _, p := range []string{s.Namespace, s.Name} {
			if !isDNSLabel(p) {
				t.Fatalf("%q: accepted %q", c, p)
			}
		}
		if strings.Count(c, "/") > 2 {
			t.Fatalf("%q accepted", c)
		}
	})
}

// TestPlan: which Service ports are probed in which family, against which
// endpoints (ready ones; internalTrafficPolicy Local keeps this node's),
// and why the others are not. Pure: the view in, the paths out.
func TestPlan(t *testing.T) {
	t0 := time.Date(2026, 11, 25, 0, 0, 0, 0, time.UTC)
	v := clustertest.New(t0)
	tcp := []cluster.ServicePort{{Name: "https", Protocol: "TCP", Port: 443}}
	v.SetService(cluster.Service{Namespace: "default", Name: "kubernetes", ClusterIPs: []string{"10.96.0.1", "fd00::1"}, Type: "ClusterIP", Ports: tcp},
		cluster.Endpoint{Address: "192.0.2.10", Port: 6443, Protocol: "TCP", PortName: "https", Ready: true, Serving: true, NodeName: "cp"},
		cluster.Endpoint{Address: "192.0.2.9", Port: 6443, Protocol: "TCP", PortName: "https", Ready: false, Serving: false, NodeName: "cp"})
	v.SetService(cluster.Service{Namespace: "team", Name: "ext", Type: "ExternalName", Ports: tcp})
	v.SetService(cluster.Service{Namespace: "team", Name: "headless", Type: "ClusterIP", Ports: tcp})
	v.SetService(cluster.Service{Namespace: "team", Name: "dns", ClusterIPs: []string{"10.96.0.10"}, Type: "ClusterIP", Ports: []cluster.ServicePort{{Name: "dns", Protocol: "UDP", Port: 53}}})
	v.SetService(cluster.Service{Namespace: "team", Name: "local", ClusterIPs: []string{"10.96.0.20"}, Type: "ClusterIP", Ports: tcp, InternalPolicyLocal: true},
		cluster.Endpoint{Address: "10.244.9.9", Port: 8443, Protocol: "TCP", PortName: "https", Ready: true, Serving: true, NodeName: "other"})
	specs := []Spec{{Namespace: "default", Name: "kubernetes"}, {Namespace: "team", Name: "ext"}, {Namespace: "team", Name: "headless"},
		{Namespace: "team", Name: "dns", Port: "dns"}, {Namespace: "team", Name: "local"}, {Namespace: "team", Name: "gone"}}
	paths, not := Plan(v, specs, []string{"IPv4"}, "node1")
	if len(paths) != 1 || paths[0].Ref != (Ref{Family: "IPv4", Namespace: "default", Name: "kubernetes", Port: 443}) ||
		paths[0].VIP.String() != "10.96.0.1:443" || len(paths[0].Backends) != 1 || paths[0].Backends[0].String() != "192.0.2.10:6443" {
		t.Fatalf("paths %+v", paths)
	}
	want := []string{"ExternalName", "headless", "only TCP is probed", "internalTrafficPolicy Local and no ready endpoint on this node", "team/gone: not in the cluster view"}
	if len(not) != len(want) {
		t.Fatalf("not probed %q, want %d reasons", not, len(want))
	}
	for i, w := range want {
		if !strings.Contains(not[i], w) {
			t.Errorf("reason %d %q, want %q", i, not[i], w)
		}
	}
}
