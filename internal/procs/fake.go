package procs

import (
	"context"
	"errors"
	"hash/fnv"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
)

// Fake is a stateful in-memory Interface for tests. Processes are added with
// Add; a SIGKILL removes a process, a SIGTERM removes it unless it was added
// with IgnoreTERM. Locks are set per path with SetLocks. Every signal that
// was actually delivered is recorded in Signals.
type Fake struct {
	mu      sync.Mutex
	procs   map[int32]*FakeProcess
	locks   map[string]FileLocks
	lockErr map[string]error
	self    int32
	signals []FakeSignal
	// Err, when set, is returned by every read.
	Err error
	// PIDNamespaceErr is what CheckPIDNamespace returns.
	PIDNamespaceErr error
	// NetNS is the daemon's network namespace (SelfNetNS).
	NetNS string
	// NetKey is the daemon's network namespace key (SelfNetKey); 0: the
	// key FakeNetKey derives from NetNS.
	NetKey uint64
	// AfterSignal, when set, runs (without the fake's lock held) after a
	// signal was delivered, e.g. to make the process exec another program.
	AfterSignal func(f *Fake, pid int32, sig syscall.Signal)
}

// FakeProcess is one process of the Fake.
type FakeProcess struct {
	Process
	// IgnoreTERM makes the process survive SIGTERM (only SIGKILL removes it).
	IgnoreTERM bool
	// Unkillable makes the process survive every signal (like a process
	// stuck in D state).
	Unkillable bool
	// GoMain is the main package path of its executable's Go build
	// information ("": not a Go program).
	GoMain string
	// Listens are the TCP ports the process holds listening sockets on
	// (OwnsListener); NoPtrace makes OwnsListener fail with ErrNoPtrace.
	Listens  []uint16
	NoPtrace bool
	// CPUPerRead is the CPU time (ticks) the process uses between two
	// reads: every Find, Get or FileLocks that returns it first adds this
	// to its CPUTicks (a busy process; 0: one that makes no progress).
	CPUPerRead uint64
}

// FakeSignal is one delivered signal.
type FakeSignal struct {
	Pid int32
	Sig syscall.Signal
}

var _ Interface = (*Fake)(nil)

// NewFake returns an empty Fake whose own PID is self.
func NewFake(self int32) *Fake {
	return &Fake{procs: map[int32]*FakeProcess{}, locks: map[string]FileLocks{}, lockErr: map[string]error{}, self: self}
}

// Add adds or replaces a process.
func (f *Fake) Add(p FakeProcess) {
	f.mu.Lock()
	defer f.mu.Unlock()
	cp := p
	f.procs[p.Pid] = &cp
}

// Remove makes a process exit.
func (f *Fake) Remove(pid int32) {
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.procs, pid)
}

// SetLocks sets what FileLocks returns for path.
func (f *Fake) SetLocks(path string, l FileLocks) {
	f.mu.Lock()
	defer f.mu.Unlock()
	l.Path = path
	f.locks[path] = l
}

// SetLocksError makes FileLocks of path fail with err (for example an
// error wrapping fs.ErrNotExist for a missing lock file).
func (f *Fake) SetLocksError(path string, err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.lockErr[path] = err
}

// Signals returns the delivered signals in order.
func (f *Fake) Signals() []FakeSignal {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]FakeSignal(nil), f.signals...)
}

// Self implements Interface.
func (f *Fake) Self() int32 { return f.self }

// CheckPIDNamespace implements Interface: PIDNamespaceErr.
func (f *Fake) CheckPIDNamespace() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.PIDNamespaceErr
}

// SelfNetNS implements Interface: NetNS.
func (f *Fake) SelfNetNS() string { return f.NetNS }

// SelfNetKey implements Interface: NetKey, or FakeNetKey(NetNS).
func (f *Fake) SelfNetKey() uint64 {
	if f.NetKey != 0 {
		return f.NetKey
	}
	return FakeNetKey(f.NetNS)
}

// FakeNetKey is the NetKey the fake gives a process whose NetKey is not
// set: the inode number of its NetNS ("net:[4026531840]"), 0 for "".
func FakeNetKey(netNS string) uint64 {
	if netNS == "" {
		return 0
	}
	s := strings.TrimSuffix(strings.TrimPrefix(netNS, "net:["), "]")
	if n, err := strconv.ParseUint(s, 10, 64); err == nil {
		return n
	}
	h := fnv.New64a()
	h.Write([]byte(netNS))
	return h.Sum64() | 1
}

// Find implements Interface.
func (f *Fake) Find(_ context.Context, names []string) ([]Process, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.Err != nil {
		return nil, f.Err
	}
	want := map[string]bool{}
	for _, n := range names {
		want[n] = true
	}
	var out []Process
	for _, p := range f.procs {
		if p.Name() == "" || (len(want) > 0 && !want[p.Name()]) {
			continue
		}
		out = append(out, f.read(p))
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Pid < out[j].Pid })
	return out, nil
}

// read returns the process as a read shows it: its CPU time advanced by
// CPUPerRead (recorded), its parent's name, its network namespace's key
// from NetNS when not set, and a host cgroup when none was set.
func (f *Fake) read(fp *FakeProcess) Process {
	fp.CPUTicks += fp.CPUPerRead
	return f.withParent(fp.Process)
}

func (f *Fake) withParent(p Process) Process {
	if pp, ok := f.procs[p.PPid]; ok {
		p.ParentName = pp.Comm
	}
	p.Cmdline = append([]string(nil), p.Cmdline...)
	if p.NetKey == 0 {
		p.NetKey = FakeNetKey(p.NetNS)
	}
	if p.Cgroup.Place == CgroupUnknown {
		p.Cgroup.Place = CgroupHost
	}
	return p
}

// Get implements Interface.
func (f *Fake) Get(_ context.Context, pid int32) (Process, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.Err != nil {
		return Process{}, f.Err
	}
	p, ok := f.procs[pid]
	if !ok {
		return Process{}, ErrNotFound
	}
	return f.read(p), nil
}

// OwnsListener implements Interface: Listens, or ErrNoPtrace.
func (f *Fake) OwnsListener(_ context.Context, pid int32, port uint16) (bool, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	p, ok := f.procs[pid]
	switch {
	case !ok:
		return false, ErrNotFound
	case p.NoPtrace:
		return false, ErrNoPtrace
	}
	return slices.Contains(p.Listens, port), nil
}

// GoMain implements Interface.
func (f *Fake) GoMain(_ context.Context, pid int32) (string, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	p, ok := f.procs[pid]
	switch {
	case !ok:
		return "", ErrNotFound
	case p.GoMain == "":
		return "", errors.New("no Go build information: not a Go executable")
	}
	return p.GoMain, nil
}

// FileLocks implements Interface. Holders and waiters that no longer exist
// are left out, as the real adapter does; a path without locks set is free.
func (f *Fake) FileLocks(_ context.Context, path string) (FileLocks, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.Err != nil {
		return FileLocks{}, f.Err
	}
	if err := f.lockErr[path]; err != nil {
		return FileLocks{}, err
	}
	l, ok := f.locks[path]
	if !ok {
		return FileLocks{Path: path}, nil
	}
	out := FileLocks{Path: path, Dev: l.Dev, LockPIDs: append([]int32(nil), l.LockPIDs...), HoldersFrom: l.HoldersFrom}
	for _, h := range l.Holders {
		if p, ok := f.procs[h.Pid]; ok && p.CreateTimeMs == h.CreateTimeMs {
			out.Holders = append(out.Holders, f.read(p))
		}
	}
	for _, w := range l.Waiters {
		if p, ok := f.procs[w.Pid]; ok && p.CreateTimeMs == w.CreateTimeMs {
			out.Waiters = append(out.Waiters, f.read(p))
		}
	}
	// The lock is held while a holder lives (or, like an invisible holder,
	// when it was set without holders).
	out.Held = l.Held && (len(out.Holders) > 0 || len(l.Holders) == 0)
	return out, nil
}

// Signal implements Interface with the same identity checks as Real.
func (f *Fake) Signal(_ context.Context, pid int32, createTimeMs int64, sig syscall.Signal) error {
	f.mu.Lock()
	p, ok := f.procs[pid]
	if !ok {
		f.mu.Unlock()
		return ErrNotFound
	}
	if p.CreateTimeMs != createTimeMs {
		f.mu.Unlock()
		return ErrNotSame
	}
	f.signals = append(f.signals, FakeSignal{Pid: pid, Sig: sig})
	switch {
	case p.Unkillable:
	case sig == syscall.SIGKILL, sig == syscall.SIGTERM && !p.IgnoreTERM:
		delete(f.procs, pid)
	}
	after := f.AfterSignal
	f.mu.Unlock()
	if after != nil {
		after(f, pid, sig)
	}
	return nil
}

// MustGet returns a process of the fake (with ParentName filled in); it
// panics when absent. For building lock states in tests.
func (f *Fake) MustGet(pid int32) Process {
	p, err := f.Get(context.Background(), pid)
	if err != nil {
		panic(err)
	}
	return p
}
