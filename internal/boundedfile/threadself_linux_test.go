package boundedfile

import (
	"runtime"
	"strconv"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// TestThreadSelfIsTheCallersThread: a /proc/thread-self path names the
// thread that opens it. A caller that locked its thread (to enter a network
// namespace) must read its own thread's file, not that of the goroutine
// the deadline runs on (legacy iptables table names were read from the
// host's namespace that way: every save in a test namespace came back
// empty).
func TestThreadSelfIsTheCallersThread(t *testing.T) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	want := unix.Gettid()
	for _, read := range []struct {
		name string
		f    func() ([]byte, error)
	}{
		{"Read", func() ([]byte, error) { return Read("/proc/thread-self/stat", 4096) }},
		{"OpenBounded", func() ([]byte, error) {
			f, err := OpenBounded("/proc/thread-self/stat", 4096)
			if err != nil {
				return nil, err
			}
			defer f.Close()
			b := make([]byte, 4096)
			n, err := f.Read(b)
			return b[:n], err
		}},
	} {
		b, err := read.f()
		if err != nil {
			t.Fatalf("%s: %v", read.name, err)
		}
		tid, _, _ := strings.Cut(string(b), " ")
		if tid != strconv.Itoa(want) {
			t.Errorf("%s of /proc/thread-self/stat: thread %s, want the caller's %d", read.name, tid, want)
		}
	}
}
