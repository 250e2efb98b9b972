package journal

import (
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestJournalRefusesPlantedFiles (issue 27, item 8): journal.jsonl
// replaced by a symlink is not followed (on main a record was appended to
// the link's target), and by a FIFO is not waited on; ReadAll refuses
// both too. Each answer is an error naming the file.
func TestJournalRefusesPlantedFiles(t *testing.T) {
	dir := t.TempDir()
	victim := filepath.Join(t.TempDir(), "victim")
	if err := os.WriteFile(victim, []byte("not the journal\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(victim, filepath.Join(dir, FileName)); err != nil {
		t.Fatal(err)
	}
	j, err := Open(dir, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	rec := Record{Time: time.Date(2026, 11, 25, 12, 0, 0, 0, time.UTC), ID: "1", Kind: KindIntent, Rule: "r", Summary: "dry-run kill"}
	if err := j.Append(rec); err == nil || !strings.Contains(err.Error(), "symbolic links") {
		t.Errorf("Append through a symlink: %v, want a refusal", err)
	}
	if b, _ := os.ReadFile(victim); string(b) != "not the journal\n" {
		t.Fatalf("the symlink's target was written: %q", b)
	}
	if _, err := ReadAll(dir); err == nil || !strings.Contains(err.Error(), "symbolic links") {
		t.Errorf("ReadAll through a symlink: %v, want a refusal", err)
	}

	fdir := t.TempDir()
	if err := syscall.Mkfifo(filepath.Join(fdir, FileName), 0o600); err != nil {
		t.Fatal(err)
	}
	jf, err := Open(fdir, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	if err := jf.Append(rec); err == nil {
		t.Error("Append to a FIFO succeeded")
	}
	if _, err := ReadAll(fdir); err == nil || !strings.Contains(err.Error(), "not a regular file") {
		t.Errorf("ReadAll of a FIFO: %v, want a refusal", err)
	}
}
