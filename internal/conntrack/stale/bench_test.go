package stale

import (
	"fmt"
	"net/netip"
	"testing"
	"time"

	"github.com/remediate-dev/remediate/internal/cluster"
	"github.com/remediate-dev/remediate/internal/cluster/clustertest"
	"github.com/remediate-dev/remediate/internal/dataplane"
)

// ctBenchView is a generational view of n Services with 5 ready endpoints
// each, its Services and Endpoints precomputed (as kube.View's snapshot and
// index make them): the benchmark measures the index, not the fake.
type ctBenchView struct {
	*clustertest.Fake
	svcs []cluster.Service
	eps  map[[2]string][]cluster.Endpoint
	gen  uint64
}

func (v *ctBenchView) Services() []cluster.Service { return v.svcs }
func (v *ctBenchView) Endpoints(ns, name string) []cluster.Endpoint {
	return v.eps[[2]string{ns, name}]
}
func (v *ctBenchView) Generation() uint64 { return v.gen }

func newCTBenchView(n int) *ctBenchView {
	f := clustertest.New(t0)
	for i := 0; i < n; i++ {
		s := cluster.Service{Namespace: fmt.Sprintf("ns%d", i%10), Name: fmt.Sprintf("svc%d", i), ClusterIPs: []string{fmt.Sprintf("10.96.%d.%d", i/250, i%250+1)},
			Ports: []cluster.ServicePort{{Name: "dns", Protocol: "UDP", Port: 53}}, Created: t0.Add(-time.Hour)}
		var eps []cluster.Endpoint
		for j := 0; j < 5; j++ {
			k := i*5 + j
			eps = append(eps, cluster.Endpoint{Address: fmt.Sprintf("10.%d.%d.%d", 64+k/62500, k/250%250, k%250+1), Port: 53, Protocol: "UDP", PortName: "dns", NodeName: "node1", Ready: true, Serving: true})
		}
		f.SetService(s, eps...)
	}
	v := &ctBenchView{Fake: f, svcs: f.Services(), eps: map[[2]string][]cluster.Endpoint{}}
	for _, s := range v.svcs {
		v.eps[[2]string{s.Namespace, s.Name}] = f.Endpoints(s.Namespace, s.Name)
	}
	return v
}

// BenchmarkConntrackStaleIndex5kServices: the view part of
// ConntrackStaleServiceEntries' index at 5,000 Services / 25,000 endpoints,
// once per cycle. changed: the view's generation moved (a churned cluster:
// built, the desired state computed again); unchanged: kept (before issue
// #31 every cycle cost what changed costs, and more: three endpoint reads
// per Service and an uncached desired state).
func BenchmarkConntrackStaleIndex5kServices(b *testing.B) {
	v := newCTBenchView(5000)
	fams := []dataplane.Family{dataplane.IPv4}
	local := []netip.Addr{netip.MustParseAddr("10.200.0.1")}
	b.Run("changed", func(b *testing.B) {
		var c BaseCache
		b.ReportAllocs()
		for i := 0; i < b.N; i++ {
			v.gen++
			if len(c.Get(v, "node1", fams, local).vips) != 5000 {
				b.Fatal("wrong index")
			}
		}
	})
	b.Run("unchanged", func(b *testing.B) {
		var c BaseCache
		c.Get(v, "node1", fams, local)
		b.ReportAllocs()
		b.ResetTimer()
		for i := 0; i < b.N; i++ {
			ix := NewIndex(c.Get(v, "node1", fams, local), nil, t0, time.Minute)
			if len(ix.vips) != 5000 {
				b.Fatal("wrong index")
			}
		}
	})
}
