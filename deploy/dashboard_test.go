package deploy

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

// dashboardQuery is one query of the fleet dashboard: a panel's target or
// a template variable's label_values().
type dashboardQuery struct {
	where, expr, legend string
	// labelValues is the label a template variable lists (its expr is
	// then the metric).
	labelValues string
}

func dashboardQueries(t *testing.T) []dashboardQuery {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(Dir(), "dashboards", "remediate-fleet.json"))
	if err != nil {
		t.Fatal(err)
	}
	var d struct {
		Panels []struct {
			Title   string `json:"title"`
			Targets []struct {
				Expr         string `json:"expr"`
				LegendFormat string `json:"legendFormat"`
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
	var out []dashboardQuery
	for _, p := range d.Panels {
		for i, q := range p.Targets {
			out = append(out, dashboardQuery{where: fmt.Sprintf("panel %q #%d", p.Title, i), expr: q.Expr, legend: q.LegendFormat})
		}
	}
	lv := regexp.MustCompile(`^label_values\(([a-zA-Z_:][a-zA-Z0-9_:]*),\s*([a-zA-Z_][a-zA-Z0-9_]*)\)$`)
	for _, v := range d.Templating.List {
		if v.Definition == "" {
			continue
		}
		m := lv.FindStringSubmatch(v.Definition)
		if m == nil {
			t.Fatalf("variable %s: %q is not label_values(metric, label)", v.Name, v.Definition)
		}
		out = append(out, dashboardQuery{where: "variable " + v.Name, expr: m[1], labelValues: m[2]})
	}
	if len(out) < 10 {
		t.Fatalf("only %d dashboard queries", len(out))
	}
	return out
}

var (
	promSelector   = regexp.MustCompile(`([a-zA-Z_:][a-zA-Z0-9_:]*)\s*\{([^}]*)\}`)
	promMatcherKey = regexp.MustCompile(`([a-zA-Z_][a-zA-Z0-9_]*)\s*(?:=~|!~|!=|=)`)
	promClauseArgs = regexp.MustCompile(`\b(by|without|on|ignoring|group_left|group_right)\s*\(([^)]*)\)`)
	legendLabel    = regexp.MustCompile(`\{\{\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*\}\}`)
)

func splitLabels(s string) []string {
	var out []string
	for _, f := range strings.Split(s, ",") {
		if f = strings.TrimSpace(f); f != "" {
			out = append(out, f)
		}
	}
	return out
}

// queryLabelProblems returns what in a dashboard query names a label the
// series cannot have: a matcher on a metric for a label neither that
// metric exports nor the scrape adds (target), and a grouping (by, on,
// group_left) or legend label no metric of the query has. exposed maps
// each metric name (histograms' _bucket, _sum, _count included) to the
// labels the daemon exports on it.
func queryLabelProblems(q dashboardQuery, exposed map[string]map[string]bool, target []string) []string {
	has := func(metric, label string) bool {
		return slices.Contains(target, label) || exposed[metric][label] || (label == "le" && strings.HasSuffix(metric, "_bucket"))
	}
	var problems []string
	if q.labelValues != "" {
		if !has(q.expr, q.labelValues) {
			problems = append(problems, fmt.Sprintf("lists %s of %s, which has no such label", q.labelValues, q.expr))
		}
		return problems
	}
	e := promString.ReplaceAllString(q.expr, `""`)
	avail := map[string]bool{}
	for _, l := range target {
		avail[l] = true
	}
	for _, m := range promQLMetrics(q.expr) {
		for l := range exposed[m] {
			avail[l] = true
		}
		if strings.HasSuffix(m, "_bucket") {
			avail["le"] = true
		}
	}
	for _, sel := range promSelector.FindAllStringSubmatch(e, -1) {
		for _, k := range promMatcherKey.FindAllStringSubmatch(sel[2], -1) {
			if !has(sel[1], k[1]) {
				problems = append(problems, fmt.Sprintf("matches %s on %s, which has no such label", k[1], sel[1]))
			}
		}
	}
	for _, c := range promClauseArgs.FindAllStringSubmatch(e, -1) {
		for _, l := range splitLabels(c[2]) {
			if !avail[l] {
				problems = append(problems, fmt.Sprintf("%s (%s): no series of the query has %s", c[1], c[2], l))
			}
		}
	}
	for _, l := range legendLabel.FindAllStringSubmatch(q.legend, -1) {
		if !avail[l[1]] {
			problems = append(problems, fmt.Sprintf("legend {{%s}}: no series of the query has it", l[1]))
		}
	}
	return problems
}

func TestQueryLabelProblems(t *testing.T) {
	exposed := map[string]map[string]bool{
		"a":         {"rule": true},
		"info":      {"node": true},
		"h_bucket":  {},
		"b_total":   {"result": true},
		"no_labels": {},
	}
	target := []string{"job", "instance"}
	for _, c := range []struct {
		q    dashboardQuery
		want int
	}{
		{dashboardQuery{expr: `sum by (rule) (a{node=~"$node"})`}, 1},
		{dashboardQuery{expr: `sum by (rule) (a * on (job, instance) group_left (node) info{node=~"$node"})`, legend: "{{node}} {{rule}}"}, 0},
		{dashboardQuery{expr: `sum by (node) (a)`}, 1},
		{dashboardQuery{expr: `a`, legend: "{{node}}"}, 1},
		{dashboardQuery{expr: `histogram_quantile(0.9, sum by (le) (rate(h_bucket[5m])))`}, 0},
		{dashboardQuery{expr: `b_total{result="x", le="1"}`}, 1},
		{dashboardQuery{expr: `no_labels{instance=~".+"}`}, 0},
		{dashboardQuery{expr: "a", labelValues: "node"}, 1},
		{dashboardQuery{expr: "info", labelValues: "node"}, 0},
	} {
		if got := queryLabelProblems(c.q, exposed, target); len(got) != c.want {
			t.Errorf("%s (legend %q, label_values %q): %v, want %d problems", c.q.expr, c.q.legend, c.q.labelValues, got, c.want)
		}
	}
}

// scrapeTargetLabels returns the labels an install's scrape gives every
// series beyond what the daemon exports: Prometheus' job and instance,
// plus each PodMonitor or ServiceMonitor relabelling's targetLabel. It
// also returns the address /metrics listens on (the DaemonSet's
// --metrics-addr).
func scrapeTargetLabels(t *testing.T, objs []*unstructured.Unstructured) (labels []string, metricsAddr string) {
	t.Helper()
	labels = []string{"job", "instance"}
	for _, o := range objs {
		switch o.GetKind() {
		case "PodMonitor", "ServiceMonitor":
			key := "podMetricsEndpoints"
			if o.GetKind() == "ServiceMonitor" {
				key = "endpoints"
			}
			eps, _, _ := unstructured.NestedSlice(o.Object, "spec", key)
			for _, ep := range eps {
				rl, _, _ := unstructured.NestedSlice(ep.(map[string]any), "relabelings")
				for _, r := range rl {
					if l, ok := r.(map[string]any)["targetLabel"].(string); ok {
						labels = append(labels, l)
					}
				}
			}
		case "DaemonSet":
			cs, _, _ := unstructured.NestedSlice(o.Object, "spec", "template", "spec", "containers")
			for _, c := range cs {
				args, _, _ := unstructured.NestedStringSlice(c.(map[string]any), "args")
				for _, a := range args {
					if v, ok := strings.CutPrefix(a, "--metrics-addr="); ok {
						metricsAddr = v
					}
				}
			}
		}
	}
	return labels, metricsAddr
}

// exposedLabels maps each exported metric (histograms' series names too)
// to the label names the daemon puts on it.
func exposedLabels(fams map[string]*dto.MetricFamily) map[string]map[string]bool {
	out := map[string]map[string]bool{}
	for name, f := range fams {
		ls := map[string]bool{}
		for _, m := range f.GetMetric() {
			for _, lp := range m.GetLabel() {
				ls[lp.GetName()] = true
			}
		}
		out[name] = ls
		if f.GetType() == dto.MetricType_HISTOGRAM {
			for _, s := range []string{"_bucket", "_sum", "_count"} {
				out[name+s] = ls
			}
		}
	}
	return out
}

// TestDashboardLabelsFromInstall: every label a fleet dashboard query
// matches, groups by or shows in a legend is one the install's scrape can
// produce: what the real daemon (built from this tree) exports, plus what
// the chart's scrape adds. The default install (values as shipped) serves
// /metrics on loopback with no PodMonitor, so a scrape adds only job and
// instance; with the PodMonitor, node too. On main before
// remediate_node_info the dashboard matched node=~"$node" on every metric
// and failed for the default install.
func TestDashboardLabelsFromInstall(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the daemon")
	}
	helm := needHelm(t)
	fams := daemonMetrics(t)
	exposed := exposedLabels(fams)
	queries := dashboardQueries(t)
	for _, c := range []struct {
		name string
		args []string
		// wantNode: the scrape itself adds node.
		wantNode bool
	}{
		{"defaults", nil, false},
		{"podMonitor", []string{"--set", "metrics.bindAddress=", "--set", "metrics.podMonitor.enabled=true"}, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			objs, err := RenderChart(context.Background(), helm, "remediate", c.args...)
			if err != nil {
				t.Fatal(err)
			}
			target, addr := scrapeTargetLabels(t, objs)
			t.Logf("/metrics on %q; the scrape adds %v", addr, target)
			if c.name == "defaults" && !strings.HasPrefix(addr, "127.0.0.1:") {
				t.Errorf("the default install's /metrics is on %q, not loopback: this test's model of it is out of date", addr)
			}
			if got := slices.Contains(target, "node"); got != c.wantNode {
				t.Errorf("the scrape adds node: %v, want %v", got, c.wantNode)
			}
			for _, q := range queries {
				for _, p := range queryLabelProblems(q, exposed, target) {
					t.Errorf("dashboard %s %q: %s", q.where, q.expr, p)
				}
			}
		})
	}
	var info []string
	for _, m := range fams["remediate_node_info"].GetMetric() {
		for _, lp := range m.GetLabel() {
			info = append(info, lp.GetName()+"="+lp.GetValue())
		}
	}
	sort.Strings(info)
	if !slices.Equal(info, []string{"node=metrics-test"}) {
		t.Errorf("remediate_node_info labels %v, want [node=metrics-test] (the daemon's --node-name)", info)
	}
}

// promQuery runs an instant query on the Prometheus HTTP API and returns
// the result series' labels; err carries Prometheus' own error (a syntax
// error, many-to-many matching).
func promQuery(base, q string) ([]map[string]string, error) {
	c := http.Client{Timeout: 10 * time.Second}
	resp, err := c.Get(base + "/api/v1/query?query=" + url.QueryEscape(q))
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	var r struct {
		Status string `json:"status"`
		Error  string `json:"error"`
		Data   struct {
			ResultType string `json:"resultType"`
			Result     []struct {
				Metric map[string]string `json:"metric"`
			} `json:"result"`
		} `json:"data"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&r); err != nil {
		return nil, fmt.Errorf("%s: %w", resp.Status, err)
	}
	if r.Status != "success" {
		return nil, fmt.Errorf("%s: %s", resp.Status, r.Error)
	}
	var out []map[string]string
	for _, s := range r.Data.Result {
		out = append(out, s.Metric)
	}
	return out, nil
}

// TestDashboardWithRealPrometheus: the real Prometheus scrapes two real
// daemons (node names node-a and node-b) on loopback with a plain static
// scrape (job and instance only, as a node-local agent of the default
// install gives), and every dashboard query, $node set to node-a, is valid
// PromQL that Prometheus evaluates without error; every series it returns
// is node-a's and carries the labels its legend names; the node variable
// lists both nodes; the panels that always have data (cycle age, findings
// and skipped checks by rule) have it, the per-node ones for exactly
// node-a. Needs prometheus (Debian package prometheus).
func TestDashboardWithRealPrometheus(t *testing.T) {
	if testing.Short() {
		t.Skip("runs two daemons and Prometheus")
	}
	prom, err := exec.LookPath("prometheus")
	if err != nil {
		if os.Getenv("REMEDIATE_E2E_REQUIRED") != "" {
			t.Fatalf("REMEDIATE_E2E_REQUIRED is set but prometheus is missing (apt-get install prometheus): %v", err)
		}
		t.Skip("prometheus not found (apt-get install prometheus)")
	}
	a, b := startDaemonOn(t, "node-a"), startDaemonOn(t, "node-b")
	dir := t.TempDir()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	cfg := fmt.Sprintf("global:\n  scrape_interval: 2s\n  scrape_timeout: 2s\n  evaluation_interval: 2s\nscrape_configs:\n- job_name: remediate\n  static_configs:\n  - targets: [%q, %q]\n",
		strings.TrimPrefix(a, "http://"), strings.TrimPrefix(b, "http://"))
	if err := os.WriteFile(filepath.Join(dir, "prometheus.yml"), []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cmd := exec.CommandContext(ctx, prom, "--config.file="+filepath.Join(dir, "prometheus.yml"),
		"--storage.tsdb.path="+filepath.Join(dir, "data"), "--web.listen-address="+addr, "--log.level=warn")
	logf, err := os.Create(filepath.Join(dir, "prometheus.log"))
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.Cancel = func() error { return cmd.Process.Signal(os.Interrupt) }
	cmd.WaitDelay = 10 * time.Second
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cancel()
		_ = cmd.Wait()
		logf.Close()
		if t.Failed() {
			b, _ := os.ReadFile(logf.Name())
			t.Logf("prometheus log:\n%s", b)
		}
	})
	base := "http://" + addr
	// Rates need two samples of each target inside the window.
	ready := func() bool {
		s, err := promQuery(base, `sum_over_time(up{job="remediate"}[1m]) >= 3`)
		return err == nil && len(s) == 2
	}
	deadline := time.Now().Add(3 * time.Minute)
	for !ready() {
		if time.Now().After(deadline) {
			t.Fatal("Prometheus has not scraped both daemons three times within 3 minutes")
		}
		time.Sleep(time.Second)
	}
	vars := strings.NewReplacer(`$node`, "node-a", `$__rate_interval`, "1m")
	// Panels with data whatever the daemons find: every rule's series is
	// exported at 0 (a finding's presence is not: a rule skipped in a cycle
	// reports none).
	mustHave := map[string]bool{
		`panel "Seconds since last cycle, per node" #0`: true,
		`panel "Findings by rule" #0`:                   true,
		`panel "Skipped detectors" #0`:                  true,
	}
	for _, q := range dashboardQueries(t) {
		if q.labelValues != "" {
			s, err := promQuery(base, fmt.Sprintf("count by (%s) (%s)", q.labelValues, q.expr))
			if err != nil {
				t.Errorf("variable %s: %v", q.where, err)
				continue
			}
			var got []string
			for _, m := range s {
				got = append(got, m[q.labelValues])
			}
			sort.Strings(got)
			if !slices.Equal(got, []string{"node-a", "node-b"}) {
				t.Errorf("dashboard %s lists %v, want [node-a node-b]", q.where, got)
			}
			continue
		}
		expr := vars.Replace(q.expr)
		s, err := promQuery(base, expr)
		// A panel that always has data may still come back empty for a
		// moment: a scrape that failed on this loaded machine marks the
		// target's series stale until the next one. Asked again until the
		// next good scrape, within a minute.
		for again := time.Now().Add(time.Minute); err == nil && len(s) == 0 && mustHave[q.where] && time.Now().Before(again); {
			time.Sleep(time.Second)
			s, err = promQuery(base, expr)
		}
		if err != nil {
			t.Errorf("dashboard %s %q: %v", q.where, expr, err)
			continue
		}
		if mustHave[q.where] && len(s) == 0 {
			up, _ := promQuery(base, `up`)
			t.Errorf("dashboard %s %q: no series (up: %v)", q.where, expr, up)
		}
		for _, m := range s {
			// The cycle age is per node: it must carry node-a's name.
			if n, ok := m["node"]; (ok || q.where == `panel "Seconds since last cycle, per node" #0`) && n != "node-a" {
				t.Errorf("dashboard %s %q: series %v, want node=node-a", q.where, expr, m)
			}
			for _, l := range legendLabel.FindAllStringSubmatch(q.legend, -1) {
				if _, ok := m[l[1]]; !ok {
					t.Errorf("dashboard %s %q: series %v lacks %s (legend %q)", q.where, expr, m, l[1], q.legend)
				}
			}
		}
		t.Logf("%s: %d series", q.where, len(s))
	}
}
