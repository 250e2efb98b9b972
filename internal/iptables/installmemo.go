package iptables

import (
	"io"
	"os"
	"sync"
	"time"

	"k8s.io/utils/clock"

	"github.com/remediate-dev/remediate/internal/boundedfile"
)

// InstallReader reads installs as ReadInstall does, remembering what each
// file it scanned (an iptables binary for its version string, a package
// database for iptables' version) said, keyed by the file's identity from
// an fstat of the opened file: device, inode, size, and modification and
// change times in nanoseconds. An unchanged file is not read again; a
// replaced one (new inode) or one written in place (new size or times) is.
// The symlinks are still resolved at every read (a few lstats): a link
// switched to the other backend is seen at once.
//
// A file changed less than RacyWindow before it was read is not
// remembered: the kernel stamps times from a coarse clock, so a second
// write of the same size within one tick would leave all five fields
// equal.
//
// At most max files are remembered, the least recently used forgotten
// first. An InstallReader is safe for concurrent use; the nil
// *InstallReader remembers nothing.
type InstallReader struct {
	clk clock.PassiveClock
	max int

	mu   sync.Mutex
	memo map[fileID]*memoEntry
	tick uint64
	// reads counts the files actually read (not answered from the memo).
	reads int
}

// RacyWindow is how long after its last change a file must have stayed
// unchanged for its reading to be remembered.
const RacyWindow = 2 * time.Second

// DefaultInstallMemo is the number of files an InstallReader remembers by
// default: a node's host, kube-proxy and a few CNI agents each have one
// binary, and a package database when the binary has no version string.
const DefaultInstallMemo = 32

// NewInstallReader returns a reader remembering at most max files (<= 0:
// DefaultInstallMemo); clk tells how old a file's last change is (nil:
// the real clock).
func NewInstallReader(max int, clk clock.PassiveClock) *InstallReader {
	if max <= 0 {
		max = DefaultInstallMemo
	}
	if clk == nil {
		clk = clock.RealClock{}
	}
	return &InstallReader{clk: clk, max: max, memo: map[fileID]*memoEntry{}}
}

// fileKind says what a file was read for: the same file read as a binary
// and as a database would answer differently.
type fileKind uint8

const (
	kindBinary fileKind = iota + 1
	kindDpkg
	kindApk
)

// fileID is a file's identity and version as an fstat gives it.
type fileID struct {
	kind         fileKind
	dev, ino     uint64
	size         int64
	mtime, ctime int64 // nanoseconds since the epoch
}

// fileResult is what reading a file said.
type fileResult struct {
	version string
	backend Backend
	ok      bool
}

type memoEntry struct {
	res  fileResult
	used uint64
}

// Reads returns how many files r has read rather than answered from its
// memo (for tests and benchmarks).
func (r *InstallReader) Reads() int {
	if r == nil {
		return 0
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.reads
}

// readFile opens file (boundedfile: regular files only, never blocking),
// answers from the memo when its identity is remembered, else reads at
// most limit bytes of it with read and remembers the answer.
func (r *InstallReader) readFile(file string, kind fileKind, limit int64, read func(io.Reader) fileResult) fileResult {
	f, err := boundedfile.Open(file)
	if err != nil {
		return fileResult{}
	}
	defer f.Close()
	if r == nil {
		return read(io.LimitReader(f, limit))
	}
	id, ok := identify(f, kind)
	if ok {
		if res, hit := r.lookup(id); hit {
			return res
		}
	}
	now := r.clk.Now()
	res := read(io.LimitReader(f, limit))
	r.mu.Lock()
	defer r.mu.Unlock()
	r.reads++
	if ok && now.Sub(time.Unix(0, max(id.mtime, id.ctime))) >= RacyWindow {
		r.store(id, res)
	}
	return res
}

func (r *InstallReader) lookup(id fileID) (fileResult, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	e, ok := r.memo[id]
	if !ok {
		return fileResult{}, false
	}
	r.tick++
	e.used = r.tick
	return e.res, true
}

// store remembers id's answer, forgetting the least recently used entry
// when full. The caller holds mu.
func (r *InstallReader) store(id fileID, res fileResult) {
	if _, ok := r.memo[id]; !ok && len(r.memo) >= r.max {
		var oldest fileID
		first := true
		for k, e := range r.memo {
			if first || e.used < r.memo[oldest].used {
				oldest, first = k, false
			}
		}
		delete(r.memo, oldest)
	}
	r.tick++
	r.memo[id] = &memoEntry{res: res, used: r.tick}
}

// identify returns the opened file's identity, ok false where the
// platform's stat does not give one.
func identify(f interface{ Stat() (os.FileInfo, error) }, kind fileKind) (fileID, bool) {
	fi, err := f.Stat()
	if err != nil {
		return fileID{}, false
	}
	id, ok := statID(fi)
	id.kind = kind
	return id, ok
}
