//go:build linux

package iptables

import (
	"os"
	"path/filepath"
	"syscall"
	"testing"
)

// TestLockActivity: the generation moves when the lock file is opened
// (and closed), not otherwise; a missing or non-regular file says nothing
// (ok false); a replaced file is watched again with a new generation.
func TestLockActivity(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "xtables.lock")
	a := &lockActivity{path: path, fd: -1}
	defer a.closeLocked()
	if _, ok := a.generation(); ok {
		t.Fatal("a missing lock file gave ok")
	}
	if err := os.WriteFile(path, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	g0, ok := a.generation()
	if !ok {
		t.Fatal("an existing lock file gave no watch")
	}
	if g, ok := a.generation(); !ok || g != g0 {
		t.Fatalf("nothing happened, generation %d → %d (ok %v)", g0, g, ok)
	}
	// What the iptables commands do: open(O_RDONLY|O_CREAT), flock, close.
	fd, err := syscall.Open(path, syscall.O_RDONLY|syscall.O_CREAT, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	if err := syscall.Flock(fd, syscall.LOCK_EX); err != nil {
		t.Fatal(err)
	}
	g1, ok := a.generation()
	if !ok || g1 == g0 {
		t.Fatalf("open not seen: %d → %d (ok %v)", g0, g1, ok)
	}
	// Still held: nothing new until the close.
	if g, _ := a.generation(); g != g1 {
		t.Fatalf("no event, generation %d → %d", g1, g)
	}
	_ = syscall.Close(fd)
	g2, ok := a.generation()
	if !ok || g2 == g1 {
		t.Fatalf("close not seen: %d → %d (ok %v)", g1, g2, ok)
	}
	// Replaced: watched again, a new generation.
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	g3, ok := a.generation()
	if !ok || g3 == g2 {
		t.Fatalf("replaced file: %d → %d (ok %v)", g2, g3, ok)
	}
	if g, ok := a.generation(); !ok || g != g3 {
		t.Fatalf("after the replacement, nothing happened: %d → %d (ok %v)", g3, g, ok)
	}
	// Not a regular file: nothing can be said.
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Mkfifo(path, 0o600); err != nil {
		t.Fatal(err)
	}
	if _, ok := a.generation(); ok {
		t.Fatal("a FIFO at the lock path gave ok")
	}
}
