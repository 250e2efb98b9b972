// Package journal is the daemon's append-only audit log: one JSON object per
// line in <state-dir>/journal.jsonl. Before an action runs an "intent"
// record is appended and fsynced; after, an "outcome" record with the same
// ID. The file rotates by size (journal.jsonl.1 … .N), so it is bounded.
package journal

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/remediate-dev/remediate/internal/boundedfile"
	"github.com/remediate-dev/remediate/internal/clip"
	"github.com/remediate-dev/remediate/internal/termsafe"
)

// Kinds of records.
const (
	KindIntent    = "intent"    // an action is about to run
	KindOutcome   = "outcome"   // it returned (executed or failed)
	KindDryRun    = "dry-run"   // audit mode: what would have run (once per episode)
	KindVerified  = "verified"  // re-detection found the finding gone
	KindEscalated = "escalated" // attempts exhausted; no more actions on the target
	KindNote      = "note"      // daemon events worth an audit line (corrupt state, reload)
)

// Record is one journal line.
type Record struct {
	Time    time.Time      `json:"time"`
	ID      string         `json:"id,omitempty"`
	Kind    string         `json:"kind"`
	Node    string         `json:"node,omitempty"`
	Rule    string         `json:"rule,omitempty"`
	Target  string         `json:"target,omitempty"`
	Action  string         `json:"action,omitempty"`
	Outcome string         `json:"outcome,omitempty"`
	Summary string         `json:"summary,omitempty"`
	Error   string         `json:"error,omitempty"`
	Details map[string]any `json:"details,omitempty"`
}

// MaxLine is the longest line Append writes: a record whose JSON is longer
// has its outside strings clipped (marked) until it fits.
const MaxLine = 64 << 10

// MaxReadLine is the longest line ReadAll decodes; a longer one (written
// before lines were bounded) is skipped with a note, never a failure.
const MaxReadLine = 1 << 20

// protected are the kinds that record what the daemon did. Other kinds
// (dry-run, note) share a byte budget per hour so that no burst of them,
// in one cycle or many, rotates those records away.
var protected = map[string]bool{KindIntent: true, KindOutcome: true, KindVerified: true, KindEscalated: true}

// FileName is the journal's name inside the state dir.
const FileName = "journal.jsonl"

// Journal appends records; it is safe for concurrent use.
type Journal struct {
	mu       sync.Mutex
	path     string
	maxBytes int64
	keep     int

	// The budget of unprotected records: at most maxBytes per hour, so
	// with keep >= 3 one hour of them rotates away at most two files.
	windowStart time.Time
	windowBytes int64
	dropped     int
}

// Open returns a journal in dir that rotates at maxBytes keeping keep old
// files (defaults: 10 MiB, 5).
func Open(dir string, maxBytes int64, keep int) (*Journal, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("creating journal dir: %w", err)
	}
	if maxBytes <= 0 {
		maxBytes = 10 << 20
	}
	if keep <= 0 {
		keep = 5
	}
	return &Journal{path: filepath.Join(dir, FileName), maxBytes: maxBytes, keep: keep}, nil
}

// Path is the current journal file.
func (j *Journal) Path() string { return j.path }

// Append writes r as one line (at most MaxLine bytes) and fsyncs it before
// returning. Records of unprotected kinds over the hourly budget are
// dropped and counted; the next one that fits says how many were dropped.
func (j *Journal) Append(r Record) error {
	line, err := encode(r)
	if err != nil {
		return err
	}
	j.mu.Lock()
	defer j.mu.Unlock()
	if !protected[r.Kind] {
		if !j.budget(r.Time, int64(len(line))) {
			j.dropped++
			return nil
		}
		if j.dropped > 0 {
			r.Details = withDropped(r.Details, j.dropped)
			if line, err = encode(r); err != nil {
				return err
			}
			j.dropped = 0
		}
	}
	fi, statErr := os.Stat(j.path)
	created := statErr != nil
	if statErr == nil && fi.Size()+int64(len(line)) > j.maxBytes {
		if err := j.rotate(); err != nil {
			return err
		}
		created = true
	}
	// Never through a symlink or into a FIFO planted as the journal.
	f, err := boundedfile.OpenAppend(j.path, 0o600)
	if err != nil {
		return fmt.Errorf("opening journal: %w", err)
	}
	defer f.Close()
	if _, err := f.Write(line); err != nil {
		return fmt.Errorf("writing journal: %w", err)
	}
	if err := f.Sync(); err != nil {
		return fmt.Errorf("fsync journal: %w", err)
	}
	if created {
		// A new file (first record, or after rotation) is durable only once
		// its directory entry is.
		if err := syncDir(filepath.Dir(j.path)); err != nil {
			return err
		}
	}
	return nil
}

// budget reports whether n more bytes of unprotected records fit in the
// current hour's budget, and takes them if so.
func (j *Journal) budget(at time.Time, n int64) bool {
	if at.IsZero() {
		at = time.Now()
	}
	if j.windowStart.IsZero() || at.Sub(j.windowStart) >= time.Hour || at.Before(j.windowStart) {
		j.windowStart, j.windowBytes = at, 0
	}
	if j.windowBytes+n > j.maxBytes {
		return false
	}
	j.windowBytes += n
	return true
}

func withDropped(d map[string]any, n int) map[string]any {
	out := make(map[string]any, len(d)+1)
	for k, v := range d {
		out[k] = v
	}
	out["journalDroppedBefore"] = fmt.Sprintf("%d dry-run/note records were dropped before this one (their hourly journal budget was used up)", n)
	return out
}

// encode marshals r as one line of at most MaxLine bytes: when it is
// longer, its strings are clipped (marked) with a shrinking bound, and
// details that still do not fit are replaced by a clipped excerpt.
func encode(r Record) ([]byte, error) {
	// Outside strings are clipped before marshalling: a 2 MB command line
	// is never escaped whole.
	line, err := json.Marshal(clipRecord(r, clip.Max))
	if err != nil {
		return nil, fmt.Errorf("encoding journal record: %w", err)
	}
	for max := clip.Max / 2; len(line)+1 > MaxLine && max >= 64; max /= 2 {
		c := clipRecord(r, max)
		if line, err = json.Marshal(c); err != nil {
			return nil, fmt.Errorf("encoding journal record: %w", err)
		}
		if len(line)+1 > MaxLine && max < 128 {
			d, _ := json.Marshal(clip.Values(r.Details, 64))
			c.Details = map[string]any{"clipped": clip.String(string(d), 1024)}
			if line, err = json.Marshal(c); err != nil {
				return nil, fmt.Errorf("encoding journal record: %w", err)
			}
		}
	}
	if len(line)+1 > MaxLine { // unreachable with bounded fields; never write a longer line
		return nil, fmt.Errorf("journal record of %d bytes does not fit in %d", len(line), MaxLine)
	}
	return append(line, '\n'), nil
}

// clipRecord clips r's strings to max bytes (names and IDs to 256).
func clipRecord(r Record, max int) Record {
	c := r
	c.Summary, c.Error = clip.String(r.Summary, max), clip.String(r.Error, max)
	c.Target, c.Rule = clip.String(r.Target, max), clip.String(r.Rule, max)
	c.Node, c.Action, c.ID = clip.String(r.Node, 256), clip.String(r.Action, 256), clip.String(r.ID, 256)
	c.Details = clip.Values(r.Details, max)
	return c
}

func syncDir(dir string) error {
	d, err := boundedfile.OpenDir(dir)
	if err != nil {
		return fmt.Errorf("opening journal dir for fsync: %w", err)
	}
	defer d.Close()
	if err := d.Sync(); err != nil {
		return fmt.Errorf("fsync journal dir: %w", err)
	}
	return nil
}

func (j *Journal) rotate() error {
	_ = os.Remove(fmt.Sprintf("%s.%d", j.path, j.keep))
	for i := j.keep - 1; i >= 1; i-- {
		_ = os.Rename(fmt.Sprintf("%s.%d", j.path, i), fmt.Sprintf("%s.%d", j.path, i+1))
	}
	if err := os.Rename(j.path, j.path+".1"); err != nil {
		return fmt.Errorf("rotating journal: %w", err)
	}
	return nil
}

// maxReadBytes bounds each journal file ReadAll reads (a journal rotates
// at 10 MiB by default).
const maxReadBytes = 256 << 20

// Walk calls fn with each record in dir, oldest first, across rotated
// files, holding one record at a time: memory stays bounded by one line
// (MaxReadLine) whatever the journal's size (6 x 10 MiB at the writer's
// defaults, which read whole took 231-333 MB of heap, over the pod's
// limit). Lines that do not parse (a torn last line after a crash) are
// passed as KindNote records saying so rather than failing the whole
// read. An error of fn stops the walk and is returned.
func Walk(dir string, fn func(Record) error) error {
	base := filepath.Join(dir, FileName)
	var files []string
	for i := 50; i >= 1; i-- {
		if _, err := os.Stat(fmt.Sprintf("%s.%d", base, i)); err == nil {
			files = append(files, fmt.Sprintf("%s.%d", base, i))
		}
	}
	files = append(files, base)
	for _, name := range files {
		f, err := boundedfile.OpenBoundedNoFollow(name, maxReadBytes)
		if errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err != nil {
			return fmt.Errorf("opening journal: %w", err)
		}
		err = DecodeEach(f, fn)
		f.Close()
		if s, ok := err.(stopped); ok {
			return s.err
		}
		if err != nil {
			return fmt.Errorf("reading %s: %w", name, err)
		}
	}
	return nil
}

// ReadAll returns the records in dir, oldest first, across rotated files
// (see Walk), and those read before an error. It holds the whole journal
// in memory: for tests and small journals; the daemon, the CLI and the
// bundle use Walk.
func ReadAll(dir string) ([]Record, error) {
	var out []Record
	err := Walk(dir, func(r Record) error { out = append(out, r); return nil })
	return out, err
}

// stopped is an error of DecodeEach's fn (errors.Is finds it through).
type stopped struct{ err error }

func (s stopped) Error() string { return s.err.Error() }
func (s stopped) Unwrap() error { return s.err }

// Decode reads JSON-lines records from r (see DecodeEach).
func Decode(r io.Reader) ([]Record, error) {
	var out []Record
	err := DecodeEach(r, func(rec Record) error { out = append(out, rec); return nil })
	return out, err
}

// DecodeEach calls fn with each JSON-lines record of r, holding one line
// at a time. Any line length is read: a line over MaxReadLine bytes is
// skipped (without holding it in memory) and passed as a KindNote record
// saying so. An error of fn stops the read and is returned (wrapped:
// errors.Is and errors.As find it).
func DecodeEach(r io.Reader, fn func(Record) error) error {
	br := bufio.NewReaderSize(r, 64<<10)
	for n := 1; ; n++ {
		line, size, err := readLine(br, MaxReadLine)
		var rec Record
		emit := true
		if size > MaxReadLine {
			rec = Record{Kind: KindNote, Summary: fmt.Sprintf("journal line %d is %d bytes, over %d: skipped", n, size, MaxReadLine)}
		} else if t := bytes.TrimSpace(line); len(t) > 0 {
			if uerr := json.Unmarshal(t, &rec); uerr != nil {
				rec = Record{Kind: KindNote, Summary: fmt.Sprintf("unreadable journal line %d: %v", n, uerr)}
			}
		} else {
			emit = false
		}
		if emit {
			if ferr := fn(rec); ferr != nil {
				return stopped{ferr}
			}
		}
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
	}
}

// readLine returns the next line without its newline, and its full size;
// bytes past max are read and discarded (line is nil then).
func readLine(br *bufio.Reader, max int) ([]byte, int, error) {
	var line []byte
	size := 0
	for {
		chunk, err := br.ReadSlice('\n')
		if len(chunk) > 0 && chunk[len(chunk)-1] == '\n' {
			chunk = chunk[:len(chunk)-1]
		}
		size += len(chunk)
		if size <= max {
			line = append(line, chunk...)
		} else {
			line = nil
		}
		if errors.Is(err, bufio.ErrBufferFull) {
			continue
		}
		return line, size, err
	}
}

// Format renders a record as one readable line, safe for a terminal: a
// record carries outside text (a process's argv in a target or an error),
// so the line goes through termsafe.Line (escape sequences, controls,
// bidi overrides and newlines shown escaped).
func Format(r Record) string {
	var b strings.Builder
	ts := "????-??-??T??:??:??Z"
	if !r.Time.IsZero() {
		ts = r.Time.UTC().Format(time.RFC3339)
	}
	fmt.Fprintf(&b, "%s  %-9s", ts, r.Kind)
	if r.Rule != "" {
		fmt.Fprintf(&b, "  rule=%s", r.Rule)
	}
	if r.Action != "" {
		fmt.Fprintf(&b, " action=%s", r.Action)
	}
	if r.Target != "" {
		fmt.Fprintf(&b, " target=%s", r.Target)
	}
	if r.Outcome != "" {
		fmt.Fprintf(&b, " outcome=%s", r.Outcome)
	}
	if r.Summary != "" {
		fmt.Fprintf(&b, "  %s", r.Summary)
	}
	if r.Error != "" {
		fmt.Fprintf(&b, "  error: %s", r.Error)
	}
	if len(r.Details) > 0 {
		d, _ := json.Marshal(r.Details)
		fmt.Fprintf(&b, "  %s", d)
	}
	if r.ID != "" {
		fmt.Fprintf(&b, "  [%s]", r.ID)
	}
	return termsafe.Line(b.String())
}
