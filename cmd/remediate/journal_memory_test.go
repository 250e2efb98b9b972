package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/remediate-dev/remediate/remediate/journal"
)

// TestJournalCommandBoundedRSS: `remediate journal` over a journal at the
// writer's default rotation (6 x 10 MiB) streams it: the process's peak
// RSS stays within a few MiB of an empty journal's (this test binary as
// main: 75 MiB; 78 MiB over 60 MiB of journal). Before, it read the whole
// journal: 438 MiB (text) and 421 MiB (json) here, 231-333 MB in issue 38.
func TestJournalCommandBoundedRSS(t *testing.T) {
	if testing.Short() {
		t.Skip("writes 60 MiB")
	}
	dir := t.TempDir()
	t0 := time.Date(2026, 11, 21, 12, 0, 0, 0, time.UTC)
	n := 0
	for i := 5; i >= 0; i-- {
		name := filepath.Join(dir, journal.FileName)
		if i > 0 {
			name = fmt.Sprintf("%s.%d", name, i)
		}
		f, err := os.Create(name)
		if err != nil {
			t.Fatal(err)
		}
		w := bufio.NewWriter(f)
		for size := 0; size < 10<<20; n++ {
			b, _ := json.Marshal(journal.Record{Time: t0.Add(time.Duration(n) * time.Second), ID: fmt.Sprintf("a%08d", n), Kind: journal.KindOutcome,
				Rule: "stale-conntrack", Target: fmt.Sprintf("udp/10.96.%d.%d:53", n%250, n%200), Action: "FlushConntrackEntries", Outcome: "executed",
				Summary: "deleted 3 conntrack entries to a backend no longer in the Service's endpoints",
				Details: map[string]any{"deleted": 3, "service": "kube-system/kube-dns", "backends": []any{"10.244.1.7", "10.244.2.9"},
					"evidence": map[string]any{"entries": 3, "oldest": "2026-11-21T11:00:00Z", "protocol": "udp"}}})
			w.Write(b)
			w.WriteByte('\n')
			size += len(b) + 1
		}
		if err := w.Flush(); err != nil {
			t.Fatal(err)
		}
		f.Close()
	}
	empty := t.TempDir()
	base := mainCmd(os.Args[0], "journal", "--state-dir", empty)
	if err := base.Run(); err != nil {
		t.Fatal(err)
	}
	baseRSS := base.ProcessState.SysUsage().(*syscall.Rusage).Maxrss >> 10
	t.Logf("baseline (empty journal): peak RSS %d MiB", baseRSS)
	for _, format := range []string{"text", "json"} {
		cmd := mainCmd(os.Args[0], "journal", "--state-dir", dir, "-o", format)
		var lines countingWriter
		cmd.Stdout = &lines
		var stderr strings.Builder
		cmd.Stderr = &stderr
		if err := cmd.Run(); err != nil {
			t.Fatalf("%v: %s", err, stderr.String())
		}
		rss := cmd.ProcessState.SysUsage().(*syscall.Rusage).Maxrss >> 10 // KiB to MiB
		t.Logf("remediate journal -o %s: %d records, peak RSS %d MiB", format, lines.n, rss)
		if lines.n != n {
			t.Errorf("-o %s printed %d lines, want %d", format, lines.n, n)
		}
		if rss > baseRSS+24 {
			t.Errorf("-o %s: peak RSS %d MiB, want under %d MiB (the empty journal's %d + 24; the pod's limit is 192Mi)", format, rss, baseRSS+24, baseRSS)
		}
	}
}

// countingWriter counts newlines.
type countingWriter struct{ n int }

func (c *countingWriter) Write(p []byte) (int, error) {
	c.n += strings.Count(string(p), "\n")
	return len(p), nil
}

// TestJournalTailLines: the bundle's tail is the last n records, oldest
// first, for journals shorter and longer than n.
func TestJournalTailLines(t *testing.T) {
	dir := t.TempDir()
	j, err := journal.Open(dir, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 7; i++ {
		if err := j.Append(journal.Record{Kind: journal.KindIntent, Rule: fmt.Sprintf("r%d", i)}); err != nil {
			t.Fatal(err)
		}
	}
	for _, c := range []struct {
		n     int
		first string
		lines int
	}{{3, "rule=r4", 3}, {7, "rule=r0", 7}, {10, "rule=r0", 7}, {1, "rule=r6", 1}} {
		got, err := journalTailLines(dir, c.n)
		if err != nil || len(got) != c.lines || !strings.Contains(got[0], c.first) || !strings.Contains(got[len(got)-1], "rule=r6") {
			t.Errorf("n=%d: %q %v", c.n, got, err)
		}
	}
}
