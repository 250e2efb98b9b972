package main

import (
	"bufio"
	"fmt"
	"io"
	"regexp"
	"slices"
	"strconv"
	"strings"
)

// Record is a recorded benchmark run: its configuration lines (date,
// kernel, cores, go, loadavg, command, and go test's goos, goarch, cpu) and
// every result line, in input order.
type Record struct {
	// Config holds the last value of each configuration key.
	Config map[string]string
	// Results are the benchmark result lines.
	Results []Result
	// Skipped are benchmarks that skipped, with the first line of the reason.
	Skipped []Skip
	// Failed are the packages whose benchmarks failed (a FAIL line).
	Failed []string
}

// Result is one benchmark result line.
type Result struct {
	// Pkg is the import path the preceding `pkg:` line named.
	Pkg string
	// Name is the benchmark's name without the -GOMAXPROCS suffix
	// (sub-benchmarks keep their /part).
	Name string
	// Iterations is b.N.
	Iterations int64
	// Values are the measured values by unit (ns/op, B/op, allocs/op,
	// and any b.ReportMetric unit).
	Values map[string]float64
	// Units is the units in the order the line gave them.
	Units []string
}

// Skip is a benchmark that called b.Skip.
type Skip struct {
	Pkg, Name, Reason string
}

// maxLine bounds one input line (a benchmark's log output can be long).
const maxLine = 1 << 20

var (
	configLine = regexp.MustCompile(`^([a-z][^\s:]*):\s*(.*)$`)
	procsSuf   = regexp.MustCompile(`-\d+$`)
)

// Parse reads go test -bench output in the Go benchmark format: a line
// `key: value` sets a configuration key (`pkg:` the package of the results
// that follow), a line starting with Benchmark is a result (name,
// iterations, then value-unit pairs), `--- SKIP: BenchmarkX` and its
// indented next line a skip; anything else (PASS, ok, logs) is ignored.
func Parse(r io.Reader) (*Record, error) {
	rec := &Record{Config: map[string]string{}}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64*1024), maxLine)
	pkg := ""
	var pendingSkip *Skip
	n := 0
	for sc.Scan() {
		n++
		line := strings.TrimRight(sc.Text(), "\r")
		if pendingSkip != nil {
			if strings.HasPrefix(line, "    ") {
				pendingSkip.Reason = strings.TrimSpace(line)
				rec.Skipped = append(rec.Skipped, *pendingSkip)
				pendingSkip = nil
				continue
			}
			rec.Skipped = append(rec.Skipped, *pendingSkip)
			pendingSkip = nil
		}
		switch {
		case strings.HasPrefix(line, "Benchmark"):
			res, ok, err := parseResult(line)
			if err != nil {
				return nil, fmt.Errorf("line %d: %w", n, err)
			}
			if ok {
				res.Pkg = pkg
				rec.Results = append(rec.Results, res)
			}
		case strings.HasPrefix(line, "--- SKIP: Benchmark"):
			name := strings.Fields(strings.TrimPrefix(line, "--- SKIP: "))[0]
			pendingSkip = &Skip{Pkg: pkg, Name: procsSuf.ReplaceAllString(name, "")}
		case strings.HasPrefix(line, "FAIL\t"):
			rec.Failed = append(rec.Failed, strings.Fields(line)[1])
		default:
			if m := configLine.FindStringSubmatch(line); m != nil {
				if m[1] == "pkg" {
					pkg = strings.TrimSpace(m[2])
				}
				rec.Config[m[1]] = strings.TrimSpace(m[2])
			}
		}
	}
	if pendingSkip != nil {
		rec.Skipped = append(rec.Skipped, *pendingSkip)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("line %d: %w", n+1, err)
	}
	return rec, nil
}

// parseResult parses a result line; ok is false for a line that starts
// with Benchmark but is not a result (a benchmark's log line, a name
// printed alone before its result by -v).
func parseResult(line string) (Result, bool, error) {
	f := strings.Fields(line)
	if len(f) < 4 || len(f)%2 != 0 {
		return Result{}, false, nil
	}
	iters, err := strconv.ParseInt(f[1], 10, 64)
	if err != nil || iters <= 0 {
		return Result{}, false, nil
	}
	res := Result{Name: procsSuf.ReplaceAllString(f[0], ""), Iterations: iters, Values: map[string]float64{}}
	for i := 2; i+1 < len(f); i += 2 {
		v, err := strconv.ParseFloat(f[i], 64)
		if err != nil {
			return Result{}, false, fmt.Errorf("%s: value %q of unit %q: %w", f[0], f[i], f[i+1], err)
		}
		unit := f[i+1]
		if _, dup := res.Values[unit]; dup {
			return Result{}, false, fmt.Errorf("%s: unit %q twice", f[0], unit)
		}
		res.Values[unit] = v
		res.Units = append(res.Units, unit)
	}
	return res, true, nil
}

// Packages lists the packages of the results and skips, in input order.
func (r *Record) Packages() []string {
	var out []string
	for _, res := range r.Results {
		if !slices.Contains(out, res.Pkg) {
			out = append(out, res.Pkg)
		}
	}
	for _, s := range r.Skipped {
		if !slices.Contains(out, s.Pkg) {
			out = append(out, s.Pkg)
		}
	}
	return out
}
