// Package podlogs reads the tail of a pod's container logs as the kubelet
// writes them on the node (/var/log/pods/<namespace>_<pod>_<uid>/<container>/<N>.log,
// CRI log format, see ParseLine), and classifies the lines kube-proxy and
// the CNI agents write when their rules cannot be applied (Classify).
//
// The reads are bounded, never follow a symlink and never block: each
// container's newest MaxFiles files are read, at most TailBytes bytes from
// the end of each, through internal/boundedfile (no FIFO, a regular file
// only, each open and read under its deadline); the pod and container
// directories must be real directories under the root (a symlink planted
// there, or a name with a slash or "..", is refused). Dir is the real
// adapter, Fake a stateful one for tests.
package podlogs

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"

	"github.com/remediate-dev/remediate/internal/boundedfile"
)

// Defaults of the real adapter.
const (
	// TailBytes is how much of the end of one log file is read.
	TailBytes = 64 << 10
	// MaxFiles is how many of a container's log files are read (the
	// current run's and the previous one's: a crash-looping container
	// said why in its last run).
	MaxFiles = 2
	// maxEntries bounds a container directory's listing.
	maxEntries = 256
)

// Source is one container of one pod whose logs are read.
type Source struct {
	Namespace, Pod string
	// UID is the UID the kubelet runs the pod under (a static pod's own,
	// not its mirror's).
	UID       string
	Container string
}

// String is the source for messages ("kube-system/kube-proxy-x/kube-proxy").
func (s Source) String() string { return s.Namespace + "/" + s.Pod + "/" + s.Container }

// Tail is what was read of a source, oldest line first.
type Tail struct {
	Lines []Line
	// Files are the files read, newest first.
	Files []string
	// Skipped counts lines that did not parse as CRI log lines.
	Skipped int
}

// Reader reads the tail of a container's logs.
type Reader interface {
	Tail(ctx context.Context, s Source) (Tail, error)
}

// ErrNoLogs is wrapped when the source has no log directory or file here.
var ErrNoLogs = errors.New("no log files")

// Dir reads the kubelet's pod log directory mounted at Root.
type Dir struct {
	// Root is the mount of the host's /var/log/pods (--pod-log-dir).
	Root string
	// TailBytes and MaxFiles bound a read (0: the defaults).
	TailBytes int64
	MaxFiles  int
}

// safeName reports whether s can be one path component.
func safeName(s string) bool {
	return s != "" && s != "." && s != ".." && len(s) <= 253 && !strings.ContainsAny(s, "/\x00")
}

// realDir refuses p unless it is a directory and not a symlink.
func realDir(p string) error {
	fi, err := os.Lstat(p)
	if err != nil {
		if os.IsNotExist(err) {
			return fmt.Errorf("%s: %w", p, ErrNoLogs)
		}
		return err
	}
	if fi.Mode()&os.ModeSymlink != 0 {
		return fmt.Errorf("%s is a symlink: not followed out of the pod log directory", p)
	}
	if !fi.IsDir() {
		return fmt.Errorf("%s is not a directory", p)
	}
	return nil
}

// Tail implements Reader.
func (d Dir) Tail(ctx context.Context, s Source) (Tail, error) {
	if !safeName(s.Namespace) || !safeName(s.Pod) || !safeName(s.UID) || !safeName(s.Container) {
		return Tail{}, fmt.Errorf("pod log source %q: a name is empty or not one path component", s.String())
	}
	tb, mf := d.TailBytes, d.MaxFiles
	if tb <= 0 {
		tb = TailBytes
	}
	if mf <= 0 {
		mf = MaxFiles
	}
	pod := filepath.Join(d.Root, s.Namespace+"_"+s.Pod+"_"+s.UID)
	dir := filepath.Join(pod, s.Container)
	for _, p := range []string{pod, dir} {
		if err := realDir(p); err != nil {
			return Tail{}, err
		}
	}
	names, err := logFiles(dir)
	if err != nil {
		return Tail{}, err
	}
	if len(names) == 0 {
		return Tail{}, fmt.Errorf("%s: %w", dir, ErrNoLogs)
	}
	var out Tail
	var chunks [][]Line
	for _, n := range names[:min(mf, len(names))] {
		if err := ctx.Err(); err != nil {
			return out, err
		}
		p := filepath.Join(dir, n)
		b, err := readTail(p, tb)
		if err != nil {
			return out, err
		}
		out.Files = append(out.Files, p)
		lines, skipped := ParseLines(b)
		out.Skipped += skipped
		chunks = append(chunks, lines)
	}
	for i := len(chunks) - 1; i >= 0; i-- { // oldest file first
		out.Lines = append(out.Lines, chunks[i]...)
	}
	return out, nil
}

// logFiles lists the container directory's "<N>.log" files, highest N
// (the newest run) first.
func logFiles(dir string) ([]string, error) {
	f, err := boundedfile.OpenDir(dir)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	ents, err := f.Readdirnames(maxEntries)
	if err != nil && err != io.EOF {
		return nil, fmt.Errorf("listing %s: %w", dir, err)
	}
	type numbered struct {
		n    int
		name string
	}
	var ns []numbered
	for _, e := range ents {
		num, ok := strings.CutSuffix(e, ".log")
		if !ok {
			continue
		}
		if n, err := strconv.Atoi(num); err == nil && n >= 0 {
			ns = append(ns, numbered{n, e})
		}
	}
	sort.Slice(ns, func(i, j int) bool { return ns[i].n > ns[j].n })
	out := make([]string, len(ns))
	for i, x := range ns {
		out[i] = x.name
	}
	return out, nil
}

// readTail reads at most limit bytes from the end of the regular file p (a
// symlink is refused), starting at a line boundary.
func readTail(p string, limit int64) ([]byte, error) {
	f, err := boundedfile.OpenNoFollow(p)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, err
	}
	off := max(fi.Size()-limit, 0)
	if off > 0 {
		if _, err := f.OS().Seek(off, io.SeekStart); err != nil {
			return nil, fmt.Errorf("seeking in %s: %w", p, err)
		}
	}
	b, err := io.ReadAll(io.LimitReader(f, limit))
	if err != nil {
		return nil, fmt.Errorf("reading %s: %w", p, err)
	}
	if off > 0 { // the first line is cut: drop it
		if i := bytes.IndexByte(b, '\n'); i >= 0 {
			b = b[i+1:]
		} else {
			b = nil
		}
	}
	return b, nil
}
