// Package lockwatch measures every hold of the xtables lock on the node,
// sub-second ones included, without ever taking the lock.
//
// The daemon samples /proc/locks once per cycle, which cannot see a hold
// shorter than a cycle and cannot tell one long hold from many short ones.
// A Watcher instead sleeps on inotify events of the lock file (every
// iptables-legacy command opens it before it flocks it and closes it when
// it is done) and, while the file is in use, samples /proc/locks in a short
// burst (every BurstPoll), resolving each new hold's real holder through
// fdinfo once. Its cost is therefore proportional to lock activity: an
// idle node costs one blocked poll(2). A process that keeps the file open
// and flocks it repeatedly (no open event per hold) is polled every
// OpenerPoll while it keeps the file open.
//
// Holds are reported as observed: a program that takes the lock for 2 s
// every 5 s gives one Hold of about 2 s per take, each with its holder
// (program, pid, kube-proxy or not, pod and container from the cgroup)
// and its waiters, kept in a bounded ring, and a hold-time histogram by
// holder program (a bounded set of labels).
//
// The tracker that turns samples into holds is a pure state machine over
// (samples, now); the Watcher adds the inotify loop and procfs reads.
package lockwatch

import (
	"slices"
	"sort"
	"time"

	"github.com/remediate-dev/remediate/internal/procident"
	"github.com/remediate-dev/remediate/internal/procs"
)

// Proc is a holder or waiter of the lock as the watcher saw it.
type Proc struct {
	// Pid and CreateTimeMs identify the process (procs.Ref).
	Pid          int32 `json:"pid"`
	CreateTimeMs int64 `json:"createTimeMs,omitempty"`
	// Program is argv[0]'s basename ("" when the process was gone before
	// it could be read).
	Program string `json:"program"`
	// Parent is the parent's comm.
	Parent string `json:"parent,omitempty"`
	// KubeProxy is true when the process is kube-proxy or its child (its
	// iptables-restore).
	KubeProxy bool `json:"kubeProxy,omitempty"`
	// PodUID and Container come from /proc/<pid>/cgroup ("" outside a pod).
	PodUID    string `json:"podUID,omitempty"`
	Container string `json:"container,omitempty"`
	// Since is when the watcher first saw it holding (or waiting) and
	// Until when it last did.
	Since time.Time `json:"since"`
	Until time.Time `json:"until"`
	// SeenStart is true for a waiter the watcher saw begin to wait (it
	// was not waiting at the previous sample, and nothing was missed in
	// between): Since is then when its wait began. Otherwise it was
	// already waiting when first seen.
	SeenStart bool `json:"seenStart,omitempty"`
}

// Hold is one continuous hold of the lock as observed.
type Hold struct {
	// Start is the first sample that saw the lock held, End the first
	// that saw it free again (or held by another process); End is zero
	// while the hold goes on.
	Start time.Time `json:"start"`
	End   time.Time `json:"end,omitempty"`
	// Exact is true when the watcher saw the lock free (or held by
	// another) one sample before Start, so Start is right to within a
	// sample interval; otherwise the hold began earlier than Start and
	// Duration is a lower bound.
	Exact bool `json:"exact"`
	// LockPIDs are the pids /proc/locks showed for the granted lock (the
	// flock caller; 0 when not visible in this PID namespace).
	LockPIDs []int32 `json:"lockPIDs"`
	// Holders are the real holders (fdinfo); empty when not visible.
	Holders []Proc `json:"holders"`
	// Waiters are the processes seen waiting during the hold (at most
	// MaxWaitersPerHold), MaxWaiting the most waiting at once.
	Waiters    []Proc `json:"waiters,omitempty"`
	MaxWaiting int    `json:"maxWaiting"`
	// Unsampled marks a use of the lock file too short for any sample to
	// see the lock held (a small iptables command holds it for well under
	// a millisecond): the file was opened at Start and every opener had
	// closed it at End, with no hold seen in between. Start and End are
	// when the watcher woke for those events (about a millisecond late);
	// its Duration includes any wait, and its holder is not known.
	Unsampled bool `json:"unsampled,omitempty"`
}

// MaxWaitersPerHold bounds the waiters remembered per hold.
const MaxWaitersPerHold = 8

// maxHoldersPerHold bounds the holders remembered per hold.
const maxHoldersPerHold = 4

// Duration is how long the hold lasted (up to now while it goes on).
func (h Hold) Duration(now time.Time) time.Duration {
	end := h.End
	if end.IsZero() {
		end = now
	}
	if end.Before(h.Start) {
		return 0
	}
	return end.Sub(h.Start)
}

// Program is the program the hold is attributed to: its first holder's,
// "unknown" when no holder was visible.
func (h Hold) Program() string {
	if h.Unsampled {
		return Unsampled
	}
	for _, p := range h.Holders {
		if p.Program != "" {
			return p.Program
		}
	}
	return Unknown
}

// KubeProxy reports whether a holder is kube-proxy's.
func (h Hold) KubeProxy() bool {
	for _, p := range h.Holders {
		if p.KubeProxy {
			return true
		}
	}
	return false
}

// Unknown is the program of a hold whose holder was not visible (another
// PID namespace, or gone before it could be read).
const Unknown = "unknown"

// Unsampled is the program of an Unsampled hold.
const Unsampled = "unsampled"

// Other is the histogram label of every program not in KnownPrograms.
const Other = "other"

// KnownPrograms are the holder programs the histogram has a label of their
// own for; any other program counts as Other. The set is fixed so the
// metric's cardinality is bounded whatever runs on the node.
var KnownPrograms = []string{
	"iptables", "ip6tables", "iptables-legacy", "ip6tables-legacy",
	"iptables-restore", "ip6tables-restore", "iptables-legacy-restore", "ip6tables-legacy-restore",
	"iptables-save", "ip6tables-save", "flock", "kube-proxy",
}

// Label is the histogram label of a program: itself when known, else
// Other (Unknown stays Unknown).
func Label(program string) string {
	if program == Unknown || program == Unsampled {
		return program
	}
	for _, k := range KnownPrograms {
		if k == program {
			return program
		}
	}
	return Other
}

// Labels are every program label, in a stable order.
func Labels() []string {
	return append(append([]string(nil), KnownPrograms...), Other, Unknown, Unsampled)
}

// Buckets are the hold-time histogram's upper bounds in seconds: from a
// quick iptables command (~10 ms) to the field guide's micro-outages
// (1-3 s) and beyond kube-proxy's 5 s restore wait.
var Buckets = []float64{0.01, 0.05, 0.1, 0.25, 0.5, 1, 2, 3, 5, 10, 30, 60}

// Histogram is a cumulative hold-time histogram of one label.
type Histogram struct {
	// Counts[i] counts holds of at most Buckets[i] seconds (cumulative,
	// as Prometheus buckets are).
	Counts []uint64
	Count  uint64
	Sum    float64
}

func (h *Histogram) observe(sec float64) {
	if h.Counts == nil {
		h.Counts = make([]uint64, len(Buckets))
	}
	for i := sort.SearchFloat64s(Buckets, sec); i < len(Buckets); i++ {
		h.Counts[i]++
	}
	h.Count++
	h.Sum += sec
}

// HistKey is a histogram series: the holder program's label and whether
// the holder was kube-proxy's.
type HistKey struct {
	Program   string
	KubeProxy bool
}

// Status says whether and how the watcher runs.
type Status struct {
	// Running is true between Start and Close.
	Running bool `json:"running"`
	// Since is when it started.
	Since time.Time `json:"since"`
	// Mode is "inotify" (sub-second holds seen), "poll" (inotify not
	// usable: holds shorter than PollFallback may be missed) or "" before
	// Start.
	Mode string `json:"mode"`
	// Err is the last error reading the lock (for example the lock file
	// does not exist yet), "" when none.
	Err string `json:"err,omitempty"`
	// Samples counts /proc/locks reads, Resolves holder resolutions,
	// Opens the lock file's opens (inotify).
	Samples  uint64 `json:"samples"`
	Resolves uint64 `json:"resolves"`
	Opens    uint64 `json:"opens"`
}

// Reader is what detectors use: the watcher, or Fake in tests.
// Implementations are goroutine-safe.
type Reader interface {
	// Start starts watching if it is not running (idempotent); the
	// watcher then runs until Close.
	Start() error
	// Holds returns the holds that ended at or after since, oldest first,
	// and the hold going on now, if any, last.
	Holds(since time.Time) []Hold
	// Status says whether and how it runs.
	Status() Status
}

func procFrom(p procs.Process, now time.Time) Proc {
	name := p.Name()
	return Proc{Pid: p.Pid, CreateTimeMs: p.CreateTimeMs, Program: name, Parent: p.ParentName,
		KubeProxy: slices.Contains(procident.ProxyPrograms, name) || slices.Contains(procident.ProxyPrograms, p.ParentName), Since: now, Until: now}
}
