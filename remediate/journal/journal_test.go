package journal

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestAppendRotateRead(t *testing.T) {
	dir := t.TempDir()
	j, err := Open(dir, 600, 2)
	if err != nil {
		t.Fatal(err)
	}
	t0 := time.Date(2026, 11, 21, 12, 0, 0, 0, time.UTC)
	for i := 0; i < 20; i++ {
		if err := j.Append(Record{Time: t0.Add(time.Duration(i) * time.Second), ID: fmt.Sprint(i), Kind: KindIntent, Rule: "r", Summary: "kill pid 1234"}); err != nil {
			t.Fatal(err)
		}
	}
	files, _ := filepath.Glob(filepath.Join(dir, FileName+"*"))
	if len(files) != 3 {
		t.Fatalf("want current + 2 rotated files, got %v", files)
	}
	for _, f := range files {
		if fi, _ := os.Stat(f); fi.Size() > 600 {
			t.Fatalf("%s is %d bytes, bound is 600", f, fi.Size())
		}
	}
	recs, err := ReadAll(dir)
	if err != nil {
		t.Fatal(err)
	}
	// Oldest first, newest kept, oldest dropped by the bound.
	if recs[len(recs)-1].ID != "19" || recs[0].ID == "0" {
		t.Fatalf("records %s..%s", recs[0].ID, recs[len(recs)-1].ID)
	}
	for i := 1; i < len(recs); i++ {
		if !recs[i].Time.After(recs[i-1].Time) {
			t.Fatalf("not in order at %d", i)
		}
	}
}

func TestTornLineIsReportedNotFatal(t *testing.T) {
	dir := t.TempDir()
	j, _ := Open(dir, 0, 0)
	_ = j.Append(Record{Kind: KindIntent, Rule: "r"})
	f, _ := os.OpenFile(j.Path(), os.O_APPEND|os.O_WRONLY, 0)
	f.WriteString(`{"kind":"outc`) // crash mid-write
	f.Close()
	recs, err := ReadAll(dir)
	if err != nil || len(recs) != 2 || recs[1].Kind != KindNote || !strings.Contains(recs[1].Summary, "unreadable journal line 2") {
		t.Fatalf("recs=%+v err=%v", recs, err)
	}
}

func TestFormat(t *testing.T) {
	s := Format(Record{Time: time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC), Kind: KindOutcome, Rule: "r", Action: "KillProcess",
		Target: "process/1@2", Outcome: "failed", Error: "no such process", Details: map[string]any{"pid": 1}, ID: "x"})
	want := `2026-01-02T03:04:05Z  outcome    rule=r action=KillProcess target=process/1@2 outcome=failed  error: no such process  {"pid":1}  [x]`
	if s != want {
		t.Fatalf("\n got %q\nwant %q", s, want)
	}
}

// TestHostileEvidenceIsBounded: six findings with a 2 MB command line (the
// attack from issue 13) make lines of at most MaxLine bytes, marked as
// clipped; a burst of dry-run records cannot rotate away the earlier
// intent/outcome records; and a 3 MB line written before the bound is read
// past, not a failure.
func TestHostileEvidenceIsBounded(t *testing.T) {
	dir := t.TempDir()
	j, err := Open(dir, 1<<20, 5)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Date(2026, 11, 23, 12, 0, 0, 0, time.UTC)
	if err := j.Append(Record{Time: now, ID: "a1", Kind: KindIntent, Rule: "kill", Target: "process/1@2"}); err != nil {
		t.Fatal(err)
	}
	if err := j.Append(Record{Time: now, ID: "a1", Kind: KindOutcome, Outcome: "executed"}); err != nil {
		t.Fatal(err)
	}
	huge := strings.Repeat("A\x01", 1<<20)
	for i := 0; i < 200; i++ {
		err := j.Append(Record{Time: now.Add(time.Second), Kind: KindDryRun, Rule: "kill", Target: fmt.Sprintf("process/%d@1", i),
			Summary: "would kill " + huge, Details: map[string]any{"cmdline": huge, "holders": []map[string]any{{"cmdline": huge}}, "argv": []string{huge, huge}}})
		if err != nil {
			t.Fatal(err)
		}
	}
	// A protected record after the burst still gets in.
	if err := j.Append(Record{Time: now.Add(2 * time.Second), ID: "a2", Kind: KindIntent, Summary: huge}); err != nil {
		t.Fatal(err)
	}
	files, _ := filepath.Glob(filepath.Join(dir, FileName+"*"))
	for _, name := range files {
		b, err := os.ReadFile(name)
		if err != nil {
			t.Fatal(err)
		}
		for i, line := range strings.Split(string(b), "\n") {
			if len(line)+1 > MaxLine {
				t.Fatalf("%s line %d is %d bytes", name, i+1, len(line))
			}
		}
	}
	recs, err := ReadAll(dir)
	if err != nil {
		t.Fatal(err)
	}
	var kinds []string
	dry, dropped := 0, ""
	for _, r := range recs {
		if r.ID != "" {
			kinds = append(kinds, r.ID+":"+r.Kind)
		}
		if r.Kind == KindDryRun {
			dry++
			if !strings.Contains(r.Summary, "…[clipped ") {
				t.Fatalf("dry-run summary not marked clipped: %d bytes", len(r.Summary))
			}
		}
		if s, ok := r.Details["journalDroppedBefore"].(string); ok {
			dropped = s
		}
	}
	if strings.Join(kinds, " ") != "a1:intent a1:outcome a2:intent" {
		t.Errorf("action records = %v", kinds)
	}
	if dry == 0 || dry == 200 {
		t.Errorf("%d of 200 dry-run records kept: want some, bounded by the hourly budget", dry)
	}
	// The next unprotected record in a new hour says how many were dropped.
	if err := j.Append(Record{Time: now.Add(2 * time.Hour), Kind: KindNote, Summary: "later"}); err != nil {
		t.Fatal(err)
	}
	recs, _ = ReadAll(dir)
	if last := recs[len(recs)-1]; last.Summary != "later" || !strings.Contains(fmt.Sprint(last.Details["journalDroppedBefore"]), fmt.Sprintf("%d dry-run/note records", 200-dry)) {
		t.Errorf("last = %+v (dropped note before: %q)", last, dropped)
	}

	// An old unbounded line is skipped with a note; the records around it read.
	old := filepath.Join(t.TempDir(), FileName)
	content := `{"kind":"intent","id":"x"}` + "\n" + `{"kind":"note","summary":"` + strings.Repeat("x", 3<<20) + `"}` + "\n" + `{"kind":"outcome","id":"x"}`
	if err := os.WriteFile(old, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	recs, err = ReadAll(filepath.Dir(old))
	if err != nil || len(recs) != 3 || recs[0].ID != "x" || recs[2].Kind != KindOutcome || !strings.Contains(recs[1].Summary, "over 1048576: skipped") {
		t.Fatalf("reading a 3 MB line: %+v %v", recs, err)
	}
}

func FuzzDecode(f *testing.F) {
	f.Add([]byte(`{"kind":"intent","id":"x"}` + "\n\n" + `{bad`))
	f.Add([]byte("\n\n\n"))
	f.Fuzz(func(t *testing.T, b []byte) {
		recs, err := Decode(bytes.NewReader(b))
		if err != nil {
			t.Fatal(err)
		}
		if len(recs) > bytes.Count(b, []byte("\n"))+1 {
			t.Fatalf("%d records from %d lines", len(recs), bytes.Count(b, []byte("\n"))+1)
		}
	})
}
