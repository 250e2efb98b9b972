package boundedfile

import (
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

func TestReadRefusals(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "f")
	if err := os.WriteFile(file, []byte("12345"), 0o600); err != nil {
		t.Fatal(err)
	}
	fifo := filepath.Join(dir, "fifo")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(dir, "link")
	if err := os.Symlink(file, link); err != nil {
		t.Fatal(err)
	}
	if b, err := Read(file, 5); err != nil || string(b) != "12345" {
		t.Fatalf("Read at the bound = %q, %v", b, err)
	}
	if b, err := Read(link, 5); err != nil || string(b) != "12345" {
		t.Fatalf("Read through a symlink = %q, %v", b, err)
	}
	for name, c := range map[string]struct {
		err  error
		want string
	}{
		"over the bound":    {func() error { _, err := Read(file, 4); return err }(), "too large (5 bytes, larger than allowed: over the 4-byte bound)"},
		"fifo (no block)":   {func() error { _, err := Read(fifo, 4); return err }(), "not a regular file"},
		"directory":         {func() error { _, err := Read(dir, 4); return err }(), "not a regular file"},
		"symlink, nofollow": {func() error { _, err := ReadNoFollow(link, 5); return err }(), "symbolic links"},
		"missing":           {func() error { _, err := Read(filepath.Join(dir, "none"), 5); return err }(), "no such file"},
	} {
		if c.err == nil || !strings.Contains(c.err.Error(), c.want) {
			t.Errorf("%s: %v, want an error containing %q", name, c.err, c.want)
		}
	}
	// procfs reports size 0: the bound holds while reading.
	if _, err := Read("/proc/self/maps", 10); err == nil || !strings.Contains(err.Error(), "grew larger than allowed while read: over the 10-byte bound") {
		t.Errorf("procfs file over the bound: %v", err)
	}
}

// BenchmarkRead is the cost of one bounded read of a small procfs file
// (the deadline's goroutine and timer included), against os.ReadFile.
func BenchmarkRead(b *testing.B) {
	b.Run("boundedfile", func(b *testing.B) {
		b.ReportAllocs()
		for i := 0; i < b.N; i++ {
			if _, err := Read("/proc/self/stat", 4096); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("os.ReadFile", func(b *testing.B) {
		b.ReportAllocs()
		for i := 0; i < b.N; i++ {
			if _, err := os.ReadFile("/proc/self/stat"); err != nil {
				b.Fatal(err)
			}
		}
	})
}
