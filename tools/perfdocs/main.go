// Command perfdocs renders docs/PERFORMANCE.md from recorded Go benchmark
// output (docs/perf/bench.txt, written by `make perf-docs`): the machine
// and the date from the input's configuration lines, then one table per
// package, one row per benchmark with the median and range of each unit
// over its runs and the first sentence of the benchmark's doc comment.
// The page is never edited by hand; its test checks that it is what the
// recorded input renders to.
//
//	go run ./tools/perfdocs -in docs/perf/bench.txt -out docs/PERFORMANCE.md
package main

import (
	"bytes"
	"flag"
	"fmt"
	"os"
)

func main() {
	in := flag.String("in", "docs/perf/bench.txt", "recorded `go test -bench` output, with the machine's configuration lines")
	out := flag.String("out", "docs/PERFORMANCE.md", "the page to write")
	root := flag.String("root", ".", "the module's root: benchmark doc comments are read from its packages' test files")
	flag.Parse()
	if err := run(*in, *out, *root); err != nil {
		fmt.Fprintln(os.Stderr, "perfdocs:", err)
		os.Exit(1)
	}
}

func run(in, out, root string) error {
	raw, err := os.ReadFile(in)
	if err != nil {
		return fmt.Errorf("reading the recorded benchmarks: %w", err)
	}
	rec, err := Parse(bytes.NewReader(raw))
	if err != nil {
		return fmt.Errorf("%s: %w", in, err)
	}
	docs, err := BenchmarkDocs(root, rec.Packages())
	if err != nil {
		return err
	}
	page := Render(rec, in, docs)
	if err := os.WriteFile(out, page, 0o644); err != nil {
		return fmt.Errorf("writing %s: %w", out, err)
	}
	return nil
}
