// Package boundedfile opens and reads files the daemon does not control
// (the host's root, /proc, /sys, a mounted CNI config, its own state dir,
// which an intruder may have replaced) with a bounded answer: it never
// blocks on a FIFO or device planted where a file is expected (the open is
// non-blocking and anything but a regular file is refused; procfs, sysfs
// and cgroupfs files are regular) and never reads more than the caller's
// bound.
package boundedfile

import (
	"fmt"
	"io"
	"os"
)

// Open opens path read-only without blocking and returns it only if it is
// a regular file.
func Open(path string) (*os.File, error) { return open(path, 0) }

// OpenNoFollow is Open that also refuses a symlink as the last component.
func OpenNoFollow(path string) (*os.File, error) { return open(path, oNoFollow) }

func open(path string, extra int) (*os.File, error) {
	f, err := os.OpenFile(path, os.O_RDONLY|oNonblock|extra, 0)
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
	f, err := open(path, extra)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	if fi, err := f.Stat(); err == nil && fi.Size() > max {
		return nil, fmt.Errorf("%s: too large (%d bytes, larger than allowed: over the %d-byte bound)", path, fi.Size(), max)
	}
	b, err := io.ReadAll(io.LimitReader(f, max+1))
	if err != nil {
		return nil, err
	}
	if int64(len(b)) > max {
		// procfs files report size 0; or it grew since the Stat.
		return nil, fmt.Errorf("%s: too large (grew larger than allowed while read: over the %d-byte bound)", path, max)
	}
	return b, nil
}
