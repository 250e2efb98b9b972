package procs

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/remediate-dev/remediate/internal/boundedfile"
)

// MaxCgroupDirs bounds the directories one CgroupTree.Dir walk visits.
const MaxCgroupDirs = 100_000

// maxCgroupProcs bounds the read of a cgroup's cgroup.procs (16,384 PIDs
// of up to 7 digits and a newline).
const maxCgroupProcs = 128 << 10

// ErrCgroupNotFound is returned by CgroupTree.Dir when no directory of the
// unified hierarchy has the id (the cgroup was removed since).
var ErrCgroupNotFound = errors.New("no cgroup with that id")

// CgroupTree finds the cgroups of the unified (v2) hierarchy by their id,
// the number sock_diag reports as a socket's cgroup (INET_DIAG_CGROUP_ID):
// the inode number of the cgroup's directory. It walks the mounted
// hierarchy comparing directory inodes (bounded: MaxCgroupDirs, the
// context's deadline), and caches what it saw; a cached directory is
// re-checked (its inode) before it is returned. Reverse lookup by file
// handle (open_by_handle_at) would need CAP_DAC_READ_SEARCH, which the
// daemon does not have.
type CgroupTree struct {
	// Root is the mount of the unified hierarchy (/sys/fs/cgroup on a
	// cgroup v2 host, /sys/fs/cgroup/unified on a hybrid one); RootID its
	// root cgroup's id.
	Root   string
	RootID uint64

	mu    sync.Mutex
	cache map[uint64]string
}

// NewCgroupTree finds the unified hierarchy under cgroupRoot (the
// --cgroup-root: itself when it is a cgroup2 mount, else its unified/).
func NewCgroupTree(cgroupRoot string) (*CgroupTree, error) {
	for _, dir := range []string{cgroupRoot, filepath.Join(cgroupRoot, "unified")} {
		var fs unix.Statfs_t
		if err := unix.Statfs(dir, &fs); err != nil {
			continue
		}
		if fs.Type != unix.CGROUP2_SUPER_MAGIC {
			continue
		}
		ino, err := dirIno(dir)
		if err != nil {
			return nil, err
		}
		return &CgroupTree{Root: dir, RootID: ino, cache: map[uint64]string{}}, nil
	}
	return nil, fmt.Errorf("no cgroup2 (unified) hierarchy mounted at %s or %s/unified", cgroupRoot, cgroupRoot)
}

func dirIno(path string) (uint64, error) {
	fi, err := os.Lstat(path)
	if err != nil {
		return 0, err
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok || !fi.IsDir() {
		return 0, fmt.Errorf("%s is not a directory", path)
	}
	return st.Ino, nil
}

// Dir returns the path (relative to Root, "/" for the root cgroup) of the
// cgroup with that id, or ErrCgroupNotFound.
func (t *CgroupTree) Dir(ctx context.Context, id uint64) (string, error) {
	if id == t.RootID {
		return "/", nil
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if rel, ok := t.cache[id]; ok {
		if ino, err := dirIno(filepath.Join(t.Root, rel)); err == nil && ino == id {
			return rel, nil
		}
	}
	// Walk breadth first, remembering every directory seen (the next
	// lookup, of another socket's cgroup, is then likely a cache hit).
	seen := map[uint64]string{}
	queue := []string{"/"}
	visited := 0
	for len(queue) > 0 {
		if err := ctx.Err(); err != nil {
			return "", fmt.Errorf("looking for cgroup id %d under %s: %w", id, t.Root, err)
		}
		rel := queue[0]
		queue = queue[1:]
		visited++
		if visited > MaxCgroupDirs {
			return "", fmt.Errorf("cgroup id %d not among the first %d cgroups under %s", id, MaxCgroupDirs, t.Root)
		}
		d, err := boundedfile.OpenDir(filepath.Join(t.Root, rel))
		if err != nil {
			continue // removed meanwhile
		}
		ents, err := d.ReadDir(-1)
		d.Close()
		if err != nil {
			continue
		}
		for _, e := range ents {
			if !e.IsDir() {
				continue
			}
			fi, err := e.Info()
			if err != nil {
				continue
			}
			st, ok := fi.Sys().(*syscall.Stat_t)
			if !ok {
				continue
			}
			child := filepath.Join(rel, e.Name())
			seen[st.Ino] = child
			if st.Ino == id {
				t.cache = seen
				return child, nil
			}
			queue = append(queue, child)
		}
	}
	t.cache = seen
	return "", fmt.Errorf("%w: %d under %s", ErrCgroupNotFound, id, t.Root)
}

// Procs returns the PIDs (in the mounter's PID namespace: the host's
// with hostPID) of the processes in the cgroup rel (Dir's path), from its
// cgroup.procs (bounded). The root cgroup's lists every process that is in
// no other cgroup: on a host without cgroup v2 in use, every process.
func (t *CgroupTree) Procs(rel string) ([]int32, error) {
	f, err := boundedfile.OpenBounded(filepath.Join(t.Root, rel, "cgroup.procs"), -1)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, maxCgroupProcs+1))
	if err != nil {
		return nil, fmt.Errorf("reading %s's cgroup.procs: %w", rel, err)
	}
	if len(b) > maxCgroupProcs {
		return nil, fmt.Errorf("cgroup %s holds more processes than %d bytes of cgroup.procs list", rel, maxCgroupProcs)
	}
	var out []int32
	for _, s := range strings.Fields(string(b)) {
		p, err := strconv.ParseInt(s, 10, 32)
		if err != nil {
			return nil, fmt.Errorf("%s's cgroup.procs: %q is not a PID", rel, s)
		}
		if p > 0 { // 0: a process of another PID namespace
			out = append(out, int32(p))
		}
	}
	return out, nil
}
