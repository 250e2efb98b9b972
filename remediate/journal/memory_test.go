package journal

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// writeFullRotation writes a journal at the writer's default bounds: the
// current file and 5 rotated ones, 10 MiB each, of outcome and dry-run
// records with evidence as the engine writes them. It returns the record
// count.
func writeFullRotation(t testing.TB, dir string) int {
	t.Helper()
	t0 := time.Date(2026, 11, 21, 12, 0, 0, 0, time.UTC)
	n := 0
	for i := 5; i >= 0; i-- {
		name := filepath.Join(dir, FileName)
		if i > 0 {
			name = fmt.Sprintf("%s.%d", name, i)
		}
		f, err := os.Create(name)
		if err != nil {
			t.Fatal(err)
		}
		w := bufio.NewWriter(f)
		for size := 0; size < 10<<20; n++ {
			r := Record{Time: t0.Add(time.Duration(n) * time.Second), ID: fmt.Sprintf("a%08d", n), Kind: KindOutcome, Node: "node-1",
				Rule: "stale-conntrack", Target: fmt.Sprintf("udp/10.96.%d.%d:53", n%250, n%200), Action: "FlushConntrackEntries", Outcome: "executed",
				Summary: "deleted 3 conntrack entries to a backend no longer in the Service's endpoints",
				Details: map[string]any{"deleted": 3, "service": "kube-system/kube-dns", "backends": []any{"10.244.1.7", "10.244.2.9"},
					"evidence": map[string]any{"entries": 3, "oldest": "2026-11-21T11:00:00Z", "protocol": "udp", "zone": 0}, "dryRun": false}}
			b, err := json.Marshal(r)
			if err != nil {
				t.Fatal(err)
			}
			w.Write(b)
			w.WriteByte('\n')
			size += len(b) + 1
		}
		if err := w.Flush(); err != nil {
			t.Fatal(err)
		}
		f.Close()
	}
	return n
}

// peakHeap runs f and returns the largest heap in use seen while it ran
// (sampled every millisecond) over the heap before it.
func peakHeap(f func()) uint64 {
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	base := ms.HeapInuse
	var peak atomic.Uint64
	done := make(chan struct{})
	go func() {
		tk := time.NewTicker(time.Millisecond)
		defer tk.Stop()
		var m runtime.MemStats
		for {
			runtime.ReadMemStats(&m)
			if m.HeapInuse > peak.Load() {
				peak.Store(m.HeapInuse)
			}
			select {
			case <-done:
				return
			case <-tk.C:
			}
		}
	}()
	f()
	close(done)
	runtime.ReadMemStats(&ms)
	p := max(peak.Load(), ms.HeapInuse)
	if p < base {
		return 0
	}
	return p - base
}

// TestWalkMemoryFullRotation: a journal at the writer's default rotation
// (6 x 10 MiB) is walked with a bounded heap. Measured here (GOGC=100):
// ReadAll ~250 MiB over the base heap (the whole journal decoded, as
// `remediate journal`, a bundle and a settle read it before), Walk a few
// MiB.
func TestWalkMemoryFullRotation(t *testing.T) {
	if testing.Short() {
		t.Skip("writes 60 MiB")
	}
	debug.SetGCPercent(100)
	dir := t.TempDir()
	n := writeFullRotation(t, dir)
	walked := 0
	walk := peakHeap(func() {
		if err := Walk(dir, func(Record) error { walked++; return nil }); err != nil {
			t.Fatal(err)
		}
	})
	var all int
	whole := peakHeap(func() {
		recs, err := ReadAll(dir)
		if err != nil {
			t.Fatal(err)
		}
		all = len(recs)
	})
	t.Logf("%d records in 6 x 10 MiB: peak heap over base: Walk %.1f MiB, ReadAll %.1f MiB", n, float64(walk)/(1<<20), float64(whole)/(1<<20))
	if walked != n || all != n {
		t.Fatalf("walked %d, read %d, wrote %d", walked, all, n)
	}
	if walk > 16<<20 {
		t.Errorf("Walk's peak heap %d MiB, want under 16 MiB (one record at a time)", walk>>20)
	}
}

// TestWalkStopsOnError: fn's error ends the walk and is returned as is.
func TestWalkStopsOnError(t *testing.T) {
	dir := t.TempDir()
	j, _ := Open(dir, 0, 0)
	for i := 0; i < 3; i++ {
		_ = j.Append(Record{Kind: KindIntent, ID: fmt.Sprint(i)})
	}
	stop := fmt.Errorf("enough")
	seen := 0
	err := Walk(dir, func(Record) error {
		seen++
		if seen == 2 {
			return stop
		}
		return nil
	})
	if err != stop || seen != 2 || !strings.Contains(err.Error(), "enough") {
		t.Fatalf("err %v after %d", err, seen)
	}
}
