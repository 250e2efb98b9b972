//go:build linux

package iptables

import (
	byteorder "encoding/binary"
	"sync"

	"golang.org/x/sys/unix"
)

// lockActivity tells whether any process opened or closed the xtables lock
// file since a given moment, without taking the lock and without blocking:
// an inotify watch on the file (IN_OPEN, IN_CLOSE, IN_ATTRIB and the
// file's removal), drained with one non-blocking read when asked.
//
// Every legacy iptables command that changes rules opens that file before
// it writes and closes it (explicitly, or by exiting) after its commit:
// iptables and iptables-legacy-restore open it with or without -w
// (iptables 1.8.9, checked with strace); iptables-legacy-save does not. So
// a writer that takes the lock and whose close came before the generation
// was read has committed before the kernel is read after it; one whose
// close comes later bumps the generation, and the next check reads the
// entries. What it cannot see is a writer that never opens this file (a
// raw setsockopt, a container whose /run is not the host's, a different
// XTABLES_LOCKFILE); the caller bounds that with EntriesMaxAge.
type lockActivity struct {
	path string

	mu       sync.Mutex
	fd       int    // the inotify instance (one watch: its events need no wd); -1: none
	dev, ino uint64 // the file watched
	gen      uint64 // bumped by any event, by a new watch and by a lost one
}

// lockActivities are the watchers of this process, one per lock file path
// (the adapters of a policy reload and of tests share them); bounded.
var lockActivities = struct {
	sync.Mutex
	m map[string]*lockActivity
}{m: map[string]*lockActivity{}}

const maxLockActivities = 8

// lockActivityFor returns the shared watcher of path, or nil when path is
// "" or too many paths are watched already.
func lockActivityFor(path string) *lockActivity {
	if path == "" {
		return nil
	}
	lockActivities.Lock()
	defer lockActivities.Unlock()
	if a := lockActivities.m[path]; a != nil {
		return a
	}
	if len(lockActivities.m) >= maxLockActivities {
		return nil
	}
	a := &lockActivity{path: path, fd: -1}
	lockActivities.m[path] = a
	return a
}

// lockEvents are the events that count as activity: any open or close of
// the lock file, a change of its attributes (an unlink changes the link
// count) and its removal or move.
const lockEvents = unix.IN_OPEN | unix.IN_CLOSE_WRITE | unix.IN_CLOSE_NOWRITE | unix.IN_ATTRIB |
	unix.IN_DELETE_SELF | unix.IN_MOVE_SELF

// generation returns a number that changes whenever the lock file was
// opened or closed since the last call (by anyone; the caller compares it
// with the one it read before its last full check). ok is false when the
// file cannot be watched (missing, not a regular file, inotify refused):
// nothing can be said and the caller must read the entries. A watch made
// now (the first call, or the file replaced) bumps the generation: what
// happened before it is unknown.
func (a *lockActivity) generation() (gen uint64, ok bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	var st unix.Stat_t
	if err := unix.Stat(a.path, &st); err != nil || st.Mode&unix.S_IFMT != unix.S_IFREG {
		a.closeLocked()
		return a.gen, false
	}
	if a.fd >= 0 && (st.Dev != a.dev || st.Ino != a.ino) {
		a.closeLocked() // another file at the path now
	}
	if a.fd >= 0 {
		if a.drainLocked() {
			a.gen++
		}
		if a.fd >= 0 {
			return a.gen, true
		}
		// The watch was lost (the file removed, its inode number maybe
		// reused by the new one; an overflow): watch again.
	}
	return a.watchLocked(st)
}

// watchLocked watches the file st describes, if the path still names it.
func (a *lockActivity) watchLocked(st unix.Stat_t) (uint64, bool) {
	fd, err := unix.InotifyInit1(unix.IN_NONBLOCK | unix.IN_CLOEXEC)
	if err != nil {
		return a.gen, false
	}
	if _, err := unix.InotifyAddWatch(fd, a.path, lockEvents); err != nil {
		_ = unix.Close(fd)
		return a.gen, false
	}
	// The path may have been replaced between the stat and the watch:
	// keep the watch only if the path still names the same file.
	var st2 unix.Stat_t
	if err := unix.Stat(a.path, &st2); err != nil || st2.Dev != st.Dev || st2.Ino != st.Ino {
		_ = unix.Close(fd)
		return a.gen, false
	}
	a.fd, a.dev, a.ino = fd, st.Dev, st.Ino
	a.gen++
	return a.gen, true
}

// drainLocked reads every queued event without blocking and reports
// whether there was any. A removed watch (IN_IGNORED: the file was
// deleted or its file system unmounted) closes the instance; the next
// call watches the path again. The reads are bounded: a queue that does
// not empty after them still counts as activity, and the rest is read
// next time (or overflows into IN_Q_OVERFLOW, also activity).
func (a *lockActivity) drainLocked() bool {
	var buf [4096]byte
	any := false
	for i := 0; i < 16; i++ {
		n, err := unix.Read(a.fd, buf[:])
		if err == unix.EAGAIN {
			return any
		}
		if err == unix.EINTR {
			continue
		}
		if err != nil || n <= 0 {
			// An unreadable instance says nothing: start over.
			a.closeLocked()
			return true
		}
		any = true
		for off := 0; off+unix.SizeofInotifyEvent <= n; {
			mask := byteorder.NativeEndian.Uint32(buf[off+4:])
			l := int(byteorder.NativeEndian.Uint32(buf[off+12:]))
			if mask&(unix.IN_IGNORED|unix.IN_Q_OVERFLOW|unix.IN_DELETE_SELF|unix.IN_MOVE_SELF) != 0 {
				// Watch the path again next time (IN_IGNORED
				// follows a removal; an overflow lost events).
				a.closeLocked()
				return true
			}
			off += unix.SizeofInotifyEvent + l
		}
	}
	return any
}

func (a *lockActivity) closeLocked() {
	if a.fd >= 0 {
		_ = unix.Close(a.fd)
	}
	a.fd, a.dev, a.ino = -1, 0, 0
}
