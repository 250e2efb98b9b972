package boundedfile

import (
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestHostileFiles plants what an intruder or a broken node puts where the
// daemon expects a file (a FIFO with no writer, a symlink to a file of
// someone else's, a 1 GiB sparse file) and checks that every entry point
// answers at once with a refusal: none blocks, follows, or reads it.
func TestHostileFiles(t *testing.T) {
	dir := t.TempDir()
	fifo := filepath.Join(dir, "fifo")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	victim := filepath.Join(dir, "victim")
	if err := os.WriteFile(victim, []byte("someone else's\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(dir, "journal.jsonl")
	if err := os.Symlink(victim, link); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(t.TempDir(), filepath.Join(dir, "dirlink")); err != nil {
		t.Fatal(err)
	}
	big := filepath.Join(dir, "big")
	f, err := os.Create(big)
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Truncate(1 << 30); err != nil {
		t.Fatal(err)
	}
	f.Close()

	done := make(chan struct{})
	go func() {
		defer close(done)
		for name, c := range map[string]struct {
			err  error
			want string
		}{
			"Read fifo":               {func() error { _, err := Read(fifo, 1<<20); return err }(), "not a regular file"},
			"ReadNoFollow fifo":       {func() error { _, err := ReadNoFollow(fifo, 1<<20); return err }(), "not a regular file"},
			"Open fifo":               {func() error { _, err := Open(fifo); return err }(), "not a regular file"},
			"OpenAppend fifo":         {func() error { _, err := OpenAppend(fifo, 0o600); return err }(), "no such device or address"}, // ENXIO: no reader
			"OpenAppend symlink":      {func() error { _, err := OpenAppend(link, 0o600); return err }(), "too many levels of symbolic links"},
			"ReadNoFollow symlink":    {func() error { _, err := ReadNoFollow(link, 1<<20); return err }(), "too many levels of symbolic links"},
			"OpenDir fifo":            {func() error { _, err := OpenDir(fifo); return err }(), "not a directory"},
			"Read 1 GiB":              {func() error { _, err := Read(big, 1<<20); return err }(), "too large (1073741824 bytes, larger than allowed: over the 1048576-byte bound)"},
			"OpenBounded 1 GiB":       {func() error { _, err := OpenBounded(big, 1<<20); return err }(), "too large"},
			"OpenBoundedNoFollow dir": {func() error { _, err := OpenBoundedNoFollow(dir, 1<<20); return err }(), "not a regular file"},
		} {
			if c.err == nil || !strings.Contains(c.err.Error(), c.want) {
				t.Errorf("%s: %v, want an error containing %q", name, c.err, c.want)
			}
		}
	}()
	select {
	case <-done:
	case <-time.After(time.Minute): // a hang, not a timing check
		t.Fatal("an open blocked")
	}
	if b, err := os.ReadFile(victim); err != nil || string(b) != "someone else's\n" {
		t.Fatalf("the symlink's target was changed: %q %v", b, err)
	}
	// A regular file the daemon owns is appended to; a directory opens.
	own := filepath.Join(dir, "own.jsonl")
	w, err := OpenAppend(own, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := w.WriteString("x\n"); err != nil {
		t.Fatal(err)
	}
	w.Close()
	if fi, err := os.Stat(own); err != nil || fi.Mode().Perm() != 0o600 || fi.Size() != 2 {
		t.Fatalf("appended file: %v %v", fi, err)
	}
	d, err := OpenDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	d.Close()
}

// TestBoundedReader: a streaming reader stops at its bound on a file that
// reports size 0 (procfs) and reads a file within it whole.
func TestBoundedReader(t *testing.T) {
	f, err := OpenBounded("/proc/self/maps", 64)
	if err != nil {
		t.Fatal(err)
	}
	_, err = io.ReadAll(f)
	f.Close()
	if !errors.Is(err, ErrTooLarge) {
		t.Fatalf("reading /proc/self/maps with a 64-byte bound: %v, want ErrTooLarge", err)
	}
	p := filepath.Join(t.TempDir(), "f")
	if err := os.WriteFile(p, []byte("12345"), 0o600); err != nil {
		t.Fatal(err)
	}
	f, err = OpenBoundedNoFollow(p, 5)
	if err != nil {
		t.Fatal(err)
	}
	b, err := io.ReadAll(f)
	f.Close()
	if err != nil || string(b) != "12345" {
		t.Fatalf("ReadAll at the bound = %q, %v", b, err)
	}
}

// TestDeadline: an open or read that does not return (a hung FUSE or NFS
// mount, a /proc file of a process whose memory lock is held; here an
// open that blocks until the test ends) is answered with ErrTimeout after
// Timeout, and the descriptor it returns later is closed.
func TestDeadline(t *testing.T) {
	release := make(chan struct{})
	opened := make(chan *os.File, 1)
	oldOpen, oldTimeout := osOpenFile, Timeout
	osOpenFile = func(name string, flag int, perm os.FileMode) (*os.File, error) {
		<-release
		f, err := oldOpen(name, flag, perm)
		opened <- f
		return f, err
	}
	Timeout = 10 * time.Millisecond
	t.Cleanup(func() { osOpenFile, Timeout = oldOpen, oldTimeout })

	p := filepath.Join(t.TempDir(), "f")
	if err := os.WriteFile(p, []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := Read(p, 10); !errors.Is(err, ErrTimeout) || !strings.Contains(err.Error(), "opening "+p) {
		t.Fatalf("Read of a hung file: %v, want ErrTimeout", err)
	}
	close(release)
	f := <-opened
	// The abandoned open's file is closed by its goroutine.
	for i := 0; ; i++ {
		if _, err := f.Stat(); errors.Is(err, os.ErrClosed) {
			break
		}
		if i > 10000 {
			t.Fatal("the abandoned open's file was never closed")
		}
		time.Sleep(time.Millisecond)
	}
}
