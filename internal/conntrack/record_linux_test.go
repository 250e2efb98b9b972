package conntrack

import (
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestRecordRefusesPlantedFiles (issue 27, item 7): a FIFO at
// STATE/conntrack-max.json hung ConntrackExhaustion until restart (an
// open(2) waiting for a writer); a symlink there was followed. Both are
// refused at once with an error naming the file.
func TestRecordRefusesPlantedFiles(t *testing.T) {
	fifoDir, linkDir := t.TempDir(), t.TempDir()
	if err := syscall.Mkfifo(filepath.Join(fifoDir, RecordFile), 0o600); err != nil {
		t.Fatal(err)
	}
	elsewhere := filepath.Join(t.TempDir(), "rec.json")
	if err := os.WriteFile(elsewhere, []byte(`{"max": 262144}`), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(elsewhere, filepath.Join(linkDir, RecordFile)); err != nil {
		t.Fatal(err)
	}
	for dir, want := range map[string]string{fifoDir: "not a regular file", linkDir: "symbolic links"} {
		done := make(chan error, 1)
		go func() { _, _, err := readRecord(dir); done <- err }()
		select {
		case err := <-done:
			if err == nil || !strings.Contains(err.Error(), want) {
				t.Errorf("readRecord(%s): %v, want an error containing %q", dir, err, want)
			}
		case <-time.After(time.Minute): // a hang, not a timing check
			t.Fatalf("readRecord(%s) blocked", dir)
		}
	}
}
