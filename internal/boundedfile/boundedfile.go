// Package boundedfile is the one way the daemon opens files: the host's
// root, /proc and /sys (under --proc-root and --sys-root), a mounted CNI
// config, the policy file, and its own state directory (state files,
// journal), any of which an intruder or a broken node may have replaced.
// Every open gives a bounded answer:
//
//   - it never blocks on a FIFO or device planted where a file is expected:
//     the open is non-blocking (O_NONBLOCK) and anything but a regular file
//     is refused after the open (fstat; procfs, sysfs and cgroupfs files are
//     regular);
//   - the *NoFollow variants, for files the daemon owns (its state
//     directory), refuse a symlink as the last component (O_NOFOLLOW), so a
//     planted link cannot redirect a read or an append;
//   - reads stop at the caller's size bound (a file larger than it, or one
//     growing past it while read, is refused, not truncated);
//   - every open and read runs under a deadline (Timeout): a file on a hung
//     FUSE or NFS mount, or a /proc file of a process whose memory lock is
//     held, costs one goroutine left blocked in the kernel, never the caller.
//
// TestNoRawFileOpens (internal/layering) fails when code of the daemon
// opens a file another way.
package boundedfile

import (
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"sync"
	"time"
)

// Timeout bounds each open and each read of this package: a file that
// answers slower is reported as hung (ErrTimeout). Tests may lower it.
var Timeout = 10 * time.Second

// osOpenFile is os.OpenFile (a test makes it hang).
var osOpenFile = os.OpenFile

// ErrTimeout is wrapped by the errors of an open or read that did not
// return within Timeout.
var ErrTimeout = errors.New("no answer within the deadline (hung file system or process?)")

// ErrTooLarge is wrapped by the errors of a read past the caller's bound.
var ErrTooLarge = errors.New("too large")

// blocking runs op (an open or read that may block in the kernel) under
// Timeout. On time-out op keeps its goroutine until the kernel answers;
// cleanup then releases what it returned.
func blocking[T any](what string, op func() (T, error), cleanup func(T)) (T, error) {
	type result struct {
		v   T
		err error
	}
	ch := make(chan result, 1)
	var mu sync.Mutex
	abandoned := false
	go func() {
		v, err := op()
		mu.Lock()
		defer mu.Unlock()
		if abandoned {
			if err == nil && cleanup != nil {
				cleanup(v)
			}
			return
		}
		ch <- result{v, err}
	}()
	t := time.NewTimer(Timeout)
	defer t.Stop()
	select {
	case r := <-ch:
		return r.v, r.err
	case <-t.C:
		mu.Lock()
		abandoned = true
		mu.Unlock()
		// The result may have arrived at the same moment.
		select {
		case r := <-ch:
			return r.v, r.err
		default:
		}
		var zero T
		return zero, fmt.Errorf("%s: %w (%s)", what, ErrTimeout, Timeout)
	}
}

// File is an open regular file whose reads are bounded by a size and each
// by the deadline.
type File struct {
	f    *os.File
	max  int64 // -1: no bound
	read int64
	buf  []byte
	hung bool
}

// Read implements io.Reader: past the bound it fails with ErrTooLarge.
func (f *File) Read(p []byte) (int, error) {
	if f.max >= 0 {
		if f.read > f.max {
			return 0, fmt.Errorf("%s: %w (larger than allowed: over the %d-byte bound)", f.f.Name(), ErrTooLarge, f.max)
		}
		if rem := f.max + 1 - f.read; int64(len(p)) > rem {
			p = p[:rem]
		}
	}
	// Read into a buffer of the File's own: a read abandoned at the
	// deadline must not write into p after Read returned. The buffer is
	// reused, unless abandoned (then the file is hung: no more reads).
	if f.hung {
		return 0, fmt.Errorf("reading %s: %w (an earlier read is still blocked)", f.f.Name(), ErrTimeout)
	}
	if cap(f.buf) < len(p) {
		f.buf = make([]byte, len(p))
	}
	buf := f.buf[:len(p)]
	b, err := blocking("reading "+f.f.Name(), func() ([]byte, error) {
		n, err := f.f.Read(buf)
		return buf[:n], err
	}, nil)
	if errors.Is(err, ErrTimeout) {
		f.hung, f.buf = true, nil
	}
	n := copy(p, b)
	f.read += int64(n)
	if f.max >= 0 && f.read > f.max {
		return n, fmt.Errorf("%s: %w (grew larger than allowed while read: over the %d-byte bound)", f.f.Name(), ErrTooLarge, f.max)
	}
	return n, err
}

// Close closes the file (a read still blocked in the kernel keeps the
// descriptor until it returns).
func (f *File) Close() error { return f.f.Close() }

// Stat is the open file's fstat.
func (f *File) Stat() (os.FileInfo, error) { return f.f.Stat() }

// OS is the open *os.File, for a hot path that keeps the file open and
// re-reads it with pread into a buffer of its own (its size is the bound):
// the open had this package's checks; those reads are not under the
// deadline.
func (f *File) OS() *os.File { return f.f }

// Name is the path it was opened as.
func (f *File) Name() string { return f.f.Name() }

// Open opens path read-only without blocking and returns it only if it is
// a regular file; reads are unbounded in size (use OpenBounded or Read
// where the size is not the caller's own loop's business), each under the
// deadline.
func Open(path string) (*File, error) { return OpenBounded(path, -1) }

// OpenNoFollow is Open that also refuses a symlink as the last component.
func OpenNoFollow(path string) (*File, error) { return OpenBoundedNoFollow(path, -1) }

// OpenBounded is Open whose reads fail with ErrTooLarge past max bytes
// (max < 0: no bound).
func OpenBounded(path string, max int64) (*File, error) { return openFile(path, max, 0) }

// OpenBoundedNoFollow is OpenBounded that also refuses a symlink as the
// last component.
func OpenBoundedNoFollow(path string, max int64) (*File, error) {
	return openFile(path, max, oNoFollow)
}

func openFile(path string, max int64, extra int) (*File, error) {
	f, err := open(path, os.O_RDONLY|extra, 0)
	if err != nil {
		return nil, err
	}
	if max >= 0 {
		if fi, err := f.Stat(); err == nil && fi.Size() > max {
			f.Close()
			return nil, fmt.Errorf("%s: %w (%d bytes, larger than allowed: over the %d-byte bound)", path, ErrTooLarge, fi.Size(), max)
		}
	}
	return &File{f: f, max: max}, nil
}

// threadSelf is procfs's directory of the calling thread.
const threadSelf = "/proc/thread-self/"

// open opens path with flag|O_NONBLOCK|O_CLOEXEC under the deadline (a
// /proc/thread-self path on the calling thread) and keeps it only if it is
// a regular file.
func open(path string, flag int, perm os.FileMode) (*os.File, error) {
	var f *os.File
	var err error
	if strings.HasPrefix(path, threadSelf) {
		// /proc/thread-self names the calling thread (a caller that entered
		// a network namespace has locked it to its goroutine): resolved on
		// blocking's goroutine, another thread, it would be another
		// namespace's file. A procfs open does not hang; the reads that
		// follow go through the descriptor, bound at open.
		f, err = osOpenFile(path, flag|oNonblock, perm)
	} else {
		f, err = blocking("opening "+path, func() (*os.File, error) {
			return osOpenFile(path, flag|oNonblock, perm)
		}, func(f *os.File) { f.Close() })
	}
	if err != nil {
		return nil, err
	}
	fi, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, err
	}
	if !fi.Mode().IsRegular() {
		f.Close()
		return nil, fmt.Errorf("%s: not a regular file (%s)", path, fi.Mode().Type())
	}
	return f, nil
}

// Read reads a regular file of at most max bytes (Open's checks), refusing
// one that is, or grows while read, larger.
func Read(path string, max int64) ([]byte, error) { return read(path, max, 0) }

// ReadNoFollow is Read that also refuses a symlink as the last component.
func ReadNoFollow(path string, max int64) ([]byte, error) { return read(path, max, oNoFollow) }

func read(path string, max int64, extra int) ([]byte, error) {
	if max < 0 {
		max = 0
	}
	f, err := openFile(path, max, extra)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	// One read under the deadline for the whole file, not one per chunk.
	b, err := blocking("reading "+path, func() ([]byte, error) {
		return io.ReadAll(io.LimitReader(f.f, max+1))
	}, nil)
	if err != nil {
		return nil, err
	}
	if int64(len(b)) > max {
		// procfs files report size 0; or it grew since the Stat.
		return nil, fmt.Errorf("%s: %w (grew larger than allowed while read: over the %d-byte bound)", path, ErrTooLarge, max)
	}
	return b, nil
}

// OpenAppend opens a file the daemon owns for appending (created with perm
// if absent): never through a symlink, never a FIFO or device, under the
// deadline. The caller bounds what it writes.
func OpenAppend(path string, perm os.FileMode) (*os.File, error) {
	return open(path, os.O_WRONLY|os.O_APPEND|os.O_CREATE|oNoFollow, perm)
}

// OpenWrite opens an existing file to overwrite it (a /proc/sys or sysfs
// tunable): non-blocking, regular files only, under the deadline; it never
// creates one.
func OpenWrite(path string) (*os.File, error) {
	return open(path, os.O_WRONLY|os.O_TRUNC, 0)
}

// OpenDir opens a directory (to list it or fsync it; O_DIRECTORY: nothing
// else opens) under the deadline.
func OpenDir(path string) (*os.File, error) {
	d, err := blocking("opening "+path, func() (*os.File, error) {
		return osOpenFile(path, os.O_RDONLY|oDirectory, 0)
	}, func(f *os.File) { f.Close() })
	if err != nil {
		return nil, err
	}
	return d, nil
}
