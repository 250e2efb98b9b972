package controlplane

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// LockHolder is a separate process (`flock --no-fork FILE sleep 3600`)
// holding an exclusive flock on a file, like a stray iptables command
// holding the xtables lock. Its PID is the lock's holder in /proc/locks.
type LockHolder struct {
	*Process
	// Path is the locked file.
	Path string
}

// HoldLock starts a process that takes an exclusive flock on path and keeps
// it until Release (or the test's cleanup) stops it by PID. It returns once
// /proc/locks shows the lock held by that process.
func HoldLock(t testing.TB, path string) *LockHolder {
	t.Helper()
	if _, err := exec.LookPath("flock"); err != nil {
		skipOrFail(t, "needs flock(1) (Debian package util-linux)")
	}
	cmd := exec.Command("flock", "--no-fork", "--exclusive", path, "sleep", "3600")
	h := &LockHolder{Process: startProcess(t, "flock", t.TempDir(), cmd), Path: path}
	id, err := lockID(path)
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for !heldBy(id, h.Pid()) {
		if h.Exited() || time.Now().After(deadline) {
			t.Fatalf("flock %s (pid %d) did not take the lock; output:\n%s", path, h.Pid(), tail(h.LogPath, 10))
		}
		time.Sleep(20 * time.Millisecond)
	}
	return h
}

// Release stops the holder by PID, which frees the lock.
func (h *LockHolder) Release(t testing.TB) {
	t.Helper()
	h.Stop(t)
}

// lockID is the "maj:min:inode" form /proc/locks uses for path.
func lockID(path string) (string, error) {
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		return "", fmt.Errorf("stat %s: %w", path, err)
	}
	return fmt.Sprintf("%02x:%02x:%d", unix.Major(st.Dev), unix.Minor(st.Dev), st.Ino), nil
}

// heldBy reports whether /proc/locks shows pid holding (not waiting for) a
// lock on the file with that id.
func heldBy(id string, pid int) bool {
	f, err := os.Open("/proc/locks")
	if err != nil {
		return false
	}
	defer f.Close()
	s := bufio.NewScanner(f)
	for s.Scan() {
		fields := strings.Fields(s.Text())
		if len(fields) < 8 || fields[1] == "->" {
			continue
		}
		if fields[4] == fmt.Sprint(pid) && fields[5] == id {
			return true
		}
	}
	return false
}
