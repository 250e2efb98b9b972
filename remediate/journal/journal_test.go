package journal

import (
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
