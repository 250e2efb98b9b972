package lockwatch

import (
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/remediate-dev/remediate/internal/netnstest"
	"github.com/remediate-dev/remediate/internal/procs"
)

func cpuTime() time.Duration {
	var ru unix.Rusage
	_ = unix.Getrusage(unix.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// BenchmarkWatcherIdle measures what a started watcher costs while the
// lock is unused: it sleeps in poll(2) on inotify, so the process's CPU
// time over each 200 ms of idling should be ~0 (reported as cpu-ns/s and
// samples/s).
func BenchmarkWatcherIdle(b *testing.B) {
	lock := filepath.Join(b.TempDir(), "xtables.lock")
	if err := os.WriteFile(lock, nil, 0o600); err != nil {
		b.Fatal(err)
	}
	// The process's CPU time without the watcher (runtime, timers) first.
	runtime.GC()
	c0, t0 := cpuTime(), time.Now()
	for i := 0; i < b.N; i++ {
		time.Sleep(200 * time.Millisecond)
	}
	base := float64(cpuTime()-c0) / time.Since(t0).Seconds()
	w := New(Config{LockFile: lock, Procs: procs.New("/proc")})
	defer w.Close()
	if err := w.Start(); err != nil {
		b.Fatal(err)
	}
	time.Sleep(300 * time.Millisecond) // start-up scan and first sample done
	runtime.GC()
	s0 := w.Status().Samples
	c0, t0 = cpuTime(), time.Now()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		time.Sleep(200 * time.Millisecond)
	}
	el := time.Since(t0).Seconds()
	b.ReportMetric(float64(cpuTime()-c0)/el-base, "cpu-ns/s")
	b.ReportMetric(float64(w.Status().Samples-s0)/el, "samples/s")
}

// BenchmarkWatcherPerHold measures the watcher's CPU per lock hold while
// a flock(1) loop takes the lock for 50 ms every 100 ms (the loop's own
// processes are not in this process's CPU time).
func BenchmarkWatcherPerHold(b *testing.B) {
	netnstest.NeedCommands(b, "flock", "sh")
	lock := filepath.Join(b.TempDir(), "xtables.lock")
	if err := os.WriteFile(lock, nil, 0o600); err != nil {
		b.Fatal(err)
	}
	w := New(Config{LockFile: lock, Procs: procs.New("/proc")})
	defer w.Close()
	if err := w.Start(); err != nil {
		b.Fatal(err)
	}
	time.Sleep(100 * time.Millisecond)
	loop := exec.Command("sh", "-c", `while :; do flock "$0" sleep 0.05; sleep 0.05; done`, lock)
	netnstest.StartGroup(b, loop)
	n0, c0 := len(w.Holds(time.Time{})), cpuTime()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		time.Sleep(200 * time.Millisecond)
	}
	holds := len(w.Holds(time.Time{})) - n0
	if holds > 0 {
		b.ReportMetric(float64(cpuTime()-c0)/float64(holds), "cpu-ns/hold")
	}
	b.ReportMetric(float64(holds), "holds")
}

// BenchmarkSample is one /proc/locks read and filter (the burst's unit of
// work).
func BenchmarkSample(b *testing.B) {
	lock := filepath.Join(b.TempDir(), "xtables.lock")
	if err := os.WriteFile(lock, nil, 0o600); err != nil {
		b.Fatal(err)
	}
	s := &procSource{root: "/proc", lock: lock, procs: procs.New("/proc")}
	key, _, _, err := s.lockKey()
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for i := 0; i < b.N; i++ {
		if _, _, err := s.sample(key); err != nil {
			b.Fatal(err)
		}
	}
}
