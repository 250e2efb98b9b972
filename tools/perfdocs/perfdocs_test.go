package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

const root = "../.."

// TestPerformanceMDIsGenerated: docs/PERFORMANCE.md is exactly what the
// recorded input docs/perf/bench.txt renders to (with the benchmarks' doc
// comments as they are now): a figure edited by hand, or a new recording
// not rendered, fails here.
func TestPerformanceMDIsGenerated(t *testing.T) {
	in := "docs/perf/bench.txt"
	raw, err := os.ReadFile(filepath.Join(root, in))
	if err != nil {
		t.Fatal(err)
	}
	rec, err := Parse(bytes.NewReader(raw))
	if err != nil {
		t.Fatal(err)
	}
	if len(rec.Results) < 5 {
		t.Fatalf("%s holds %d results", in, len(rec.Results))
	}
	for _, k := range []string{"date", "cpu", "cores", "kernel", "go", "command"} {
		if rec.Config[k] == "" {
			t.Errorf("%s does not record %s", in, k)
		}
	}
	docs, err := BenchmarkDocs(root, rec.Packages())
	if err != nil {
		t.Fatal(err)
	}
	want := Render(rec, in, docs)
	got, err := os.ReadFile(filepath.Join(root, "docs", "PERFORMANCE.md"))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		gl, wl := strings.Split(string(got), "\n"), strings.Split(string(want), "\n")
		for i := range max(len(gl), len(wl)) {
			var g, w string
			if i < len(gl) {
				g = gl[i]
			}
			if i < len(wl) {
				w = wl[i]
			}
			if g != w {
				t.Fatalf("docs/PERFORMANCE.md is not what %s renders to (`make perf-docs-render`; never edit it by hand): line %d is\n%s\nwant\n%s", in, i+1, g, w)
			}
		}
	}
}

const sample = `date: 2026-11-25T21:00:00Z
kernel: Linux 6.18
cores: 2
go: go1.26.8
command: go test -bench .
goos: linux
goarch: amd64
pkg: github.com/remediate-dev/remediate/tools/perfdocs
cpu: Some CPU   
BenchmarkSample-2   	      10	 2000000 ns/op	    2048 B/op	      10 allocs/op	 5.00 rules/op
BenchmarkSample-2   	      10	 3000000 ns/op	    2048 B/op	      12 allocs/op	 7.00 rules/op
BenchmarkSample-2   	      10	 1000000 ns/op	    2048 B/op	      11 allocs/op	 6.00 rules/op
BenchmarkSample/sub-2         	 1000000	      1500 ns/op
BenchmarkSample-2   	     some log line from the benchmark
--- SKIP: BenchmarkNeedsRoot
    bench_test.go:12: needs root
PASS
ok  	github.com/remediate-dev/remediate/tools/perfdocs	3.1s
FAIL	github.com/remediate-dev/remediate/internal/other [build failed]
`

// BenchmarkSample is what the test's sample input measures. More text.
func BenchmarkSample(b *testing.B) {
	for b.Loop() {
	}
}

func TestParseAndRender(t *testing.T) {
	rec, err := Parse(strings.NewReader(sample))
	if err != nil {
		t.Fatal(err)
	}
	if len(rec.Results) != 4 || rec.Results[0].Name != "BenchmarkSample" || rec.Results[3].Name != "BenchmarkSample/sub" {
		t.Fatalf("results %+v", rec.Results)
	}
	if rec.Config["cpu"] != "Some CPU" || len(rec.Skipped) != 1 || rec.Skipped[0].Reason != "bench_test.go:12: needs root" {
		t.Fatalf("config %v skipped %+v", rec.Config, rec.Skipped)
	}
	docs, err := BenchmarkDocs(root, rec.Packages())
	if err != nil {
		t.Fatal(err)
	}
	page := string(Render(rec, "in.txt", docs))
	for _, want := range []string{
		"| CPU | Some CPU |",
		"| cores | 2 |",
		"| command | `go test -bench .` |",
		"\n## tools/perfdocs\n",
		// median and range of three runs, each unit
		"| `BenchmarkSample` | 3 | 2 ms (1 ms–3 ms) | 2 KiB | 11 (10–12) | 6 (5–7) rules/op | BenchmarkSample is what the test's sample input measures. |",
		"| `BenchmarkSample/sub` | 1 | 1.50 µs | – | – |  | BenchmarkSample is what the test's sample input measures. |",
		"`BenchmarkNeedsRoot` skipped: bench_test.go:12: needs root",
		"**Failed** (no figures): github.com/remediate-dev/remediate/internal/other",
		"Do not edit.",
	} {
		if !strings.Contains(page, want) {
			t.Errorf("page lacks %q:\n%s", want, page)
		}
	}
}

func TestFirstSentence(t *testing.T) {
	for doc, want := range map[string]string{
		"BenchmarkX measures a thing. More.\n":                          "BenchmarkX measures a thing.",
		"BenchmarkX is one cycle, each case:\n  - a: one\n  - b: two\n": "BenchmarkX is one cycle, each case",
		"BenchmarkX is one cycle:\n- a\n":                               "BenchmarkX is one cycle",
		"First line\ngoes on\n\nSecond paragraph.":                      "First line goes on",
	} {
		if got := firstSentence(doc); got != want {
			t.Errorf("firstSentence(%q) = %q, want %q", doc, got, want)
		}
	}
}

func TestParseRefusesBadValues(t *testing.T) {
	for _, in := range []string{
		"BenchmarkX-2 10 abc ns/op\n",
		"BenchmarkX-2 10 1 ns/op 2 ns/op\n",
	} {
		if _, err := Parse(strings.NewReader(in)); err == nil {
			t.Errorf("%q parsed", in)
		}
	}
}

// FuzzParse: any input is parsed or refused with an error, never a panic,
// and whatever parses renders.
func FuzzParse(f *testing.F) {
	f.Add(sample)
	f.Add("BenchmarkX-2 1 1 ns/op\n--- SKIP: BenchmarkY")
	f.Add("pkg: x\nBenchmark 1 1 u\n")
	f.Fuzz(func(t *testing.T, in string) {
		rec, err := Parse(strings.NewReader(in))
		if err != nil {
			return
		}
		_ = Render(rec, "in", nil)
	})
}
