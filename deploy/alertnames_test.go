package deploy

import (
	"context"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"
)

// alertName is how the docs name an alert (Event reasons are
// Remediation*, never Remediate followed by a capital).
var alertName = regexp.MustCompile(`\bRemediate[A-Z][A-Za-z0-9]+\b`)

func alertSet(t *testing.T, rf RuleFile) []string {
	t.Helper()
	var out []string
	for _, g := range rf.Groups {
		for _, r := range g.Rules {
			if r.Alert != "" {
				out = append(out, r.Alert)
			}
		}
	}
	sort.Strings(out)
	return slices.Compact(out)
}

// TestAlertsNamedInDocsExist: every alert README.md, deploy/README.md or
// examples/RUNBOOK.md names exists in deploy/alerts and in the chart (its
// copy of the rule file and, with helm, the PrometheusRule it renders), and
// every alert there is named in the docs. A runbook promising an alert
// that is not shipped (or an alert nobody documents) fails here.
func TestAlertsNamedInDocsExist(t *testing.T) {
	alerts := alertSet(t, loadRules(t))
	if len(alerts) < 10 {
		t.Fatalf("%d alerts", len(alerts))
	}
	named := map[string][]string{}
	for _, doc := range []string{"README.md", "examples/RUNBOOK.md", "deploy/README.md"} {
		b, err := os.ReadFile(filepath.Join(Dir(), "..", doc))
		if err != nil {
			t.Fatal(err)
		}
		for _, n := range alertName.FindAllString(string(b), -1) {
			if !slices.Contains(named[n], doc) {
				named[n] = append(named[n], doc)
			}
		}
	}
	// The runbook's "why the defaults" section cites deploy/alerts for
	// thresholds that are alerts rather than findings: each such line must
	// name the alert, so that the check above holds it to an existing one
	// (it once promised an early-warning alert that was never shipped).
	rb, err := os.ReadFile(filepath.Join(Dir(), "..", "examples", "RUNBOOK.md"))
	if err != nil {
		t.Fatal(err)
	}
	_, why, ok := strings.Cut(string(rb), "\n## 7.")
	if !ok {
		t.Fatal("examples/RUNBOOK.md has no section 7")
	}
	for _, line := range strings.Split(why, "\n") {
		if strings.Contains(line, "`deploy/alerts`") && !alertName.MatchString(line) {
			t.Errorf("RUNBOOK section 7 cites deploy/alerts without naming an alert: %.160s", line)
		}
	}
	for n, docs := range named {
		if !slices.Contains(alerts, n) {
			t.Errorf("%v name alert %s, which deploy/alerts/remediate.rules.yaml does not have", docs, n)
		}
	}
	for _, a := range alerts {
		if named[a] == nil {
			t.Errorf("alert %s is named in none of README.md, examples/RUNBOOK.md, deploy/README.md", a)
		}
	}

	b, err := os.ReadFile(filepath.Join(ChartDir(), "files", "remediate.rules.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var chart RuleFile
	if err := yaml.UnmarshalStrict(b, &chart); err != nil {
		t.Fatal(err)
	}
	if got := alertSet(t, chart); !slices.Equal(got, alerts) {
		t.Errorf("chart files/remediate.rules.yaml alerts %v, deploy/alerts %v", got, alerts)
	}

	t.Run("chart-rendered", func(t *testing.T) {
		helm := needHelm(t)
		objs, err := RenderChart(context.Background(), helm, ChartNamespace, "--set", "prometheusRule.enabled=true")
		if err != nil {
			t.Fatal(err)
		}
		n := 0
		for _, o := range objs {
			if o.GetKind() != "PrometheusRule" {
				continue
			}
			n++
			js, err := yaml.Marshal(o.Object["spec"])
			if err != nil {
				t.Fatal(err)
			}
			var rf RuleFile
			if err := yaml.Unmarshal(js, &rf); err != nil {
				t.Fatal(err)
			}
			if got := alertSet(t, rf); !slices.Equal(got, alerts) {
				t.Errorf("rendered PrometheusRule alerts %v, deploy/alerts %v", got, alerts)
			}
		}
		if n != 1 {
			t.Errorf("%d PrometheusRules rendered", n)
		}
	})
}
