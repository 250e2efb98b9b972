package sharedread

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// TestSlot: concurrent callers share one read; within maxAge the value is
// kept, past it read again; a failed read is not kept; a caller whose ctx
// ends while a read is in flight gets its ctx's error at once, and the
// read it left still serves the next caller.
func TestSlot(t *testing.T) {
	var s Slot[int]
	var mu sync.Mutex
	now := time.Unix(1000, 0)
	clock := func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	var reads atomic.Int32
	release := make(chan struct{})
	read := func(context.Context) (int, error) { <-release; return int(reads.Add(1)), nil }
	var wg sync.WaitGroup
	for i := 0; i < 8; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if v, err := s.Get(context.Background(), clock, time.Second, read); v != 1 || err != nil {
				t.Errorf("concurrent caller: %d %v", v, err)
			}
		}()
	}
	for s.Runs() == 0 {
		time.Sleep(time.Millisecond)
	}
	close(release)
	wg.Wait()
	if s.Runs() != 1 || reads.Load() != 1 {
		t.Fatalf("8 concurrent callers: %d reads started, %d made; want 1", s.Runs(), reads.Load())
	}
	if v, _ := s.Get(context.Background(), clock, time.Second, read); v != 1 || s.Runs() != 1 {
		t.Fatalf("within maxAge: %d after %d reads, want the kept 1", v, s.Runs())
	}
	mu.Lock()
	now = now.Add(2 * time.Second)
	mu.Unlock()
	if v, _ := s.Get(context.Background(), clock, time.Second, read); v != 2 {
		t.Fatalf("past maxAge: %d, want a new read (2)", v)
	}
	mu.Lock()
	now = now.Add(2 * time.Second)
	mu.Unlock()
	boom := errors.New("boom")
	if _, err := s.Get(context.Background(), clock, time.Second, func(context.Context) (int, error) { return 0, boom }); !errors.Is(err, boom) {
		t.Fatalf("failed read: %v", err)
	}
	if v, err := s.Get(context.Background(), clock, time.Hour, read); v != 3 || err != nil {
		t.Fatalf("after a failed read: %d %v, want a new read (3)", v, err)
	}

	// A read in flight the caller cannot wait for.
	mu.Lock()
	now = now.Add(2 * time.Hour)
	mu.Unlock()
	hold := make(chan struct{})
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := s.Get(ctx, clock, time.Second, func(context.Context) (int, error) { <-hold; return 9, nil }); !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled while waiting: %v", err)
	}
	close(hold)
	if v, err := s.Get(context.Background(), clock, time.Hour, read); v != 9 || err != nil {
		t.Fatalf("the read the cancelled caller started: %d %v, want 9", v, err)
	}
}
