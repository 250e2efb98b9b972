package lockwatch

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"testing"
	"time"

	"go.uber.org/zap/zaptest"

	"github.com/remediate-dev/remediate/internal/netnstest"
	"github.com/remediate-dev/remediate/internal/procs"
)

// holdsBy returns the completed holds whose first holder's pid is in pids
// (or whose lock pid is, for a holder that exited).
func completed(hs []Hold) []Hold {
	var out []Hold
	for _, h := range hs {
		if !h.End.IsZero() {
			out = append(out, h)
		}
	}
	return out
}

// TestWatcherSeesShortHoldsAsTheyHappen: a flock(1) loop that takes a
// private lock file for 0.4 s every 0.7 s gives one hold of ~0.4 s per
// take, each attributed to flock, never one continuous hold; the lock is
// only watched (the watcher never opens it).
func TestWatcherSeesShortHoldsAsTheyHappen(t *testing.T) {
	netnstest.NeedCommands(t, "flock", "sh")
	lock := filepath.Join(t.TempDir(), "xtables.lock")
	if err := os.WriteFile(lock, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	w := New(Config{LockFile: lock, Procs: procs.New("/proc"), Log: zaptest.NewLogger(t)})
	defer w.Close()
	if err := w.Start(); err != nil {
		t.Fatal(err)
	}
	for w.Status().Samples == 0 { // its first look, before anything holds the lock
		time.Sleep(5 * time.Millisecond)
	}
	loop := exec.Command("sh", "-c", `while :; do flock "$0" sleep 0.4; sleep 0.3; done`, lock)
	netnstest.StartGroup(t, loop)
	hs, err := w.Observe(context.Background(), 3*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	done := completed(hs)
	t.Logf("status %+v", w.Status())
	for _, h := range done {
		t.Logf("hold %s exact=%v %s waiters=%d lockPIDs=%v", h.Duration(time.Now()).Round(time.Millisecond), h.Exact, h.Program(), len(h.Waiters), h.LockPIDs)
	}
	if len(done) < 3 || len(done) > 5 {
		t.Fatalf("want 3-5 completed holds in 3s, got %d", len(done))
	}
	for _, h := range done {
		d := h.Duration(time.Now())
		if d < 350*time.Millisecond || d > 700*time.Millisecond || h.Program() != "flock" || !h.Exact {
			t.Errorf("hold %v exact=%v by %q: want ~0.4s, exact, by flock", d, h.Exact, h.Program())
		}
	}
	if w.Status().Mode != "inotify" {
		t.Errorf("mode = %q", w.Status().Mode)
	}
	// Buckets[3] is 0.25 s, Buckets[5] 1 s.
	if hist := w.Histogram()[HistKey{Program: "flock"}]; hist.Count < 3 || hist.Counts[3] != 0 || hist.Counts[5] != hist.Count {
		t.Errorf("histogram = %+v", hist)
	}
}

// TestWatcherPersistentOpener: a shell that keeps the file open and
// flocks it repeatedly makes no open event per hold; the watcher finds it
// (at start, or after its first hold) and polls while it keeps the file
// open.
func TestWatcherPersistentOpener(t *testing.T) {
	netnstest.NeedCommands(t, "flock", "sh")
	lock := filepath.Join(t.TempDir(), "xtables.lock")
	if err := os.WriteFile(lock, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	// Opened before the watcher starts.
	loop := exec.Command("sh", "-c", `exec 9<"$0"; sleep 0.3; while :; do flock 9; sleep 0.6; flock -u 9; sleep 0.6; done`, lock)
	netnstest.StartGroup(t, loop)
	time.Sleep(100 * time.Millisecond)
	w := New(Config{LockFile: lock, Procs: procs.New("/proc"), Log: zaptest.NewLogger(t)})
	defer w.Close()
	hs, err := w.Observe(context.Background(), 3500*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	done := completed(hs)
	for _, h := range done {
		t.Logf("hold %s exact=%v %s holders=%+v", h.Duration(time.Now()).Round(time.Millisecond), h.Exact, h.Program(), h.Holders)
	}
	if len(done) < 2 {
		t.Fatalf("want >= 2 completed holds, got %d (status %+v)", len(done), w.Status())
	}
	for _, h := range done {
		if d := h.Duration(time.Now()); d < 300*time.Millisecond || d > 1200*time.Millisecond || h.Program() != "sh" {
			t.Errorf("hold %v by %q: want ~0.6s by sh", d, h.Program())
		}
	}
}

// TestWatcherLockFileCreatedLater: the lock file need not exist at start.
func TestWatcherLockFileCreatedLater(t *testing.T) {
	netnstest.NeedCommands(t, "flock")
	lock := filepath.Join(t.TempDir(), "xtables.lock")
	w := New(Config{LockFile: lock, Procs: procs.New("/proc"), Log: zaptest.NewLogger(t)})
	defer w.Close()
	if err := w.Start(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(50 * time.Millisecond)
	if s := w.Status(); s.Err == "" {
		t.Errorf("no error while the lock file is missing: %+v", s)
	}
	if out, err := exec.Command("flock", lock, "sleep", "0.3").CombinedOutput(); err != nil {
		t.Fatalf("flock: %v %s", err, out)
	}
	time.Sleep(100 * time.Millisecond)
	done := completed(w.Holds(time.Time{}))
	if len(done) != 1 || done[0].Program() != "flock" {
		t.Fatalf("holds = %+v", done)
	}
}

// TestWatcherCloseStopsGoroutine: Close returns promptly and twice, and
// leaves no goroutine behind.
func TestWatcherCloseStopsGoroutine(t *testing.T) {
	lock := filepath.Join(t.TempDir(), "xtables.lock")
	before := runtime.NumGoroutine()
	w := New(Config{LockFile: lock, Procs: procs.New("/proc")})
	if err := w.Start(); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	w.Close()
	w.Close()
	if d := time.Since(start); d > time.Second {
		t.Errorf("Close took %v", d)
	}
	select {
	case <-w.done:
	default:
		t.Fatal("goroutine still running")
	}
	if err := w.Start(); err == nil {
		t.Error("Start after Close succeeded")
	}
	// The goroutine has closed done; give it a moment to return.
	after := runtime.NumGoroutine()
	for i := 0; i < 100 && after > before; i++ {
		time.Sleep(time.Millisecond)
		after = runtime.NumGoroutine()
	}
	if after > before {
		t.Errorf("goroutines %d before, %d after Close", before, after)
	}
	New(Config{LockFile: lock}).Close() // never started
}
