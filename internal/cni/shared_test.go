package cni

import (
	"context"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"
)

// TestSharedReadsOncePerAge: callers within maxAge of a read, and
// concurrent ones, share it (one read of the real directory); past
// maxAge the directory is read again and a change is seen; a caller
// whose ctx ends while waiting gets its ctx's error, not a hang.
func TestSharedReadsOncePerAge(t *testing.T) {
	dir := t.TempDir()
	write := func(name string) {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(`{"cniVersion":"1.0.0","name":"n","type":"bridge"}`), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("10-a.conf")
	now := time.Unix(1000, 0)
	var mu sync.Mutex
	s := NewShared(dir, "", 2*time.Second)
	s.now = func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	var wg sync.WaitGroup
	for i := 0; i < 8; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if d := s.Read(context.Background()); d.ConfDirErr != nil || len(d.Files) != 1 || string(d.InUse().Data) == "" {
				t.Errorf("read %+v", d)
			}
		}()
	}
	wg.Wait()
	if s.Reads() != 1 {
		t.Fatalf("8 concurrent callers: %d reads, want 1", s.Reads())
	}
	write("20-b.conf")
	if d := s.Read(context.Background()); len(d.Files) != 1 || s.Reads() != 1 {
		t.Fatalf("within maxAge: %d files, %d reads; want the kept read", len(d.Files), s.Reads())
	}
	mu.Lock()
	now = now.Add(3 * time.Second)
	mu.Unlock()
	if d := s.Read(context.Background()); len(d.Files) != 2 || s.Reads() != 2 {
		t.Fatalf("past maxAge: %d files, %d reads; want a new read", len(d.Files), s.Reads())
	}
	if d := s.Read(context.Background()); d.InUse().Data == nil || d.Files[1].Data != nil {
		t.Errorf("only the file in use keeps its bytes: %+v", d.Files)
	}
	// A read in flight that the caller cannot wait for.
	mu.Lock()
	now = now.Add(3 * time.Second)
	mu.Unlock()
	hold := make(chan struct{})
	defer close(hold)
	s.read = func() Dir { <-hold; return Dir{} }
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if d := s.Read(ctx); d.ConfDirErr != context.Canceled {
		t.Errorf("cancelled while waiting: %v", d.ConfDirErr)
	}
}
