// Package memstat measures a benchmark's memory for the budgets benchmarks
// report: the peak of the heap in use while a piece of work runs, and the
// bytes allocated in all.
package memstat

import (
	"runtime"
	"sync/atomic"
	"time"
)

// HeapPeak samples HeapInuse every millisecond until the returned stop is
// called, which returns the peak in bytes.
func HeapPeak() (stop func() uint64) {
	var peak atomic.Uint64
	done, finished := make(chan struct{}), make(chan struct{})
	sample := func() {
		var ms runtime.MemStats
		runtime.ReadMemStats(&ms)
		if ms.HeapInuse > peak.Load() {
			peak.Store(ms.HeapInuse)
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
