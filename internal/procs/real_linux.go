package procs

import (
	"bufio"
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"math"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/shirou/gopsutil/v3/common"
	"github.com/shirou/gopsutil/v3/process"
	"golang.org/x/sys/unix"

	"github.com/remediate-dev/remediate/internal/boundedfile"
)

// userHZ is the unit of /proc/<pid>/stat starttime. It is USER_HZ, fixed at
// 100 by the kernel ABI on every architecture Kubernetes nodes run on.
const userHZ = 100

// Real reads a procfs mount. The process scans of Find and CommRunning
// list PIDs with getdents64 (scanComms); the lock holders' PIDs and whole
// argv go through gopsutil (with the proc root as the per-call HostProc
// value); the rest reads /proc/<pid>/stat directly, once per process:
// gopsutil would read stat three times (ppid, create time, status),
// re-detect virtualization for the boot time on every CreateTime unless a
// process-global cache is enabled, and truncates the create time to whole
// seconds.
type Real struct {
	root string
	ctx  func(context.Context) context.Context

	mu       sync.Mutex
	bootTime int64 // seconds since the epoch, read once: identities must be stable

	// scanMu serialises Find's scans over argv, the argv[0] basenames
	// of the last scan by PID (see Find).
	scanMu   sync.Mutex
	argv     map[int32]argvEntry
	scans    uint64    // comm scans Find has used (the Finds of one cycle share one)
	lastScan *commScan // the comm scan of the last Find
}

var _ Interface = (*Real)(nil)

// New returns the real adapter reading the procfs mounted at root
// ("/proc" when empty). Signals go to PIDs of the caller's PID namespace,
// so root must be the procfs of that namespace (hostPID for a DaemonSet).
func New(root string) *Real {
	if root == "" {
		root = "/proc"
	}
	r := &Real{root: root}
	r.ctx = func(ctx context.Context) context.Context {
		return context.WithValue(ctx, common.EnvKey, common.EnvMap{common.HostProcEnvKey: root})
	}
	return r
}

func (r *Real) path(parts ...string) string {
	return filepath.Join(append([]string{r.root}, parts...)...)
}

func (r *Real) boot() (int64, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.bootTime != 0 {
		return r.bootTime, nil
	}
	b, err := boundedfile.Read(r.path("stat"), 16<<20)
	if err != nil {
		return 0, fmt.Errorf("reading boot time: %w", err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "btime "); ok {
			t, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
			if err != nil {
				return 0, fmt.Errorf("bad btime %q in %s: %w", v, r.path("stat"), err)
			}
			r.bootTime = t
			return t, nil
		}
	}
	return 0, fmt.Errorf("no btime in %s", r.path("stat"))
}

// Self implements Interface.
func (r *Real) Self() int32 {
	if l, err := os.Readlink(r.path("self")); err == nil {
		if p, err := strconv.Atoi(l); err == nil {
			return int32(p)
		}
	}
	return int32(os.Getpid())
}

func (r *Real) stat(pid int32) (statFields, error) {
	b, err := boundedfile.Read(r.path(strconv.Itoa(int(pid)), "stat"), 4096)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) || errors.Is(err, syscall.ESRCH) {
			return statFields{}, ErrNotFound
		}
		return statFields{}, fmt.Errorf("pid %d: %w", pid, err)
	}
	return parseStat(b)
}

func (r *Real) createTimeMs(s statFields) (int64, error) {
	bt, err := r.boot()
	if err != nil {
		return 0, err
	}
	return bt*1000 + int64(s.startTick*1000/userHZ), nil
}

// get builds a Process; argv may be passed when already read.
func (r *Real) get(ctx context.Context, pid int32, argv []string) (Process, error) {
	s, err := r.stat(pid)
	if err != nil {
		return Process{}, err
	}
	if s.state == "Z" || s.state == "X" {
		return Process{}, ErrNotFound
	}
	ct, err := r.createTimeMs(s)
	if err != nil {
		return Process{}, err
	}
	if argv == nil {
		argv, err = (&process.Process{Pid: pid}).CmdlineSliceWithContext(r.ctx(ctx))
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) || errors.Is(err, syscall.ESRCH) {
				return Process{}, ErrNotFound
			}
			return Process{}, fmt.Errorf("pid %d cmdline: %w", pid, err)
		}
	}
	p := Process{Pid: pid, PPid: s.ppid, Comm: s.comm, Cmdline: argv, CreateTimeMs: ct, State: s.state, CPUTicks: s.cpuTicks}
	r.identity(&p)
	if s.ppid > 0 {
		if ps, err := r.stat(s.ppid); err == nil {
			p.ParentName = ps.comm
		}
	}
	return p, nil
}

// identity fills what the process cannot choose: its cgroup, its
// effective capabilities and its network namespace's key (readable
// without ptrace), its executable and network namespace (readable with
// CAP_SYS_PTRACE over it). Each is left empty when unreadable (or the
// process exited).
func (r *Real) identity(p *Process) {
	ps := strconv.Itoa(int(p.Pid))
	if c, err := readCgroup(r.root, p.Pid); err == nil {
		p.Cgroup = c
	}
	p.NetKey = netKey(r.path(ps, "net", "dev"))
	if exe, err := os.Readlink(r.path(ps, "exe")); err == nil {
		p.Exe = strings.TrimSuffix(exe, " (deleted)")
	}
	if b, err := readBounded(r.path(ps, "status"), 64<<10); err == nil {
		p.CapEff, _ = parseCapEff(b)
	}
	if ns, err := os.Readlink(r.path(ps, "ns", "net")); err == nil {
		p.NetNS = ns
	}
}

// parseCapEff returns the CapEff mask of a /proc/<pid>/status.
func parseCapEff(status []byte) (uint64, bool) {
	for _, line := range bytes.Split(status, []byte("\n")) {
		if v, ok := bytes.CutPrefix(line, []byte("CapEff:")); ok {
			c, err := strconv.ParseUint(string(bytes.TrimSpace(v)), 16, 64)
			if err != nil {
				return 0, false
			}
			return c, true
		}
	}
	return 0, false
}

// readBounded reads at most max bytes of a (proc) file.
func readBounded(path string, max int64) ([]byte, error) {
	f, err := boundedfile.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return io.ReadAll(io.LimitReader(f, max))
}

// CheckPIDNamespace implements Interface: the proc root's "self" must be
// this process's own PID, else a PID read there names another process
// (or none) in the namespace signals are sent in.
func (r *Real) CheckPIDNamespace() error {
	l, err := os.Readlink(r.path("self"))
	if err != nil {
		return fmt.Errorf("proc root %s does not show this process (%v): it is the procfs of another PID namespace; signals would reach other processes (run with hostPID: true, or point --proc-root at this PID namespace's procfs)", r.root, err)
	}
	if l != strconv.Itoa(os.Getpid()) {
		return fmt.Errorf("proc root %s shows this process as pid %s, but it is pid %d in its own PID namespace: signals would reach other processes (run with hostPID: true, or point --proc-root at this PID namespace's procfs)", r.root, l, os.Getpid())
	}
	return nil
}

// netKey is the inode of a /proc/<pid>/net/dev: the kernel shows one
// proc_net directory per network namespace, and stat (unlike readlink of
// ns/net) needs no ptrace access to the process. 0 when unreadable.
func netKey(path string) uint64 {
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		return 0
	}
	return st.Ino
}

// SelfNetKey implements Interface.
func (r *Real) SelfNetKey() uint64 {
	if k := netKey(r.path("self", "net", "dev")); k != 0 {
		return k
	}
	return netKey("/proc/self/net/dev")
}

// SelfNetNS implements Interface.
func (r *Real) SelfNetNS() string {
	if ns, err := os.Readlink(r.path("self", "ns", "net")); err == nil {
		return ns
	}
	ns, _ := os.Readlink("/proc/self/ns/net")
	return ns
}

// Get implements Interface.
func (r *Real) Get(ctx context.Context, pid int32) (Process, error) {
	if pid <= 0 {
		return Process{}, ErrNotFound
	}
	return r.get(ctx, pid, nil)
}

// refreshScans is how often Find reads every process's argv again even
// when its comm is unchanged (every refreshScans-th comm scan, the first
// included; the Finds of a cycle share one comm scan and read each argv
// at most once for it): it bounds how long an argv rewritten in place
// (setproctitle) goes unseen.
const refreshScans = 10

// argvEntry is what a scan remembers of a process: its /proc/<pid> inode
// and comm when argv[0] was read, and argv[0]'s basename.
type argvEntry struct {
	ino        uint64
	comm, name string
	scan       uint64 // the last scan that saw the PID
	read       uint64 // the scan in which argv[0] was read
	// emptyOnce is set when argv[0] was read empty for the first time: a
	// process in the middle of execve shows its new comm before its new
	// argv (the kernel sets the comm in begin_new_exec and the argument
	// area's bounds later, in the binary loader's create_elf_tables, and
	// cmdline reads empty until then), so an empty argv is read again at
	// the next scan before it is taken for a kernel thread's or zombie's.
	emptyOnce bool
}

// Find implements Interface. For every process it uses only the comm of
// the cycle's shared scan (scanComms: a small file that needs no lock on
// the process's memory, unlike cmdline, and read again only for a process
// new to the scan, once more at the next scan, and every commRefresh);
// argv[0] is read when the process is new (a PID not seen, or seen with
// another /proc/<pid> inode: another process) or its comm changed since
// argv[0] was read (exec sets the comm: an iptables-restore started by
// kube-proxy's fork is a new comm, and a process that calls itself
// iptables-restore with exec -a is new), and for every process on each
// refreshScans-th scan. The rest is read only for matches, whole and
// fresh: what is remembered can delay a match, never make one.
func (r *Real) Find(ctx context.Context, names []string) ([]Process, error) {
	if len(names) == 0 {
		pids, err := r.pids()
		if err != nil {
			return nil, err
		}
		var out []Process
		for _, pid := range pids {
			if err := ctx.Err(); err != nil {
				return nil, err
			}
			p, err := r.get(ctx, pid, nil)
			if err != nil || len(p.Cmdline) == 0 {
				continue // exited, or a kernel thread
			}
			out = append(out, p)
		}
		return out, nil
	}
	want := map[string]bool{}
	for _, n := range names {
		want[n] = true
	}
	scan, err := scanComms(r.root)
	if err != nil {
		return nil, err
	}
	r.scanMu.Lock()
	defer r.scanMu.Unlock()
	if r.argv == nil {
		r.argv = map[int32]argvEntry{}
	}
	if scan != r.lastScan {
		r.scans++
		r.lastScan = scan
	}
	full := r.scans%refreshScans == 1
	buf := make([]byte, 4096)
	var out []Process
	for i := range scan.procs {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		pid, ino, comm := scan.procs[i].pid, scan.procs[i].ino, scan.procs[i].comm
		e, seen := r.argv[pid]
		if !seen || e.ino != ino || ino <= 1 || e.comm != comm || (full && e.read != r.scans) || (e.name == "" && !e.emptyOnce && e.read != r.scans) {
			// Read empty once already (same process, same comm): this
			// second empty answer is a kernel thread's or a zombie's.
			again := seen && e.ino == ino && e.comm == comm && e.name == "" && e.read != r.scans
			// argv[0] ends at the first NUL; a longer one is clipped
			// by ArgvName anyway.
			argv0, ok := readSmall(r.path(strconv.Itoa(int(pid)), "cmdline"), buf)
			if !ok {
				delete(r.argv, pid)
				continue
			}
			if i := strings.IndexByte(argv0, 0); i >= 0 {
				argv0 = argv0[:i]
			}
			e = argvEntry{ino: ino, comm: comm, name: ArgvName([]string{argv0}), read: r.scans}
			e.emptyOnce = e.name == "" && again
		}
		e.scan = r.scans
		r.argv[pid] = e
		if e.name == "" || !want[e.name] {
			continue // a kernel thread or zombie (no argv), or another program
		}
		p, err := r.get(ctx, pid, nil)
		if err != nil {
			continue // exited meanwhile
		}
		if n := ArgvName(p.Cmdline); n != e.name {
			e.name = n // argv rewritten since it was read
			r.argv[pid] = e
			if !want[n] {
				continue
			}
		}
		out = append(out, p)
	}
	for pid, e := range r.argv {
		if e.scan != r.scans {
			delete(r.argv, pid)
		}
	}
	return out, nil
}

// commScanTTL is how long one scan of every process's comm is shared: the
// process scans of one cycle (HungIPTablesRestore, HungNFT, kube-proxy's
// absence) start together and scan once. Well under any interval.
const commScanTTL = time.Second

// commRefresh bounds how long a scan reuses a remembered comm: a process
// is identified across scans by its PID and the inode number of its
// /proc/<pid> directory (procfs numbers each instantiated inode afresh
// from get_next_ino, a 32-bit counter shared with pipes and sockets, so a
// reused PID shows another inode unless 2^32 inodes were made in between;
// an evicted and re-instantiated dentry of the same process only costs a
// re-read; TestListProcInodes checks this kernel), and its comm is read
// when it is new, again at the next scan (a process caught between fork
// and exec, like kube-proxy's vfork of iptables-restore or systemd's
// "(kubelet)", shows its own comm a cycle later), and then every
// commRefresh (each PID between commRefresh/2 and commRefresh, so the
// re-reads spread over the cycles). Only a comm changed later in a process's life (an exec in
// place long after the fork, such as a container's runc init that waits
// for its start; a prctl(PR_SET_NAME)) goes unseen, for at most
// commRefresh, and what that costs is a late answer, never a wrong
// target: HungIPTablesRestore and HungNFT report a process older than
// 1 min and 30 s at a 30 s interval (its age counts from the fork, so it
// is reported at most commRefresh late); Find re-reads a match whole
// before returning it, and KillProcess re-reads and re-checks the
// process (create time, argv name, executable, capabilities, parent)
// before every signal, sent through a pidfd; CNIConfig's kubelet evidence
// only matters without cluster access (a missing CNI configuration
// reported up to commRefresh late); the kube-proxy absence check may take
// a just-exec'd kube-proxy for absent (a skip, no action) or a kube-proxy
// that exec'd another program for present (its findings stay) for as
// long; the look-ups of kube-proxy and the CNI agents by name find a
// container's process whose runc init waited longer than a cycle for its
// start as late. A minute, not less: at the 30 s interval a shorter bound would
// re-read every comm every cycle.
const commRefresh = time.Minute

// maxProcs bounds the processes one scan reads.
const maxProcs = 100000

// procDirent is a PID entry of a proc root: the PID and the inode number
// of /proc/<pid> (0 or 1 when unknown: such a process's comm is read at
// every scan).
type procDirent struct {
	pid int32
	ino uint64
}

// procEntry is one process of a comm scan.
type procEntry struct {
	procDirent
	// confirmed is false until comm was read again by a later scan than
	// the one that first saw the process.
	confirmed bool
	comm      string
	// read is when comm was read (commScans.now, Unix nanoseconds).
	read int64
}

// commScan is the processes of a proc root and their comms at one moment.
type commScan struct {
	at    time.Time
	procs []procEntry // by PID
	reads int         // comm files this scan read (the others were reused)
}

// commScans holds the last scan of each proc root; mu serialises scans so
// that concurrent callers share one, and each scan reuses the comms of the
// last. now and refresh stand for time.Now and commRefresh (tests).
var commScans = struct {
	mu      sync.Mutex
	m       map[string]*commScan
	buf     []byte // getdents64 buffer
	now     func() time.Time
	refresh time.Duration
}{m: map[string]*commScan{}, now: time.Now, refresh: commRefresh}

// refreshAfter is how long pid's comm is reused: between refresh/2 and
// refresh, by PID, so that the processes first read together are not all
// read again in the same cycle.
func refreshAfter(pid int32, refresh time.Duration) time.Duration {
	return refresh - refresh*time.Duration(pid%16)/32
}

// scanComms returns every process of the proc root with its comm, from a
// scan at most commScanTTL old (see commRefresh for which comms a scan
// reads and which it reuses). A process that exits during the scan is
// left out.
func scanComms(root string) (*commScan, error) {
	commScans.mu.Lock()
	defer commScans.mu.Unlock()
	now := commScans.now()
	prev := commScans.m[root]
	if prev != nil && !prev.at.IsZero() && now.Sub(prev.at) >= 0 && now.Sub(prev.at) < commScanTTL {
		return prev, nil
	}
	if commScans.buf == nil {
		commScans.buf = make([]byte, 32<<10)
	}
	var old []procEntry
	if prev != nil {
		old = prev.procs
	}
	ents, err := listProc(root, commScans.buf, len(old)+64)
	if err != nil {
		return nil, err
	}
	nowNs := now.UnixNano()
	s := &commScan{at: now, procs: make([]procEntry, 0, len(ents))}
	buf := make([]byte, 64)
	prefix := filepath.Clean(root) + "/"
	j := 0
	for _, e := range ents {
		for j < len(old) && old[j].pid < e.pid {
			j++
		}
		p := procEntry{procDirent: e}
		if j < len(old) && old[j].pid == e.pid && e.ino > 1 && old[j].ino == e.ino {
			o := old[j]
			if age := time.Duration(nowNs - o.read); o.confirmed && age >= 0 && age < refreshAfter(o.pid, commScans.refresh) {
				s.procs = append(s.procs, o)
				continue
			}
			p.confirmed = true // the same process, read again
		}
		comm, ok := readSmall(prefix+strconv.Itoa(int(e.pid))+"/comm", buf)
		if !ok {
			continue // exited
		}
		s.reads++
		p.comm, p.read = strings.TrimSuffix(comm, "\n"), nowNs
		s.procs = append(s.procs, p)
	}
	if len(commScans.m) > 8 {
		commScans.m = map[string]*commScan{}
	}
	commScans.m[root] = s
	return s, nil
}

// ExpireCommScans ends the sharing of the last scans: the next scan lists
// the processes again (a test standing for a later cycle). The comms they
// remember are reused as in any later cycle.
func ExpireCommScans() {
	commScans.mu.Lock()
	for _, s := range commScans.m {
		s.at = time.Time{}
	}
	commScans.mu.Unlock()
}

// CommRunning reports whether a process whose comm is name runs under the
// proc root (from the shared scan of scanComms).
func CommRunning(root, name string) (bool, error) {
	s, err := scanComms(root)
	if err != nil {
		return false, err
	}
	for i := range s.procs {
		if s.procs[i].comm == name {
			return true, nil
		}
	}
	return false, nil
}

func (r *Real) pids() ([]int32, error) {
	ents, err := listProc(r.root, make([]byte, 32<<10), 0)
	if err != nil {
		return nil, err
	}
	pids := make([]int32, len(ents))
	for i, e := range ents {
		pids[i] = e.pid
	}
	return pids, nil
}

// listProc lists the PID entries of a proc root (at most maxProcs, from
// at most maxProcs+100 entries) with their inode numbers, by PID, reading
// the directory with getdents64 into buf (which must hold one entry);
// about is the number of entries expected. Any directory will do: a
// test's fake proc root gives its own inode numbers.
func listProc(root string, buf []byte, about int) ([]procDirent, error) {
	fd, err := unix.Open(root, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("listing processes in %s: %w", root, err)
	}
	defer unix.Close(fd)
	out := make([]procDirent, 0, min(about, maxProcs))
	entries := 0
	for entries <= maxProcs+100 && len(out) < maxProcs {
		n, err := unix.Getdents(fd, buf)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("listing processes in %s: %w", root, err)
		}
		if n <= 0 {
			break
		}
		err = parseDirents(buf[:n], func(ino uint64, name []byte) bool {
			entries++
			if pid, ok := parsePID(name); ok {
				out = append(out, procDirent{pid: pid, ino: ino})
			}
			return entries <= maxProcs+100 && len(out) < maxProcs
		})
		if err != nil {
			return nil, fmt.Errorf("listing processes in %s: %w", root, err)
		}
	}
	slices.SortFunc(out, func(a, b procDirent) int { return cmp.Compare(a.pid, b.pid) })
	return slices.CompactFunc(out, func(a, b procDirent) bool { return a.pid == b.pid }), nil
}

// parsePID returns the PID a /proc entry name spells in canonical decimal
// (no sign, no leading zero), within int32 and above 0.
func parsePID(name []byte) (int32, bool) {
	if len(name) == 0 || len(name) > 10 || name[0] == '0' {
		return 0, false
	}
	var n int64
	for _, c := range name {
		if c < '0' || c > '9' {
			return 0, false
		}
		n = n*10 + int64(c-'0')
	}
	if n > math.MaxInt32 {
		return 0, false
	}
	return int32(n), true
}

// readSmall reads at most len(buf) bytes of a proc file into buf and
// returns them as a string (copied); ok is false when it cannot be read.
func readSmall(path string, buf []byte) (string, bool) {
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return "", false
	}
	defer unix.Close(fd)
	n, err := unix.Read(fd, buf)
	if err != nil || n < 0 {
		return "", false
	}
	return string(buf[:n]), true
}

// Locks reads and parses <root>/locks.
func (r *Real) Locks() ([]Lock, error) {
	f, err := boundedfile.OpenBounded(r.path("locks"), 64<<20)
	if err != nil {
		return nil, fmt.Errorf("reading locks: %w", err)
	}
	defer f.Close()
	return ParseLocks(f)
}

// FileLocks implements Interface: /proc/locks says whether the file is
// locked, by which callers and who waits. The holders are found like lsof
// does, by every descriptor on the file (stat dev:inode) whose fdinfo
// lists a lock (HoldersFromFDInfo); where the kernel refuses that (no
// CAP_SYS_PTRACE over the process: the default install), they are the
// live processes /proc/locks names as the lock's callers
// (HoldersFromProcLocks), which needs no ptrace.
func (r *Real) FileLocks(ctx context.Context, path string) (FileLocks, error) {
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		return FileLocks{}, fmt.Errorf("stat lock file %s: %w", path, err)
	}
	key := DevKey(unix.Major(st.Dev), unix.Minor(st.Dev), st.Ino)
	fl := FileLocks{Path: path, Dev: key}
	locks, err := r.Locks()
	if err != nil {
		return fl, err
	}
	var waiterPIDs []int32
	for _, l := range locks {
		if l.Dev != key {
			continue
		}
		if l.Waiting() {
			waiterPIDs = append(waiterPIDs, l.PID)
			continue
		}
		fl.Held = true
		fl.LockPIDs = append(fl.LockPIDs, l.PID)
	}
	for _, pid := range waiterPIDs {
		if p, err := r.Get(ctx, pid); err == nil {
			fl.Waiters = append(fl.Waiters, p)
		}
	}
	if !fl.Held {
		return fl, nil
	}
	holders, denied, err := r.holders(ctx, st.Dev, st.Ino, key)
	if err != nil {
		return fl, err
	}
	if len(holders) > 0 || !denied {
		// Readable: the descriptors are the truth (a /proc/locks PID
		// without a descriptor on the file exited, and may be reused).
		fl.Holders, fl.HoldersFrom = holders, HoldersFromFDInfo
		return fl, nil
	}
	fl.Holders, fl.HoldersFrom = r.lockCallers(ctx, fl.LockPIDs, waiterPIDs), HoldersFromProcLocks
	return fl, nil
}

// How FileLocks.Holders were found.
const (
	HoldersFromFDInfo    = "fdinfo"
	HoldersFromProcLocks = "proc-locks"
)

// lockCallers are the live processes of the granted locks' PIDs (the flock
// callers), leaving out those that wait on the same file (a PID both
// holding and waiting is a reused one's or a re-lock's, not a holder we
// can name) and PIDs not visible here (0, -1).
func (r *Real) lockCallers(ctx context.Context, pids, waiters []int32) []Process {
	var out []Process
	seen := map[int32]bool{}
	for _, pid := range pids {
		if pid <= 0 || seen[pid] || slices.Contains(waiters, pid) {
			continue
		}
		seen[pid] = true
		if p, err := r.Get(ctx, pid); err == nil {
			out = append(out, p)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Pid < out[j].Pid })
	return out
}

// holders finds the lock's holders by their descriptors; denied reports
// that the kernel refused some process's descriptors (EACCES, EPERM: no
// ptrace access), so that the answer may miss holders.
func (r *Real) holders(ctx context.Context, dev, ino uint64, key string) (holders []Process, denied bool, err error) {
	cctx := r.ctx(ctx)
	pids, err := process.PidsWithContext(cctx)
	if err != nil {
		return nil, false, fmt.Errorf("listing processes in %s: %w", r.root, err)
	}
	var out []Process
	for _, pid := range pids {
		if err := ctx.Err(); err != nil {
			return nil, false, err
		}
		ps := strconv.Itoa(int(pid))
		fds, err := os.ReadDir(r.path(ps, "fd"))
		if err != nil {
			if errors.Is(err, fs.ErrPermission) {
				denied = true
			}
			continue // exited or not readable
		}
		holds := false
		for _, fd := range fds {
			var st unix.Stat_t
			if err := unix.Stat(r.path(ps, "fd", fd.Name()), &st); err != nil {
				if errors.Is(err, unix.EACCES) || errors.Is(err, unix.EPERM) {
					denied = true
					break // every descriptor of this process is refused alike
				}
				continue
			}
			if st.Dev != dev || st.Ino != ino {
				continue
			}
			if fdinfoHoldsLock(r.path(ps, "fdinfo", fd.Name()), key) {
				holds = true
				break
			}
		}
		if !holds {
			continue
		}
		if p, err := r.Get(ctx, pid); err == nil {
			out = append(out, p)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Pid < out[j].Pid })
	return out, denied, nil
}

// fdinfoHoldsLock reports whether a fdinfo file has a granted "lock:" line
// on the file with that key.
func fdinfoHoldsLock(path, key string) bool {
	f, err := boundedfile.OpenBounded(path, 1<<20)
	if err != nil {
		return false
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		rest, ok := strings.CutPrefix(sc.Text(), "lock:")
		if !ok {
			continue
		}
		l, err := ParseLockLine(strings.TrimSpace(rest))
		if err == nil && !l.Waiting() && l.Dev == key && l.Access != "UNLCK" {
			return true
		}
	}
	return false
}

// Signal implements Interface. It opens a pidfd first and checks the create
// time after: a pidfd cannot be retargeted, so a signal sent through it
// reaches the process that was checked even if the PID is reused meanwhile.
func (r *Real) Signal(ctx context.Context, pid int32, createTimeMs int64, sig syscall.Signal) error {
	if pid <= 1 {
		return fmt.Errorf("refusing to signal pid %d", pid)
	}
	if err := r.CheckPIDNamespace(); err != nil {
		return fmt.Errorf("refusing to signal pid %d: %w", pid, err)
	}
	fd, err := unix.PidfdOpen(int(pid), 0)
	if err != nil {
		if errors.Is(err, unix.ESRCH) {
			return ErrNotFound
		}
		return fmt.Errorf("pidfd_open %d: %w", pid, err)
	}
	defer unix.Close(fd)
	cur, err := r.Get(ctx, pid)
	if err != nil {
		return err
	}
	if cur.CreateTimeMs != createTimeMs {
		return ErrNotSame
	}
	if err := unix.PidfdSendSignal(fd, sig, nil, 0); err != nil {
		if errors.Is(err, unix.ESRCH) {
			return ErrNotFound
		}
		return fmt.Errorf("signal %v to pid %d: %w", sig, pid, err)
	}
	return nil
}

// OwnsListener implements Interface: the sockets listening on port in
// pid's network namespace (/proc/<pid>/net/tcp and tcp6, readable without
// ptrace) must include one pid holds a descriptor on (its fd links,
// which need CAP_SYS_PTRACE over it: ErrNoPtrace when refused). false
// with a nil error: nothing listens there, or only sockets of others.
func (r *Real) OwnsListener(ctx context.Context, pid int32, port uint16) (bool, error) {
	ps := strconv.Itoa(int(pid))
	want := map[uint64]bool{}
	for _, name := range []string{"tcp", "tcp6"} {
		f, err := boundedfile.OpenBounded(r.path(ps, "net", name), 64<<20)
		if errors.Is(err, fs.ErrNotExist) && name == "tcp6" {
			continue // no IPv6
		}
		if err != nil {
			return false, fmt.Errorf("reading pid %d's net/%s: %w", pid, name, err)
		}
		inos, err := ParseTCPListeners(f, port)
		f.Close()
		if err != nil {
			return false, fmt.Errorf("pid %d's net/%s: %w", pid, name, err)
		}
		for _, i := range inos {
			want[i] = true
		}
	}
	if len(want) == 0 {
		return false, nil
	}
	fds, err := os.ReadDir(r.path(ps, "fd"))
	if err != nil {
		if errors.Is(err, fs.ErrPermission) {
			return false, ErrNoPtrace
		}
		return false, fmt.Errorf("listing pid %d's descriptors: %w", pid, err)
	}
	for _, fd := range fds {
		if err := ctx.Err(); err != nil {
			return false, err
		}
		l, err := os.Readlink(r.path(ps, "fd", fd.Name()))
		if err != nil {
			if errors.Is(err, fs.ErrPermission) {
				return false, ErrNoPtrace
			}
			continue // closed meanwhile
		}
		s, ok := strings.CutPrefix(l, "socket:[")
		if !ok {
			continue
		}
		if ino, err := strconv.ParseUint(strings.TrimSuffix(s, "]"), 10, 64); err == nil && want[ino] {
			return true, nil
		}
	}
	return false, nil
}
