// Package memstat measures a benchmark's memory for the budgets benchmarks
// report: the peak of the heap in use while a piece of work runs, and the
// bytes allocated in all.
package memstat

import (
	"runtime"
	"runtime/metrics"
	"sync/atomic"
	"time"
)

// HeapPeak samples HeapInuse every millisecond until the returned stop is
// called, which returns the peak in bytes.
func HeapPeak() (stop func() uint64) {
	return samplePeak(func() uint64 {
		var ms runtime.MemStats
		runtime.ReadMemStats(&ms)
		return ms.HeapInuse
	})
}

// HeapObjectsPeak samples the heap's live and not yet swept objects
// (runtime/metrics' /memory/classes/heap/objects:bytes, what
// runtime.MemStats calls HeapAlloc) every millisecond until the returned
// stop is called, which returns the peak in bytes. Unlike HeapPeak it
// does not stop the world to sample, and it compares with a HeapAlloc
// baseline.
func HeapObjectsPeak() (stop func() uint64) {
	s := []metrics.Sample{{Name: "/memory/classes/heap/objects:bytes"}}
	return samplePeak(func() uint64 {
		metrics.Read(s)
		return s[0].Value.Uint64()
	})
}

// samplePeak calls read every millisecond, and once more at stop, until
// the returned stop is called, which returns the highest value read.
func samplePeak(read func() uint64) (stop func() uint64) {
	var peak atomic.Uint64
	done, finished := make(chan struct{}), make(chan struct{})
	sample := func() {
		if v := read(); v > peak.Load() {
			peak.Store(v)
		}
	}
	go func() {
		defer close(finished)
		t := time.NewTicker(time.Millisecond)
		defer t.Stop()
		for {
			sample()
			select {
			case <-done:
				return
			case <-t.C:
			}
		}
	}()
	return func() uint64 {
		close(done)
		<-finished
		sample()
		return peak.Load()
	}
}

// TotalAlloc is the bytes allocated by the process so far.
func TotalAlloc() uint64 {
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.TotalAlloc
}
