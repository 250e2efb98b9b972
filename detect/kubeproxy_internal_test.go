package detect

import (
	"testing"
	"time"
)

func TestWindow(t *testing.T) {
	t0 := time.Unix(1_800_000_000, 0)
	var w window[int]
	at := func(s int) time.Time { return t0.Add(time.Duration(s) * time.Second) }
	w.add(1, at(0), 10, 30*time.Second)
	if _, _, ok := w.ends(); ok {
		t.Fatal("one sample gave a window")
	}
	w.add(1, at(5), 99, 30*time.Second) // same scrape seen again: ignored
	w.add(2, at(10), 20, 30*time.Second)
	w.add(3, at(20), 30, 30*time.Second)
	w.add(4, at(40), 40, 30*time.Second)
	// The window [10 s, 40 s] keeps the sample at its start.
	o, n, ok := w.ends()
	if !ok || o.v != 20 || n.v != 40 || len(w.samples) != 3 {
		t.Fatalf("ends %v %v %v, samples %v", o, n, ok, w.samples)
	}
	w.add(5, at(45), 50, 30*time.Second)
	if o, _, _ := w.ends(); o.v != 20 {
		t.Errorf("oldest %v, want the sample at 10 s (the one at or before 15 s)", o)
	}
	w.reset()
	if len(w.samples) != 1 || w.samples[0].v != 50 {
		t.Errorf("after reset %v", w.samples)
	}
}
