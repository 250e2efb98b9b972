// Package procs reads processes and file locks through a procfs root
// (--proc-root) and signals processes only after re-checking their identity.
//
// A process is identified by its PID and its create time in milliseconds
// since the epoch (derived from /proc/<pid>/stat starttime and the boot time
// of the proc root); a PID with a different create time is another process.
// Interface is what detectors read and what the KillProcess action uses; the
// real implementation is New, the stateful fake is Fake.
package procs

import (
	"context"
	"errors"
	"path/filepath"
	"syscall"
	"time"
)

// ErrNotFound is returned when no process with that PID exists (or it is a
// zombie, which holds nothing and cannot be signalled meaningfully).
var ErrNotFound = errors.New("process not found")

// ErrNotSame is returned when the PID now belongs to another process (its
// create time differs): the original process is gone and the PID was reused.
var ErrNotSame = errors.New("pid belongs to another process (create time differs)")

// Process is a snapshot of one process.
type Process struct {
	// Pid and PPid as seen in the proc root's PID namespace.
	Pid  int32 `json:"pid"`
	PPid int32 `json:"ppid"`
	// Comm is the kernel's 15-character command name. Do not match on it:
	// a multi-call binary shows its own name (iptables-legacy-restore has
	// comm "iptables-legacy").
	Comm string `json:"comm"`
	// ParentName is the parent's comm ("" when the parent is not visible).
	ParentName string `json:"parentName"`
	// Cmdline is argv (empty for kernel threads).
	Cmdline []string `json:"cmdline"`
	// CreateTimeMs is the start time in ms since the epoch.
	CreateTimeMs int64 `json:"createTimeMs"`
	// State is the one-letter state from /proc/<pid>/stat: R, S, D
	// (uninterruptible, "blocked"), Z, T, ...
	State string `json:"state"`
}

// Name returns the basename of argv[0], the name policies match on ("" for
// kernel threads).
func (p Process) Name() string { return ArgvName(p.Cmdline) }

// ArgvName returns the basename of argv[0], or "".
func ArgvName(argv []string) string {
	if len(argv) == 0 || argv[0] == "" {
		return ""
	}
	return filepath.Base(argv[0])
}

// Age is how long the process has existed at now.
func (p Process) Age(now time.Time) time.Duration {
	return now.Sub(time.UnixMilli(p.CreateTimeMs))
}

// Blocked reports whether the process is in uninterruptible sleep (D).
func (p Process) Blocked() bool { return p.State == "D" }

// Target returns the stable finding target "process/<pid>@<createTimeMs>".
func (p Process) Target() string { return Target(p.Pid, p.CreateTimeMs) }

// FileLocks describes the locks on one file.
type FileLocks struct {
	// Path is the file asked about and Dev its "maj:min:inode" key as
	// /proc/locks prints it.
	Path string `json:"path"`
	Dev  string `json:"dev"`
	// Held is true when /proc/locks shows a granted lock on the file.
	Held bool `json:"held"`
	// LockPIDs are the PIDs /proc/locks shows for the granted locks: the
	// process that called flock, which may have exited (a child holding the
	// inherited descriptor keeps the lock) or be 0/-1 (invisible, OFD lock).
	LockPIDs []int32 `json:"lockPIDs"`
	// Holders are the live processes with an open descriptor on the file
	// whose /proc/<pid>/fdinfo/<fd> lists a granted lock ("lock:" line):
	// the real holders, as lsof reports them.
	Holders []Process `json:"holders"`
	// Waiters are the processes blocked waiting for a lock on the file
	// ("->" lines). A waiter that exited between reads is left out.
	Waiters []Process `json:"waiters"`
}

// Interface reads processes and locks and signals processes. Implementations
// must be goroutine-safe.
type Interface interface {
	// Find returns the live processes whose argv[0] basename is one of
	// names (all processes when names is empty). Kernel threads and
	// zombies are never returned.
	Find(ctx context.Context, names []string) ([]Process, error)
	// Get returns the process with that PID, or ErrNotFound.
	Get(ctx context.Context, pid int32) (Process, error)
	// FileLocks returns who holds and who waits for locks on path.
	FileLocks(ctx context.Context, path string) (FileLocks, error)
	// Signal sends sig to pid only if it is still the process created at
	// createTimeMs; otherwise it returns ErrNotFound or ErrNotSame and
	// sends nothing.
	Signal(ctx context.Context, pid int32, createTimeMs int64, sig syscall.Signal) error
	// Self returns the PID of this daemon in the proc root's namespace.
	Self() int32
}

// Alive reports whether pid is still the process created at createTimeMs.
func Alive(ctx context.Context, p Interface, pid int32, createTimeMs int64) (bool, error) {
	cur, err := p.Get(ctx, pid)
	if errors.Is(err, ErrNotFound) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	return cur.CreateTimeMs == createTimeMs, nil
}
