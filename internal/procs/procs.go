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

	"github.com/remediate-dev/remediate/internal/clip"
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
	// Exe is the executable as the kernel resolves /proc/<pid>/exe (a
	// " (deleted)" suffix removed), "" when it cannot be read here. Unlike
	// argv[0] it cannot be chosen by the process.
	Exe string `json:"exe,omitempty"`
	// CapEff is the effective capability set from /proc/<pid>/status
	// (0 when unreadable).
	CapEff uint64 `json:"capEff,omitempty"`
	// NetNS is the network namespace as /proc/<pid>/ns/net names it
	// ("net:[4026531840]"), "" when it cannot be read here.
	NetNS string `json:"netns,omitempty"`
	// Cgroup is the pod (UID, container) whose cgroup the process is in,
	// from /proc/<pid>/cgroup: readable without ptrace, and not chosen by
	// the process (the identity of kube-proxy and the node agents,
	// checked against the API).
	Cgroup Cgroup `json:"cgroup"`
	// NetKey names the network namespace without ptrace: the inode of
	// /proc/<pid>/net/dev, which the kernel gives per network namespace
	// (the same for every process in one); 0 when unreadable. Compare it
	// with Interface.SelfNetKey, never with NetNS.
	NetKey uint64 `json:"netKey,omitempty"`
	// CPUTicks is the CPU time the process has used (utime+stime of
	// /proc/<pid>/stat, in USER_HZ ticks): progress, readable without
	// ptrace.
	CPUTicks uint64 `json:"cpuTicks"`
}

// TicksPerSecond is the unit of CPUTicks (USER_HZ).
const TicksPerSecond = userHZ

// CPUSeconds is the CPU time the process has used.
func (p Process) CPUSeconds() float64 { return float64(p.CPUTicks) / TicksPerSecond }

// CapNetAdmin is the bit of CAP_NET_ADMIN in a capability set.
const CapNetAdmin = 1 << 12

// NetfilterPrograms are the executables (basenames of /proc/<pid>/exe) that
// iptables, ip6tables and nft commands really run: the xtables multi-call
// binaries every iptables-*-restore name links to, and nft.
var NetfilterPrograms = []string{"xtables-legacy-multi", "xtables-nft-multi", "xtables-multi", "nft"}

// Name returns the basename of argv[0], the name policies match on ("" for
// kernel threads).
func (p Process) Name() string { return ArgvName(p.Cmdline) }

// ArgvName returns the basename of argv[0], or "".
func ArgvName(argv []string) string {
	if len(argv) == 0 || argv[0] == "" {
		return ""
	}
	// No program name is longer; a longer argv[0] is clipped (and
	// matches no name).
	return clip.String(filepath.Base(clip.String(argv[0], 4096)), 255)
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
	// HoldersFrom says how Holders were found: HoldersFromFDInfo (every
	// descriptor on the file whose fdinfo lists a granted lock, as lsof:
	// needs CAP_SYS_PTRACE over the holder) or HoldersFromProcLocks (the
	// live processes /proc/locks names as the lock's callers: no ptrace,
	// but a child holding an inherited descriptor after its caller exited
	// is not found); "" when the lock is free.
	HoldersFrom string `json:"holdersFrom,omitempty"`
	// LockPIDs are the PIDs /proc/locks shows for the granted locks: the
	// process that called flock, which may have exited (a child holding the
	// inherited descriptor keeps the lock) or be 0/-1 (invisible, OFD lock).
	LockPIDs []int32 `json:"lockPIDs"`
	// Holders are the processes holding the lock (HoldersFrom says how
	// they were found): with fd access, the live processes with an open
	// descriptor on the file whose /proc/<pid>/fdinfo/<fd> lists a granted
	// lock, as lsof reports them; without it, the live processes of
	// LockPIDs (a caller that exited leaves its PID, which may be reused:
	// XtablesLockContention drops a caller created after the watched hold
	// began).
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
	// CheckPIDNamespace returns nil when the proc root shows this
	// daemon's own PID namespace, so that a PID read there is the PID a
	// signal reaches; otherwise the reason.
	CheckPIDNamespace() error
	// SelfNetNS is this daemon's network namespace (the node's, with
	// hostNetwork) in the form of Process.NetNS, "" when unknown.
	SelfNetNS() string
	// SelfNetKey is this daemon's network namespace in the form of
	// Process.NetKey (read the same way, without ptrace), 0 when unknown.
	SelfNetKey() uint64
	// OwnsListener reports whether pid holds a socket listening on TCP
	// port in its network namespace (a second opinion on whose endpoint
	// is silent): ErrNoPtrace when its descriptors cannot be read.
	OwnsListener(ctx context.Context, pid int32, port uint16) (bool, error)
	// GoMain returns the main package path recorded in the Go build
	// information of the executable pid runs (not its argv), or an error
	// when it is not a Go program or cannot be read (identity.go).
	GoMain(ctx context.Context, pid int32) (string, error)
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
