package procs

import (
	"context"
	"debug/buildinfo"
	"errors"
	"fmt"
	"os"
	"strconv"
	"time"

	"golang.org/x/sys/unix"
)

// goMainTimeout bounds GoMain when ctx has no deadline.
const goMainTimeout = 5 * time.Second

// GoMain implements Interface: it opens the executable the process runs
// (/proc/<pid>/exe, the file itself even when deleted or replaced) and
// reads the main package path from its Go build information. It does not
// follow argv or PATH, never blocks on a FIFO (O_NONBLOCK, regular files
// only) and gives up at ctx's deadline (5 s without one).
func (r *Real) GoMain(ctx context.Context, pid int32) (string, error) {
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, goMainTimeout)
		defer cancel()
	}
	f, err := os.OpenFile(r.path(strconv.Itoa(int(pid)), "exe"), os.O_RDONLY|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return "", ErrNotFound
		}
		return "", fmt.Errorf("opening pid %d's executable: %w", pid, err)
	}
	if fi, err := f.Stat(); err != nil || !fi.Mode().IsRegular() {
		f.Close()
		return "", fmt.Errorf("pid %d's executable is not a regular file", pid)
	}
	type res struct {
		path string
		err  error
	}
	ch := make(chan res, 1)
	go func() {
		defer f.Close()
		bi, err := buildinfo.Read(f)
		if err != nil {
			ch <- res{err: fmt.Errorf("no Go build information: %w", err)}
			return
		}
		ch <- res{path: bi.Path}
	}()
	select {
	case r := <-ch:
		return r.path, r.err
	case <-ctx.Done():
		return "", fmt.Errorf("reading pid %d's executable: %w", pid, ctx.Err())
	}
}
