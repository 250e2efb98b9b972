package deploy

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
)

var (
	promString   = regexp.MustCompile(`"(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*'`)
	promMatchers = regexp.MustCompile(`\{[^}]*\}`)
	promRange    = regexp.MustCompile(`\[[^\]]*\]`)
	promGrouping = regexp.MustCompile(`\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)`)
	promIdent    = regexp.MustCompile(`[a-zA-Z_:][a-zA-Z0-9_:]*(\s*\()?`)
	promKeywords = map[string]bool{"by": true, "without": true, "on": true, "ignoring": true, "group_left": true,
		"group_right": true, "bool": true, "and": true, "or": true, "unless": true, "offset": true, "inf": true, "nan": true}
)

// promQLMetrics returns the metric names a PromQL expression reads: what
// remains once strings, label matchers, ranges, grouping clauses, function
// calls and keywords are taken out.
func promQLMetrics(expr string) []string {
	e := promString.ReplaceAllString(expr, `""`)
	e = promMatchers.ReplaceAllString(e, " ")
	e = promRange.ReplaceAllString(e, " ")
	e = promGrouping.ReplaceAllString(e, " ")
	var out []string
	for _, m := range promIdent.FindAllString(e, -1) {
		if strings.HasSuffix(m, "(") || promKeywords[strings.ToLower(m)] {
			continue
		}
		// A number's exponent or a duration suffix (1e3, 5m) never reaches
		// here: identifiers cannot start with a digit, and the regexp only
		// matches from a letter; skip pieces glued to digits.
		out = append(out, m)
	}
	return out
}

func TestPromQLMetrics(t *testing.T) {
	for expr, want := range map[string][]string{
		`sum by (rule) (rate(foo_total{a="b",c=~"x|y"}[5m])) > 0`:                                 {"foo_total"},
		`time() - bar_seconds > 300`:                                                              {"bar_seconds"},
		`histogram_quantile(0.99, sum by (le) (rate(h_bucket{node=~"$node"}[$__rate_interval])))`: {"h_bucket"},
		`a unless on (x) b or c * ignoring(y) group_left (z) d`:                                   {"a", "b", "c", "d"},
		`up{job=~".*remediate.*"} == 0`:                                                           {"up"},
		`max without (severity) (f{detector=~"(?i).*(drift|x).*"}) > 0`:                           {"f"},
	} {
		if got := promQLMetrics(expr); !slices.Equal(got, want) {
			t.Errorf("%s: %v, want %v", expr, got, want)
		}
	}
}

// dashboardExprs returns every query of the Grafana dashboard (panels and
// template variables).
func dashboardExprs(t *testing.T) map[string]string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(Dir(), "dashboards", "remediate-fleet.json"))
	if err != nil {
		t.Fatal(err)
	}
	var d struct {
		Panels []struct {
			Title   string `json:"title"`
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
		Templating struct {
			List []struct {
				Name       string `json:"name"`
				Definition string `json:"definition"`
			} `json:"list"`
		} `json:"templating"`
	}
	if err := json.Unmarshal(b, &d); err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for _, p := range d.Panels {
		if len(p.Targets) == 0 {
			t.Errorf("panel %q has no query", p.Title)
		}
		for i, q := range p.Targets {
			out[fmt.Sprintf("dashboard panel %q #%d", p.Title, i)] = q.Expr
		}
	}
	labelValues := regexp.MustCompile(`^label_values\(([a-zA-Z_:][a-zA-Z0-9_:]*),`)
	for _, v := range d.Templating.List {
		if m := labelValues.FindStringSubmatch(v.Definition); m != nil {
			out["dashboard variable "+v.Name] = m[1]
		}
	}
	if len(out) < 10 {
		t.Errorf("only %d dashboard queries", len(out))
	}
	return out
}

// startDaemon builds the real binary and runs it as a daemon (audit mode,
// forced dry-run) with its metrics on a loopback port, kube-proxy pointed
// at a closed loopback port (so it has a finding), until the test ends.
// It returns the metrics base URL once a cycle has completed.
func startDaemon(t *testing.T) string {
	t.Helper()
	return startDaemonOn(t, "metrics-test")
}

// startDaemonOn is startDaemon with node as its --node-name.
func startDaemonOn(t *testing.T, node string) string {
	t.Helper()
	dir := t.TempDir()
	bin := filepath.Join(dir, "remediate")
	build := exec.Command("go", "build", "-o", bin, "./cmd/remediate")
	build.Dir = filepath.Join(Dir(), "..")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	free := func() int {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer l.Close()
		return l.Addr().(*net.TCPAddr).Port
	}
	closed, port := free(), free()
	src, err := os.ReadFile(filepath.Join(Dir(), "..", "examples", "audit.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	pol := regexp.MustCompile(`http://127\.0\.0\.1:\d+`).ReplaceAllString(string(src), fmt.Sprintf("http://127.0.0.1:%d", closed))
	pol = regexp.MustCompile(`(?m)^interval: .*$`).ReplaceAllString(pol, "interval: 10s")
	if err := os.WriteFile(filepath.Join(dir, "policy.yaml"), []byte(pol), 0o644); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cmd := exec.CommandContext(ctx, bin, "--policy", filepath.Join(dir, "policy.yaml"), "--state-dir", filepath.Join(dir, "state"),
		"--node-name", node, "--dry-run", "--metrics-addr", fmt.Sprintf("127.0.0.1:%d", port), "--log-level", "warn")
	logf, err := os.Create(filepath.Join(dir, "log"))
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.Cancel = func() error { return cmd.Process.Signal(os.Interrupt) }
	cmd.WaitDelay = 10 * time.Second
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	t.Cleanup(func() {
		cancel()
		<-exited
		logf.Close()
		if t.Failed() {
			b, _ := os.ReadFile(logf.Name())
			t.Logf("daemon log:\n%s", b)
		}
	})
	base := fmt.Sprintf("http://127.0.0.1:%d", port)
	deadline := time.Now().Add(90 * time.Second)
	for time.Now().Before(deadline) {
		select {
		case err := <-exited:
			exited <- err
			t.Fatalf("the daemon exited: %v", err)
		default:
		}
		if fams, err := scrape(base); err == nil {
			if lc, ok := fams["remediate_last_cycle_timestamp_seconds"]; ok && lc.GetMetric()[0].GetGauge().GetValue() > 0 {
				return base
			}
		}
		time.Sleep(500 * time.Millisecond)
	}
	t.Fatal("the daemon completed no cycle within 90s")
	return ""
}

// daemonScrape is what TestMetricsExported and
// TestDashboardLabelsFromInstall read: one real daemon's /metrics after its
// first cycle, built, started and scraped once for both (they each built
// and ran their own). The daemon stops with the first test that asks.
var daemonScrape struct {
	sync.Mutex
	fams map[string]*dto.MetricFamily
}

// daemonMetrics returns daemonScrape, scraping it on the first call.
func daemonMetrics(t *testing.T) map[string]*dto.MetricFamily {
	t.Helper()
	daemonScrape.Lock()
	defer daemonScrape.Unlock()
	if daemonScrape.fams == nil {
		fams, err := scrape(startDaemon(t))
		if err != nil {
			t.Fatal(err)
		}
		daemonScrape.fams = fams
	}
	return daemonScrape.fams
}

func scrape(base string) (map[string]*dto.MetricFamily, error) {
	c := http.Client{Timeout: 5 * time.Second}
	resp, err := c.Get(base + "/metrics")
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	var p expfmt.TextParser
	return p.TextToMetricFamilies(resp.Body)
}

// TestMetricsExported: every metric the dashboard and the alerts name is
// exported by the real daemon (built from this tree, scraped on loopback).
// `up` is Prometheus' own.
func TestMetricsExported(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the daemon")
	}
	exprs := dashboardExprs(t)
	for _, g := range loadRules(t).Groups {
		for _, r := range g.Rules {
			exprs["alert "+r.Alert] = r.Expr
		}
	}
	fams := daemonMetrics(t)
	exported := map[string]bool{"up": true}
	for name, f := range fams {
		exported[name] = true
		if f.GetType().String() == "HISTOGRAM" {
			for _, s := range []string{"_bucket", "_sum", "_count"} {
				exported[name+s] = true
			}
		}
	}
	used := map[string]bool{}
	for where, e := range exprs {
		names := promQLMetrics(e)
		if len(names) == 0 {
			t.Errorf("%s: no metric in %q", where, e)
		}
		for _, n := range names {
			used[n] = true
			if !exported[n] {
				t.Errorf("%s uses %s, which the daemon does not export", where, n)
			}
		}
	}
	var names []string
	for n := range used {
		names = append(names, n)
	}
	sort.Strings(names)
	t.Logf("%d metrics used: %v", len(names), names)
}
