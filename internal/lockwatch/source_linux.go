package lockwatch

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/remediate-dev/remediate/internal/boundedfile"
	"github.com/remediate-dev/remediate/internal/procs"
)

// procSource reads the lock's state through a proc root. It never opens
// the lock file: it stats it and reads /proc/locks and fdinfo.
type procSource struct {
	root  string
	lock  string
	procs procs.Interface
	buf   []byte
	locks *os.File // /proc/locks, kept open by the watcher's goroutine
}

// lockKey stats the lock file: its /proc/locks key and device/inode.
func (s *procSource) lockKey() (key string, dev, ino uint64, err error) {
	var st unix.Stat_t
	if err := unix.Stat(s.lock, &st); err != nil {
		return "", 0, 0, fmt.Errorf("stat lock file %s: %w", s.lock, err)
	}
	return procs.DevKey(unix.Major(st.Dev), unix.Minor(st.Dev), st.Ino), st.Dev, st.Ino, nil
}

// maxLocksBytes bounds one read of /proc/locks (a node with a million
// locks is not something to sample 100 times a second).
const maxLocksBytes = 4 << 20

// sample reads /proc/locks and keeps the lines of key. The file is kept
// open and re-read from offset 0 (the kernel regenerates it on every
// read from the start): two syscalls per sample instead of four.
func (s *procSource) sample(key string) (lockPIDs, waiterPIDs []int32, err error) {
	if s.locks == nil {
		// Kept open and re-read with pread on every sample (a hot path):
		// the open is bounded (non-blocking, regular file, deadline), the
		// reads into s.buf are bounded by its size.
		f, err := boundedfile.Open(filepath.Join(s.root, "locks"))
		if err != nil {
			return nil, nil, fmt.Errorf("reading locks: %w", err)
		}
		s.locks = f.OS()
	}
	if s.buf == nil {
		s.buf = make([]byte, 64<<10)
	}
	n := 0
	for {
		if n == len(s.buf) {
			if len(s.buf) >= maxLocksBytes {
				break
			}
			s.buf = append(s.buf, make([]byte, len(s.buf))...)
		}
		m, err := s.locks.ReadAt(s.buf[n:], int64(n))
		n += m
		if errors.Is(err, io.EOF) || m == 0 && err == nil {
			break
		}
		if err != nil {
			s.locks.Close()
			s.locks = nil
			return nil, nil, fmt.Errorf("reading locks: %w", err)
		}
	}
	return LocksOf(s.buf[:n], key)
}

// close releases the kept /proc/locks descriptor.
func (s *procSource) close() {
	if s.locks != nil {
		s.locks.Close()
		s.locks = nil
	}
}

// LocksOf returns the pids of the granted locks and of the waiters on the
// file with that key ("maj:min:inode") in /proc/locks content. Lines of
// other files are not parsed; a malformed line of this file is an error.
func LocksOf(locks []byte, key string) (lockPIDs, waiterPIDs []int32, err error) {
	needle := []byte(" " + key + " ")
	for len(locks) > 0 {
		line := locks
		if i := bytes.IndexByte(locks, '\n'); i >= 0 {
			line, locks = locks[:i], locks[i+1:]
		} else {
			locks = nil
		}
		if !bytes.Contains(line, needle) {
			continue
		}
		l, err := procs.ParseLockLine(string(line))
		if err != nil {
			return nil, nil, err
		}
		if l.Dev != key || l.Access == "UNLCK" {
			continue
		}
		if l.Waiting() {
			waiterPIDs = append(waiterPIDs, l.PID)
		} else {
			lockPIDs = append(lockPIDs, l.PID)
		}
	}
	return lockPIDs, waiterPIDs, nil
}

// holders resolves the real holders: first the flock callers /proc/locks
// names (one fd scan each), then, when none of them holds it (the caller
// exited and a child holds the descriptor, or it is not visible here),
// every process like lsof (procs.FileLocks).
func (s *procSource) holders(ctx context.Context, key string, dev, ino uint64, lockPIDs []int32) []procs.Process {
	var out []procs.Process
	for _, pid := range lockPIDs {
		if pid <= 0 {
			continue
		}
		if fd := s.fdOn(pid, dev, ino); fd >= 0 && fdinfoHolds(filepath.Join(s.root, strconv.Itoa(int(pid)), "fdinfo", strconv.Itoa(fd)), key) {
			if p, err := s.procs.Get(ctx, pid); err == nil {
				out = append(out, p)
			}
		}
	}
	if len(out) > 0 {
		return out
	}
	fl, err := s.procs.FileLocks(ctx, s.lock)
	if err != nil {
		return nil
	}
	return fl.Holders
}

// fdOn returns a descriptor of pid open on dev/ino, or -1.
func (s *procSource) fdOn(pid int32, dev, ino uint64) int {
	dir := filepath.Join(s.root, strconv.Itoa(int(pid)), "fd")
	ents, err := os.ReadDir(dir)
	if err != nil {
		return -1
	}
	for _, e := range ents {
		var st unix.Stat_t
		if unix.Stat(filepath.Join(dir, e.Name()), &st) != nil || st.Dev != dev || st.Ino != ino {
			continue
		}
		if fd, err := strconv.Atoi(e.Name()); err == nil {
			return fd
		}
	}
	return -1
}

// openers returns the processes with a descriptor open on dev/ino (a full
// scan of every process's fds: at start and rarely after).
func (s *procSource) openers(ctx context.Context, dev, ino uint64) []int32 {
	ents, err := os.ReadDir(s.root)
	if err != nil {
		return nil
	}
	var out []int32
	for _, e := range ents {
		if ctx.Err() != nil {
			return out
		}
		pid, err := strconv.ParseInt(e.Name(), 10, 32)
		if err != nil || pid <= 0 {
			continue
		}
		if s.fdOn(int32(pid), dev, ino) >= 0 {
			out = append(out, int32(pid))
		}
	}
	return out
}

// proc builds the Proc of a process, with its pod and container.
func (s *procSource) proc(ctx context.Context, pid int32) (procs.Process, Proc, error) {
	p, err := s.procs.Get(ctx, pid)
	if err != nil {
		return p, Proc{Pid: pid}, err
	}
	return p, s.withCgroup(procFrom(p, time.Time{})), nil
}

func (s *procSource) withCgroup(p Proc) Proc {
	f, err := boundedfile.Open(filepath.Join(s.root, strconv.Itoa(int(p.Pid)), "cgroup"))
	if err != nil {
		return p
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, maxCgroupBytes))
	if err != nil && !errors.Is(err, io.EOF) {
		return p
	}
	p.PodUID, p.Container = ParseCgroup(b)
	return p
}

// fdinfoHolds reports whether a fdinfo file has a granted "lock:" line on
// key.
func fdinfoHolds(path, key string) bool {
	f, err := boundedfile.Open(path)
	if err != nil {
		return false
	}
	defer f.Close()
	sc := bufio.NewScanner(io.LimitReader(f, 64<<10))
	for sc.Scan() {
		rest, ok := strings.CutPrefix(sc.Text(), "lock:")
		if !ok {
			continue
		}
		l, err := procs.ParseLockLine(strings.TrimSpace(rest))
		if err == nil && !l.Waiting() && l.Dev == key && l.Access != "UNLCK" {
			return true
		}
	}
	return false
}
