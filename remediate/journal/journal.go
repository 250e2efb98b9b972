// Package journal is the daemon's append-only audit log: one JSON object per
// line in <state-dir>/journal.jsonl. Before an action runs an "intent"
// record is appended and fsynced; after, an "outcome" record with the same
// ID. The file rotates by size (journal.jsonl.1 … .N), so it is bounded.
package journal

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"
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

// FileName is the journal's name inside the state dir.
const FileName = "journal.jsonl"

// Journal appends records; it is safe for concurrent use.
type Journal struct {
	mu       sync.Mutex
	path     string
	maxBytes int64
	keep     int
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

// Append writes r as one line and fsyncs it before returning.
func (j *Journal) Append(r Record) error {
	line, err := json.Marshal(r)
	if err != nil {
		return fmt.Errorf("encoding journal record: %w", err)
	}
	line = append(line, '\n')
	j.mu.Lock()
	defer j.mu.Unlock()
	fi, statErr := os.Stat(j.path)
	created := statErr != nil
	if statErr == nil && fi.Size()+int64(len(line)) > j.maxBytes {
		if err := j.rotate(); err != nil {
			return err
		}
		created = true
	}
	f, err := os.OpenFile(j.path, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
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

func syncDir(dir string) error {
	d, err := os.Open(dir)
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

// ReadAll returns the records in dir, oldest first, across rotated files.
// Lines that do not parse (a torn last line after a crash) are returned as
// KindNote records saying so rather than failing the whole read.
func ReadAll(dir string) ([]Record, error) {
	base := filepath.Join(dir, FileName)
	var files []string
	for i := 50; i >= 1; i-- {
		if _, err := os.Stat(fmt.Sprintf("%s.%d", base, i)); err == nil {
			files = append(files, fmt.Sprintf("%s.%d", base, i))
		}
	}
	files = append(files, base)
	var out []Record
	for _, name := range files {
		f, err := os.Open(name)
		if errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err != nil {
			return out, fmt.Errorf("opening journal: %w", err)
		}
		recs, err := Decode(f)
		f.Close()
		out = append(out, recs...)
		if err != nil {
			return out, fmt.Errorf("reading %s: %w", name, err)
		}
	}
	return out, nil
}

// Decode reads JSON-lines records from r.
func Decode(r io.Reader) ([]Record, error) {
	var out []Record
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 4<<20)
	n := 0
	for sc.Scan() {
		n++
		line := strings.TrimSpace(sc.Text())
		if line == "" {
			continue
		}
		var rec Record
		if err := json.Unmarshal([]byte(line), &rec); err != nil {
			out = append(out, Record{Kind: KindNote, Summary: fmt.Sprintf("unreadable journal line %d: %v", n, err)})
			continue
		}
		out = append(out, rec)
	}
	return out, sc.Err()
}

// Format renders a record as one readable line.
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
	return b.String()
}
