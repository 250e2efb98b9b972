//go:build linux

package detect

import (
	"context"
	"fmt"
	"net/netip"
	"runtime"
	"testing"
	"time"

	clocktesting "k8s.io/utils/clock/testing"

	"github.com/remediate-dev/remediate/internal/cluster"
	"github.com/remediate-dev/remediate/internal/cluster/clustertest"
	"github.com/remediate-dev/remediate/internal/conntrack"
	"github.com/remediate-dev/remediate/internal/conntrack/conntracktest"
	"github.com/remediate-dev/remediate/internal/node"
	"github.com/remediate-dev/remediate/internal/testing/memstat"
)

// BenchmarkConntrackStaleScan250k runs ConntrackStaleServiceEntries over a
// real table of 250,000 UDP entries (in a namespace the benchmark creates)
// and a view of 1,000 Services: 200,000 entries to serving backends,
// 40,000 to the old backends of 100 Services scaled to zero, 10,000 to
// addresses that are no Service. It reports the peak heap in use during
// Detect (the budget is 64 MiB) and the bytes allocated. Filling the table
// takes a few seconds; run with -benchtime 1x:
//
//	go test -run XXX -bench ConntrackStaleScan250k -benchtime 1x ./detect/
func BenchmarkConntrackStaleScan250k(b *testing.B) {
	fd := conntracktest.NetNS(b)
	now := time.Now()
	old := now.Add(-time.Hour)
	view := clustertest.New(now)
	const services, scaledToZero = 1000, 100
	vipOf := func(i int) netip.AddrPort {
		return netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, 96, byte(i >> 8), byte(i)}), 53)
	}
	backend := func(i, k int) netip.AddrPort {
		return netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, byte(200 + k), byte(i >> 8), byte(i)}), 53)
	}
	for i := 0; i < services; i++ {
		s := cluster.Service{Namespace: "ns", Name: fmt.Sprintf("svc-%d", i), ClusterIPs: []string{vipOf(i).Addr().String()}, Type: "ClusterIP",
			Ports: []cluster.ServicePort{{Name: "dns", Protocol: "UDP", Port: 53}}, Created: old, Changed: old}
		var eps []cluster.Endpoint
		if i >= scaledToZero {
			for k := 0; k < 2; k++ {
				eps = append(eps, cluster.Endpoint{Address: backend(i, k).Addr().String(), Port: 53, Protocol: "UDP", PortName: "dns", Ready: true, Serving: true, SliceChanged: old})
			}
		}
		view.SetService(s, append([]cluster.Endpoint{}, eps...)...)
	}
	flows := make([]conntrack.Flow, 0, 250_000)
	for j := 0; j < 250_000; j++ {
		client := netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, 1, byte(j >> 16), byte(j >> 8)}), uint16(1024+j&0xff))
		var dst, reply netip.AddrPort
		switch {
		case j < 40_000: // stale: Services scaled to zero
			i := j % scaledToZero
			dst, reply = vipOf(i), backend(i, 2)
		case j < 240_000: // serving
			i := scaledToZero + j%(services-scaledToZero)
			dst, reply = vipOf(i), backend(i, j%2)
		default: // not a Service
			dst = netip.AddrPortFrom(netip.AddrFrom4([4]byte{192, 0, 2, byte(j)}), 53)
			reply = dst
		}
		flows = append(flows, conntrack.Flow{Proto: conntrack.ProtoUDP, OrigSrc: client, OrigDst: dst, ReplySrc: reply, ReplyDst: client})
	}
	conntracktest.Create(b, fd, flows...)
	flows = nil

	n := &node.Node{Name: "node1", Conntrack: conntrack.New(conntrack.Config{NetNS: fd}), Cluster: view, Clock: clocktesting.NewFakePassiveClock(now)}
	ty, _ := Lookup(ConntrackStaleServiceEntriesName)
	p := ty.NewParams().(*ConntrackStaleServiceEntriesParams)
	p.Families = []string{"IPv4"}
	p.MaxFindings = 1000
	d, err := ty.New(p, n)
	if err != nil {
		b.Fatal(err)
	}
	var peak, alloc uint64
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		runtime.GC()
		a0 := memstat.TotalAlloc()
		stop := memstat.HeapPeak()
		fs, err := d.Detect(context.Background())
		if p := stop(); p > peak {
			peak = p
		}
		alloc += memstat.TotalAlloc() - a0
		if err != nil || len(fs) != scaledToZero {
			b.Fatalf("detect: %d findings, %v; want %d", len(fs), err, scaledToZero)
		}
	}
	b.StopTimer()
	b.ReportMetric(float64(peak)/(1<<20), "peak-heap-MiB")
	b.ReportMetric(float64(alloc)/float64(b.N)/(1<<20), "alloc-MiB/op")
}
