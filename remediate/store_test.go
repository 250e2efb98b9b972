package remediate

import (
	"errors"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestLoadHostileStateFile: a FIFO as state.json hung --once forever, a
// 1 GiB state.json crashed every start out of memory (issue 13). Each
// hostile file is quarantined like a corrupt one, quickly, without being
// read whole or followed.
func TestLoadHostileStateFile(t *testing.T) {
	now := time.Date(2026, 11, 23, 12, 0, 0, 0, time.UTC)
	target := filepath.Join(t.TempDir(), "elsewhere.json")
	if err := os.WriteFile(target, []byte(`{"version":1}`), 0o600); err != nil {
		t.Fatal(err)
	}
	cases := map[string]struct {
		make func(path string) error
		want string
	}{
		"fifo": {func(p string) error { return syscall.Mkfifo(p, 0o600) }, "not a regular file"},
		"1 GiB": {func(p string) error {
			f, err := os.Create(p)
			if err != nil {
				return err
			}
			defer f.Close()
			return f.Truncate(1 << 30) // sparse
		}, "over the 16777216-byte bound"},
		"symlink":   {func(p string) error { return os.Symlink(target, p) }, "too many levels of symbolic links"},
		"directory": {func(p string) error { return os.Mkdir(p, 0o700) }, "not a regular file"},
	}
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			s := &Store{Dir: t.TempDir()}
			path := filepath.Join(s.Dir, stateFile)
			if err := c.make(path); err != nil {
				t.Fatal(err)
			}
			var before, after runtime.MemStats
			runtime.ReadMemStats(&before)
			done := make(chan struct{})
			var st *State
			var err error
			go func() { st, err = s.Load(now); close(done) }()
			select {
			case <-done:
			case <-time.After(5 * time.Second):
				t.Fatal("Load hangs")
			}
			runtime.ReadMemStats(&after)
			if !errors.Is(err, ErrCorrupt) || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("err = %v, want ErrCorrupt with %q", err, c.want)
			}
			if !st.UnknownHistoryAt.Equal(now) {
				t.Errorf("history not treated as recent: %+v", st)
			}
			if a := after.TotalAlloc - before.TotalAlloc; a > 1<<20 {
				t.Errorf("allocated %d bytes", a)
			}
			if _, err := os.Lstat(path); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("not moved aside: %v", err)
			}
			if b, err := os.ReadFile(target); err != nil || string(b) != `{"version":1}` {
				t.Errorf("symlink target touched: %q %v", b, err)
			}
			// The next Save writes a regular file again.
			if err := s.Save(NewState()); err != nil {
				t.Fatal(err)
			}
		})
	}
}

func TestLockRefusesFIFO(t *testing.T) {
	s := &Store{Dir: t.TempDir()}
	if err := syscall.Mkfifo(filepath.Join(s.Dir, lockFile), 0o600); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		_, err := s.Lock(t.Context())
		done <- err
	}()
	select {
	case err := <-done:
		if err == nil || !strings.Contains(err.Error(), "not a regular file") {
			t.Fatalf("Lock = %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Lock hangs on a FIFO")
	}
}
