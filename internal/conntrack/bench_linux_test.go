//go:build linux

package conntrack

import (
	"context"
	"fmt"
	"net/netip"
	"os/exec"
	"runtime"
	"testing"
	"time"

	"github.com/mdlayher/netlink"
	ticonntrack "github.com/ti-mo/conntrack"

	"github.com/remediate-dev/remediate/internal/testing/memstat"
)

const benchTable = 250_000

// fillTable creates total UDP entries in the namespace, match of them
// answered by deadIP:53 and the rest spread over 24 live backends, with the
// batched create encoder (ti-mo's one-by-one Create takes ~5 s for 250k).
func fillTable(tb testing.TB, fd, total, match int) {
	tb.Helper()
	s, err := openSock(fd)
	if err != nil {
		tb.Fatal(err)
	}
	defer s.Close()
	ctx := context.Background()
	batch := make([]Flow, 0, 256)
	for i := 0; i < total; i++ {
		client := netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, 1, byte(i >> 16), byte(i >> 8)}), uint16(1024+i&0xff))
		backend := netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, 0, 1, byte(2 + i%24)}), 53)
		if i < match {
			backend = netip.AddrPortFrom(deadIP, 53)
		}
		batch = append(batch, natFlow(ProtoUDP, client, vip, backend))
		if len(batch) == cap(batch) || i == total-1 {
			if err := s.createBatch(ctx, batch, 600); err != nil {
				tb.Fatalf("creating entries (nf_conntrack_max must be >= %d): %v", total, err)
			}
			batch = batch[:0]
		}
	}
}

// BenchmarkDeleteUDPByReplySource deletes the UDP entries of one dead
// backend from a 250k-entry table (in a namespace the benchmark creates)
// and reports peak heap in use, bytes allocated and the time of the same
// deletion by `conntrack -D -p udp --reply-src IP`. Run with
// -benchtime=1x: each iteration rebuilds the table (~3 s).
//
//	go test -run XXX -bench DeleteUDPByReplySource -benchtime 1x ./internal/conntrack/
func BenchmarkDeleteUDPByReplySource(b *testing.B) {
	for _, tc := range []struct {
		match  int
		filter bool
	}{{10_000, true}, {125_000, true}, {benchTable, true}, {10_000, false}} {
		match := tc.match
		name := fmt.Sprintf("match=%d", match)
		if !tc.filter {
			name += "/unfiltered" // the path for kernels < 5.16
		}
		b.Run(name, func(b *testing.B) {
			fd, ns := newNetNS(b)
			r := New(Config{NetNS: fd, NoKernelFilter: !tc.filter})
			var ours, cli time.Duration
			var peak, alloc uint64
			for i := 0; i < b.N; i++ {
				b.StopTimer()
				fillTable(b, fd, benchTable, match)
				runtime.GC()
				a0 := memstat.TotalAlloc()
				stop := memstat.HeapPeak()
				b.StartTimer()
				t0 := time.Now()
				res, err := r.DeleteUDPByReplySource(context.Background(), Backend{IP: deadIP, Port: 53}, benchTable)
				ours += time.Since(t0)
				b.StopTimer()
				if p := stop(); p > peak {
					peak = p
				}
				alloc += memstat.TotalAlloc() - a0
				if err != nil || res.Deleted != match {
					b.Fatalf("deleted %+v, %v; want %d", res, err, match)
				}
				// The same deletion by the conntrack CLI.
				if _, err := exec.LookPath("conntrack"); err != nil {
					continue
				}
				flushTable(b, fd)
				fillTable(b, fd, benchTable, match)
				t0 = time.Now()
				out, err := exec.Command("ip", "netns", "exec", ns, "conntrack", "-D", "-p", "udp", "--reply-src", deadIP.String(), "--reply-port-src", "53").CombinedOutput()
				cli += time.Since(t0)
				if err != nil && match > 0 {
					b.Fatalf("conntrack -D: %v: %.300s", err, out)
				}
				if n := countLeft(b, fd); n != benchTable-match {
					b.Fatalf("after conntrack -D %d entries left, want %d", n, benchTable-match)
				}
				flushTable(b, fd)
				b.StartTimer()
			}
			b.ReportMetric(float64(peak)/(1<<20), "peak-heap-MiB")
			b.ReportMetric(float64(alloc)/float64(b.N)/(1<<20), "alloc-MiB/op")
			b.ReportMetric(ours.Seconds()/float64(b.N), "ours-s/op")
			if cli > 0 {
				b.ReportMetric(cli.Seconds()/float64(b.N), "conntrack-cli-s/op")
			}
		})
	}
}

// BenchmarkTiMoDump shows why ti-mo's Dump is not used: the heap needed to
// list a 250k table.
func BenchmarkTiMoDump(b *testing.B) {
	fd, _ := newNetNS(b)
	fillTable(b, fd, benchTable, 10_000)
	c, err := ticonntrack.Dial(&netlink.Config{NetNS: fd})
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	var peak uint64
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		runtime.GC()
		stop := memstat.HeapPeak()
		flows, err := c.Dump(nil)
		if p := stop(); p > peak {
			peak = p
		}
		if err != nil || len(flows) != benchTable {
			b.Fatalf("dump: %d flows, %v", len(flows), err)
		}
	}
	b.ReportMetric(float64(peak)/(1<<20), "peak-heap-MiB")
}

func flushTable(tb testing.TB, fd int) {
	c, err := ticonntrack.Dial(&netlink.Config{NetNS: fd})
	if err != nil {
		tb.Fatal(err)
	}
	defer c.Close()
	if err := c.Flush(); err != nil {
		tb.Fatal(err)
	}
}

func countLeft(tb testing.TB, fd int) int {
	u, err := New(Config{NetNS: fd}).Usage(context.Background())
	if err != nil {
		tb.Fatal(err)
	}
	return int(u.Count)
}

// BenchmarkCompose250k computes the breakdown of a 250k-entry table (UDP
// to one Service address, ~1000 source addresses: far more than the
// sketch's 64 counters, its worst case) in one streamed dump and
// reports the peak heap in use during it and the bytes allocated: both
// bounded by the sketch, not by the table.
//
//	go test -run XXX -bench Compose250k -benchtime 3x ./internal/conntrack/
func BenchmarkCompose250k(b *testing.B) {
	fd, _ := newNetNS(b)
	fillTable(b, fd, benchTable, 50_000)
	r := New(Config{NetNS: fd})
	var peak, alloc uint64
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		runtime.GC()
		a0 := memstat.TotalAlloc()
		stop := memstat.HeapPeak()
		c, err := Compose(context.Background(), r, DefaultTopN, 1<<22)
		if p := stop(); p > peak {
			peak = p
		}
		alloc += memstat.TotalAlloc() - a0
		if err != nil || c.Total != benchTable || c.Count(ClassUDPUnreplied) != benchTable || c.TopDestinations[0].Count != benchTable ||
			c.TopDestinations[0].Endpoint != (Endpoint{Proto: ProtoUDP, Addr: vip.Addr(), Port: vip.Port()}) {
			b.Fatalf("compose: %+v, %v", c, err)
		}
	}
	b.StopTimer()
	b.ReportMetric(float64(peak)/(1<<20), "peak-heap-MiB")
	b.ReportMetric(float64(alloc)/float64(b.N)/(1<<20), "alloc-MiB/op")
}

// BenchmarkScanTable250k is the dump alone (BenchmarkCompose250k minus the
// counting).
func BenchmarkScanTable250k(b *testing.B) {
	fd, _ := newNetNS(b)
	fillTable(b, fd, benchTable, 50_000)
	r := New(Config{NetNS: fd})
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		res, err := r.ScanTable(context.Background(), 1<<22, func(*Flow) error { return nil })
		if err != nil || res.Scanned != benchTable {
			b.Fatalf("scan: %+v, %v", res, err)
		}
	}
}
