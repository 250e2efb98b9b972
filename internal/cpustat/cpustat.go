// Package cpustat reads CPU accounting through the configured roots: the
// cpu.stat of a process's cgroup (cgroup v1 and v2; v2 proven on a real
// kernel by TestVMCgroupV2Throttling in the VM lane), found from
// /proc/<pid>/cgroup under --proc-root and a cgroup filesystem root
// (--cgroup-root), or of the ancestor whose quota limits it, and the
// node's aggregate CPU times from /proc/stat.
//
// Every read is of a small file with a size limit and never blocks on
// anything but the filesystem; parsers accept hostile input and give a
// bounded answer. Nothing here writes. The real adapter is New, the
// stateful fake Fake.
package cpustat

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"github.com/remediate-dev/remediate/internal/boundedfile"
	"io"
	"math"
	"path"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
)

// maxFile bounds every file read here (cpu.stat, /proc/<pid>/cgroup and
// the first line of /proc/stat are far smaller).
const maxFile = 64 << 10

// maxLines bounds the lines a parser looks at.
const maxLines = 1024

// CgroupCPU is the throttling accounting of one cgroup's cpu.stat, as
// cumulative counters since the cgroup was created.
type CgroupCPU struct {
	// Version is 1 or 2 (the cgroup hierarchy the file came from).
	Version int `json:"version"`
	// Path is the cgroup's path inside its hierarchy ("/kubepods/..."):
	// the process's own group, or, when that has no CPU quota, the
	// nearest ancestor that has one (the kernel counts throttling only in
	// the group whose quota ran out: a process limited by its pod's or
	// slice's quota shows no periods in its own cpu.stat).
	Path string `json:"path"`
	// Periods is nr_periods: enforcement periods (of cpu.cfs_period_us,
	// default 100 ms) in which the cgroup was runnable under a quota.
	Periods uint64 `json:"periods"`
	// Throttled is nr_throttled: periods in which it exhausted its quota
	// and was stopped until the next period.
	Throttled uint64 `json:"throttled"`
	// ThrottledTime is the total time it was stopped (v2 throttled_usec,
	// v1 throttled_time in ns).
	ThrottledTime time.Duration `json:"throttledTimeNs"`
	// Usage is v2's usage_usec (0 in v1, whose usage is in cpuacct).
	Usage time.Duration `json:"usageNs"`
	// Quota is true when the file carries throttling counters at all (a v2
	// cpu.stat without the cpu controller has only usage).
	Quota bool `json:"quota"`
}

// Sub returns the increase from older to c; ok is false when a counter
// went down (the cgroup was re-created) or the paths differ.
func (c CgroupCPU) Sub(older CgroupCPU) (CgroupCPU, bool) {
	if c.Path != older.Path || c.Version != older.Version || c.Periods < older.Periods ||
		c.Throttled < older.Throttled || c.ThrottledTime < older.ThrottledTime || c.Usage < older.Usage {
		return CgroupCPU{}, false
	}
	return CgroupCPU{Version: c.Version, Path: c.Path, Quota: c.Quota,
		Periods: c.Periods - older.Periods, Throttled: c.Throttled - older.Throttled,
		ThrottledTime: c.ThrottledTime - older.ThrottledTime, Usage: c.Usage - older.Usage}, true
}

// ParseCPUStat parses a cgroup v1 or v2 cpu.stat ("key value" lines).
// Unknown keys are ignored; a malformed value is an error; a file with
// none of the known keys is an error.
func ParseCPUStat(version int, r io.Reader) (CgroupCPU, error) {
	out := CgroupCPU{Version: version}
	known := 0
	sc := bufio.NewScanner(io.LimitReader(r, maxFile))
	for lines := 0; sc.Scan() && lines < maxLines; lines++ {
		f := strings.Fields(sc.Text())
		if len(f) != 2 {
			continue
		}
		v, err := strconv.ParseUint(f[1], 10, 64)
		if err != nil {
			return CgroupCPU{}, fmt.Errorf("cpu.stat: %s %q: %w", f[0], f[1], err)
		}
		switch f[0] {
		case "nr_periods":
			out.Periods, out.Quota = v, true
		case "nr_throttled":
			out.Throttled, out.Quota = v, true
		case "throttled_usec":
			out.ThrottledTime, out.Quota = usec(v), true
		case "throttled_time": // v1: nanoseconds
			out.ThrottledTime, out.Quota = nsec(v), true
		case "usage_usec":
			out.Usage = usec(v)
		default:
			continue
		}
		known++
	}
	if err := sc.Err(); err != nil {
		return CgroupCPU{}, fmt.Errorf("cpu.stat: %w", err)
	}
	if known == 0 {
		return CgroupCPU{}, errors.New("cpu.stat: no nr_periods, nr_throttled, throttled_* or usage_usec line")
	}
	return out, nil
}

func usec(v uint64) time.Duration {
	if v > uint64(1<<63-1)/1000 {
		return time.Duration(1<<63 - 1)
	}
	return time.Duration(v) * time.Microsecond
}

func nsec(v uint64) time.Duration {
	if v > 1<<63-1 {
		return time.Duration(1<<63 - 1)
	}
	return time.Duration(v)
}

// CgroupLine is one line of /proc/<pid>/cgroup: "ID:controllers:path".
type CgroupLine struct {
	ID          int
	Controllers []string // empty for the v2 line ("0::/path")
	Path        string
}

// ParseProcCgroup parses /proc/<pid>/cgroup. Lines that do not have three
// colon-separated fields, a numeric ID and an absolute path are skipped
// (a path with ".." — the process is outside the reader's cgroup
// namespace — is kept as is; CPUStatPath refuses it).
func ParseProcCgroup(r io.Reader) ([]CgroupLine, error) {
	var out []CgroupLine
	sc := bufio.NewScanner(io.LimitReader(r, maxFile))
	for lines := 0; sc.Scan() && lines < maxLines; lines++ {
		parts := strings.SplitN(sc.Text(), ":", 3)
		if len(parts) != 3 {
			continue
		}
		id, err := strconv.Atoi(parts[0])
		if err != nil || id < 0 || !strings.HasPrefix(parts[2], "/") {
			continue
		}
		l := CgroupLine{ID: id, Path: parts[2]}
		if parts[1] != "" {
			l.Controllers = strings.Split(parts[1], ",")
		}
		out = append(out, l)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("cgroup: %w", err)
	}
	if len(out) == 0 {
		return nil, errors.New("cgroup: no hierarchy line")
	}
	return out, nil
}

// CPUStatCandidates returns the cpu.stat files that may hold the throttling
// of a process with these cgroup lines, best first: the v1 hierarchy that
// has the cpu controller (mounted as <root>/<controllers> or <root>/cpu,
// the usual layouts), then the v2 unified hierarchy (<root>/<path>, or
// <root>/unified/<path> on a hybrid host). Paths that would leave root are
// refused.
func CPUStatCandidates(root string, lines []CgroupLine) ([]Candidate, error) {
	var out []Candidate
	var refused error
	add := func(version int, dir, p string) {
		clean := path.Clean("/" + p)
		if slices.Contains(strings.Split(p, "/"), "..") {
			refused = fmt.Errorf("cgroup path %q is outside this cgroup namespace's view (run with the host's cgroup namespace)", p)
			return
		}
		base := filepath.Join(root, dir)
		out = append(out, Candidate{Version: version, Path: clean, Base: base, File: filepath.Join(base, filepath.FromSlash(clean), "cpu.stat")})
	}
	for _, l := range lines {
		for _, c := range l.Controllers {
			if c != "cpu" {
				continue
			}
			add(1, strings.Join(l.Controllers, ","), l.Path)
			if len(l.Controllers) > 1 {
				add(1, "cpu", l.Path)
			}
		}
	}
	for _, l := range lines {
		if l.ID == 0 && len(l.Controllers) == 0 {
			add(2, "", l.Path)
			add(2, "unified", l.Path)
		}
	}
	if len(out) == 0 && refused != nil {
		return nil, refused
	}
	return out, nil
}

// OutsidePath splits a cgroup path that climbs out of the reader's cgroup
// namespace ("/../../kubepods/x": the process is outside it) into the
// levels it climbs and the rest; ok is false for a path that does not.
func OutsidePath(p string) (up int, rest string, ok bool) {
	segs := strings.Split(strings.TrimPrefix(p, "/"), "/")
	for up < len(segs) && segs[up] == ".." {
		up++
	}
	if up == 0 {
		return 0, "", false
	}
	rest = strings.Join(segs[up:], "/")
	if slices.Contains(segs[up:], "..") {
		return 0, "", false
	}
	return up, rest, true
}

// maxResolveLevels bounds the directory levels searched when resolving a
// path outside this cgroup namespace.
const maxResolveLevels = 3

// resolveOutside rewrites the lines whose path leaves this daemon's cgroup
// namespace (a private one: containerd's default on cgroup v2) into paths
// from the hierarchy's root. PID 1 of the proc root lies outside too, and
// its path climbs exactly to the root: its ".." count is the depth of this
// namespace's root. A path climbing k levels then continues from depth-k
// levels below the root; those levels are found by a bounded glob, and only
// a single match is taken. Unresolved lines are left as they are
// (CPUStatCandidates refuses them, saying why).
func (r *Real) resolveOutside(lines []CgroupLine) []CgroupLine {
	var initLines []CgroupLine
	out := make([]CgroupLine, len(lines))
	copy(out, lines)
	for i, l := range out {
		up, rest, ok := OutsidePath(l.Path)
		if !ok {
			continue
		}
		if initLines == nil {
			b, err := boundedfile.Read(filepath.Join(r.cfg.ProcRoot, "1", "cgroup"), maxFile)
			if err != nil {
				return out
			}
			if initLines, err = ParseProcCgroup(bytes.NewReader(b)); err != nil {
				return out
			}
		}
		depth := -1
		for _, il := range initLines {
			if il.ID == l.ID {
				if d, _, ok := OutsidePath(il.Path); ok {
					depth = d
				}
			}
		}
		levels := depth - up
		if depth < 0 || levels < 0 || levels > maxResolveLevels {
			continue
		}
		if levels == 0 {
			out[i].Path = path.Clean("/" + rest)
			continue
		}
		found := map[string]bool{}
		for _, dir := range hierarchyDirs(l) {
			base := filepath.Join(r.cfg.CgroupRoot, dir)
			pattern := filepath.Join(append([]string{globEscape(base)}, append(slices.Repeat([]string{"*"}, levels), globEscape(filepath.FromSlash(rest)))...)...)
			ms, _ := filepath.Glob(pattern)
			for _, m := range ms {
				if rel, err := filepath.Rel(base, m); err == nil {
					found["/"+filepath.ToSlash(rel)] = true
				}
			}
		}
		if len(found) == 1 {
			for p := range found {
				out[i].Path = p
			}
		}
	}
	return out
}

// globEscape quotes filepath.Match's special characters.
func globEscape(s string) string {
	var b strings.Builder
	for _, c := range s {
		if strings.ContainsRune(`*?[\`, c) {
			b.WriteByte('\\')
		}
		b.WriteRune(c)
	}
	return b.String()
}

// hierarchyDirs are the directories under the cgroup root that may hold a
// line's hierarchy (as CPUStatCandidates tries them).
func hierarchyDirs(l CgroupLine) []string {
	if len(l.Controllers) == 0 {
		return []string{"", "unified"}
	}
	dirs := []string{strings.Join(l.Controllers, ",")}
	if slices.Contains(l.Controllers, "cpu") && len(l.Controllers) > 1 {
		dirs = append(dirs, "cpu")
	}
	return dirs
}

// Candidate is a cpu.stat file that may hold a cgroup's accounting.
type Candidate struct {
	Version int
	// Path is the cgroup path inside its hierarchy.
	Path string
	// File is the cpu.stat file under the cgroup root.
	File string
	// Base is the directory the hierarchy is mounted on (File is
	// Base/Path/cpu.stat).
	Base string
}

// CPUTimes are the node's aggregate CPU times from /proc/stat's "cpu"
// line, in USER_HZ ticks.
type CPUTimes struct {
	User, Nice, System, Idle, IOWait, IRQ, SoftIRQ, Steal uint64
}

// Total is the sum of every field (guest time is already in user/nice).
// It saturates instead of wrapping on absurd input.
func (c CPUTimes) Total() uint64 {
	var t uint64
	for _, v := range []uint64{c.User, c.Nice, c.System, c.Idle, c.IOWait, c.IRQ, c.SoftIRQ, c.Steal} {
		if t+v < t {
			return math.MaxUint64
		}
		t += v
	}
	return t
}

// SoftIRQShare returns the share of CPU time spent in softirq between
// older and c (0..1); ok is false when no time passed or a counter went
// down.
func (c CPUTimes) SoftIRQShare(older CPUTimes) (float64, bool) {
	if c.SoftIRQ < older.SoftIRQ || c.Total() <= older.Total() {
		return 0, false
	}
	return float64(c.SoftIRQ-older.SoftIRQ) / float64(c.Total()-older.Total()), true
}

// ParseProcStat reads the aggregate "cpu " line of /proc/stat (the first
// line; at least the four fields every kernel prints).
func ParseProcStat(r io.Reader) (CPUTimes, error) {
	sc := bufio.NewScanner(io.LimitReader(r, maxFile))
	sc.Buffer(make([]byte, 4096), maxFile)
	for lines := 0; sc.Scan() && lines < maxLines; lines++ {
		f := strings.Fields(sc.Text())
		if len(f) == 0 || f[0] != "cpu" {
			continue
		}
		if len(f) < 5 {
			return CPUTimes{}, fmt.Errorf("/proc/stat: cpu line has %d fields, want at least 4 values", len(f)-1)
		}
		var v [8]uint64
		for i := 0; i < len(v) && i+1 < len(f); i++ {
			x, err := strconv.ParseUint(f[i+1], 10, 64)
			if err != nil {
				return CPUTimes{}, fmt.Errorf("/proc/stat: cpu field %d %q: %w", i+1, f[i+1], err)
			}
			v[i] = x
		}
		return CPUTimes{User: v[0], Nice: v[1], System: v[2], Idle: v[3], IOWait: v[4], IRQ: v[5], SoftIRQ: v[6], Steal: v[7]}, nil
	}
	if err := sc.Err(); err != nil {
		return CPUTimes{}, fmt.Errorf("/proc/stat: %w", err)
	}
	return CPUTimes{}, errors.New("/proc/stat: no aggregate cpu line")
}

// Interface reads CPU accounting. Implementations are goroutine-safe.
type Interface interface {
	// CgroupCPU returns the cpu.stat of the cgroup that process pid is in
	// (the hierarchy with the cpu controller: v1's cpu, else v2's), or of
	// its nearest ancestor with a CPU quota when its own group has none.
	CgroupCPU(ctx context.Context, pid int32) (CgroupCPU, error)
	// NodeCPU returns the node's aggregate CPU times.
	NodeCPU(ctx context.Context) (CPUTimes, error)
}

// Config configures the real adapter.
type Config struct {
	// ProcRoot is the procfs root (default /proc).
	ProcRoot string
	// CgroupRoot is where the cgroup hierarchies are mounted (default
	// /sys/fs/cgroup).
	CgroupRoot string
}

// Real reads the files.
type Real struct {
	cfg Config

	mu sync.Mutex
	// limits memoises which group limits a cgroup (limiting's walk), by
	// its cpu.stat file, for limitTTL: quotas change rarely and the walk
	// reads one file per level.
	limits map[string]limitEntry
}

type limitEntry struct {
	path string // the limiting group's path in its hierarchy
	at   time.Time
}

// limitTTL is how long a limiting group found is reused; maxLimits bounds
// the memo (it is emptied when full).
const (
	limitTTL  = time.Minute
	maxLimits = 64
)

var _ Interface = (*Real)(nil)

// New returns the real adapter.
func New(cfg Config) *Real {
	if cfg.ProcRoot == "" {
		cfg.ProcRoot = "/proc"
	}
	if cfg.CgroupRoot == "" {
		cfg.CgroupRoot = "/sys/fs/cgroup"
	}
	return &Real{cfg: cfg}
}

// CgroupCPU implements Interface.
func (r *Real) CgroupCPU(ctx context.Context, pid int32) (CgroupCPU, error) {
	if err := ctx.Err(); err != nil {
		return CgroupCPU{}, err
	}
	p := filepath.Join(r.cfg.ProcRoot, strconv.Itoa(int(pid)), "cgroup")
	b, err := boundedfile.Read(p, maxFile)
	if err != nil {
		return CgroupCPU{}, fmt.Errorf("reading %s: %w", p, err)
	}
	lines, err := ParseProcCgroup(bytes.NewReader(b))
	if err != nil {
		return CgroupCPU{}, fmt.Errorf("%s: %w", p, err)
	}
	lines = r.resolveOutside(lines)
	cands, err := CPUStatCandidates(r.cfg.CgroupRoot, lines)
	if err != nil {
		return CgroupCPU{}, fmt.Errorf("%s: %w", p, err)
	}
	var tried []string
	for _, c := range cands {
		b, err := boundedfile.Read(c.File, maxFile)
		if err != nil {
			tried = append(tried, err.Error())
			continue
		}
		st, err := ParseCPUStat(c.Version, bytes.NewReader(b))
		if err != nil {
			tried = append(tried, fmt.Sprintf("%s: %v", c.File, err))
			continue
		}
		if !st.Quota {
			tried = append(tried, c.File+": no throttling counters (cpu controller not enabled there)")
			continue
		}
		st.Path = c.Path
		return r.limiting(c, st), nil
	}
	return CgroupCPU{}, fmt.Errorf("no cpu.stat with throttling counters for pid %d under %s: %s", pid, r.cfg.CgroupRoot, strings.Join(tried, "; "))
}

// maxAncestors bounds the levels limiting climbs.
const maxAncestors = 16

// limiting returns the accounting of the group whose quota limits the
// process: own (candidate c's) when c has a quota or when none of its
// ancestors (up to maxAncestors levels, below the hierarchy's root, which
// cannot have one) does, else the nearest ancestor's that has one. Whether
// a group has a quota is read from its cpu.max (v2: not "max") or
// cpu.cfs_quota_us (v1: not -1); a file that cannot be read ends the
// search with own. The group found is reused for limitTTL.
func (r *Real) limiting(c Candidate, own CgroupCPU) CgroupCPU {
	now := time.Now()
	r.mu.Lock()
	e, ok := r.limits[c.File]
	r.mu.Unlock()
	if !ok || now.Sub(e.at) >= limitTTL || now.Before(e.at) {
		e = limitEntry{path: r.findLimiting(c), at: now}
		r.mu.Lock()
		if r.limits == nil || len(r.limits) >= maxLimits {
			r.limits = map[string]limitEntry{}
		}
		r.limits[c.File] = e
		r.mu.Unlock()
	}
	if e.path == c.Path {
		return own
	}
	b, err := boundedfile.Read(filepath.Join(c.Base, filepath.FromSlash(e.path), "cpu.stat"), maxFile)
	if err != nil {
		return own
	}
	st, err := ParseCPUStat(c.Version, bytes.NewReader(b))
	if err != nil || !st.Quota {
		return own
	}
	st.Path = e.path
	return st
}

// findLimiting returns the path of the nearest of c's group and its
// ancestors that has a quota, or c's own path.
func (r *Real) findLimiting(c Candidate) string {
	p := c.Path
	for range maxAncestors {
		if p == "/" {
			break
		}
		lim, err := hasQuota(c.Version, filepath.Join(c.Base, filepath.FromSlash(p)))
		if err != nil {
			break
		}
		if lim {
			return p
		}
		p = path.Dir(p)
	}
	return c.Path
}

// hasQuota reports whether the cgroup directory dir has a CPU quota set.
func hasQuota(version int, dir string) (bool, error) {
	name := "cpu.max"
	if version == 1 {
		name = "cpu.cfs_quota_us"
	}
	b, err := boundedfile.Read(filepath.Join(dir, name), 256)
	if err != nil {
		return false, err
	}
	q, err := ParseQuota(version, b)
	if err != nil {
		return false, fmt.Errorf("%s/%s: %w", dir, name, err)
	}
	return q, nil
}

// ParseQuota reports whether a v2 cpu.max ("max 100000" none, "5000
// 100000" 5 ms per 100 ms) or a v1 cpu.cfs_quota_us ("-1" none, "5000")
// sets a quota.
func ParseQuota(version int, b []byte) (bool, error) {
	f := strings.Fields(string(b))
	if len(f) == 0 {
		return false, errors.New("empty")
	}
	if version == 1 {
		q, err := strconv.ParseInt(f[0], 10, 64)
		if err != nil {
			return false, err
		}
		return q > 0, nil
	}
	if f[0] == "max" {
		return false, nil
	}
	if _, err := strconv.ParseUint(f[0], 10, 64); err != nil {
		return false, err
	}
	return true, nil
}

// NodeCPU implements Interface.
func (r *Real) NodeCPU(ctx context.Context) (CPUTimes, error) {
	if err := ctx.Err(); err != nil {
		return CPUTimes{}, err
	}
	p := filepath.Join(r.cfg.ProcRoot, "stat")
	f, err := boundedfile.Open(p)
	if err != nil {
		return CPUTimes{}, fmt.Errorf("reading %s: %w", p, err)
	}
	defer f.Close()
	// The aggregate line is first: read only the first 4 KiB.
	t, err := ParseProcStat(io.LimitReader(f, 4096))
	if err != nil {
		return CPUTimes{}, fmt.Errorf("%s: %w", p, err)
	}
	return t, nil
}
