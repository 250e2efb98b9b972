//go:build linux

package sysctl

import (
	"fmt"
	"os"
	"runtime"
	"strings"

	"golang.org/x/sys/unix"
)

// NetNS is an Interface for the per-network-namespace keys (net.*) of
// another network namespace: /proc/sys/net shows the namespace of the
// thread that opens the file, so each Get and Set opens it from a thread
// locked to a goroutine of its own, which joins the namespace, opens the
// file and returns to its namespace before unlocking (a thread that cannot
// return stays locked and the runtime discards it: no other goroutine ever
// runs in the namespace). Keys outside net.* are the
// same in every namespace. Needs CAP_SYS_ADMIN (setns).
type NetNS struct {
	// FS resolves keys to files (its ProcRoot).
	FS *FS
	// FD is an open file descriptor of the network namespace.
	FD int
}

var _ Interface = (*NetNS)(nil)

// NewNetNS returns the Interface for the namespace fd (0 means the
// caller's own: plain FS).
func NewNetNS(procRoot string, fd int) Interface {
	if fd == 0 {
		return New(procRoot)
	}
	return &NetNS{FS: New(procRoot), FD: fd}
}

// open opens path with flag from a thread inside the namespace.
func (n *NetNS) open(path string, flag int) (*os.File, error) {
	type result struct {
		f   *os.File
		err error
	}
	ch := make(chan result, 1)
	go func() {
		runtime.LockOSThread()
		orig, err := os.Open("/proc/thread-self/ns/net")
		if err != nil {
			runtime.UnlockOSThread()
			ch <- result{err: fmt.Errorf("open this thread's network namespace: %w", err)}
			return
		}
		defer orig.Close()
		if err := unix.Setns(n.FD, unix.CLONE_NEWNET); err != nil {
			runtime.UnlockOSThread()
			ch <- result{err: fmt.Errorf("setns to network namespace fd %d: %w", n.FD, err)}
			return
		}
		f, err := os.OpenFile(path, flag, 0)
		ch <- result{f, err}
		// Back to where the thread was; if that fails the thread stays
		// locked to this ending goroutine and the runtime discards it, so
		// no other goroutine ever runs in the namespace.
		if unix.Setns(int(orig.Fd()), unix.CLONE_NEWNET) == nil {
			runtime.UnlockOSThread()
		}
	}()
	r := <-ch
	return r.f, r.err
}

// Get implements Interface.
func (n *NetNS) Get(key string) (string, error) {
	p, err := n.FS.Path(key)
	if err != nil {
		return "", err
	}
	f, err := n.open(p, os.O_RDONLY)
	if err != nil {
		return "", fmt.Errorf("read %s: %w", p, err)
	}
	defer f.Close()
	b := make([]byte, 256)
	m, err := f.Read(b)
	if err != nil {
		return "", fmt.Errorf("read %s: %w", p, err)
	}
	return strings.TrimSpace(string(b[:m])), nil
}

// Set implements Interface (one write, as WriteFile).
func (n *NetNS) Set(key, value string) error {
	p, err := n.FS.Path(key)
	if err != nil {
		return err
	}
	f, err := n.open(p, os.O_WRONLY|os.O_TRUNC)
	if err != nil {
		return fmt.Errorf("open %s for writing: %w", p, err)
	}
	return writeClose(f, p, value)
}
