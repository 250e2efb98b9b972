package deploy

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"sigs.k8s.io/yaml"
)

// RuleFile is a Prometheus rule file (the parts the tests read).
type RuleFile struct {
	Groups []struct {
		Name  string `json:"name"`
		Rules []struct {
			Alert       string            `json:"alert"`
			Record      string            `json:"record"`
			Expr        string            `json:"expr"`
			For         string            `json:"for"`
			Labels      map[string]string `json:"labels"`
			Annotations map[string]string `json:"annotations"`
		} `json:"rules"`
	} `json:"groups"`
}

func alertsPath() string { return filepath.Join(Dir(), "alerts", "remediate.rules.yaml") }

func loadRules(t *testing.T) RuleFile {
	t.Helper()
	b, err := os.ReadFile(alertsPath())
	if err != nil {
		t.Fatal(err)
	}
	var rf RuleFile
	if err := yaml.UnmarshalStrict(b, &rf); err != nil {
		t.Fatal(err)
	}
	return rf
}

// TestAlertsPromtool runs `promtool check rules` and the alert unit tests
// (deploy/alerts/remediate.rules_test.yaml). promtool comes from Debian's
// prometheus package (.ci/run installs it).
func TestAlertsPromtool(t *testing.T) {
	pt, err := exec.LookPath("promtool")
	if err != nil {
		if os.Getenv("REMEDIATE_E2E_REQUIRED") != "" {
			t.Fatalf("REMEDIATE_E2E_REQUIRED is set but promtool is missing (apt-get install prometheus): %v", err)
		}
		t.Skip("promtool not found (apt-get install prometheus)")
	}
	for _, args := range [][]string{{"check", "rules", "remediate.rules.yaml"}, {"test", "rules", "remediate.rules_test.yaml"}} {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		cmd := exec.CommandContext(ctx, pt, args...)
		cmd.Dir = filepath.Join(Dir(), "alerts")
		out, err := cmd.CombinedOutput()
		cancel()
		if err != nil {
			t.Errorf("promtool %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
}

// TestAlertsRunbook: every alert has a severity, a summary and a
// runbook_url whose anchor exists in examples/RUNBOOK.md, and is unit
// tested.
func TestAlertsRunbook(t *testing.T) {
	rf := loadRules(t)
	rb, err := os.ReadFile(filepath.Join(Dir(), "..", "examples", "RUNBOOK.md"))
	if err != nil {
		t.Fatal(err)
	}
	tests, err := os.ReadFile(filepath.Join(Dir(), "alerts", "remediate.rules_test.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	const base = "https://github.com/remediate-dev/remediate/blob/main/examples/RUNBOOK.md#"
	n := 0
	for _, g := range rf.Groups {
		for _, r := range g.Rules {
			if r.Alert == "" {
				continue
			}
			n++
			if s := r.Labels["severity"]; s != "critical" && s != "warning" && s != "info" {
				t.Errorf("%s: severity %q", r.Alert, s)
			}
			if r.Annotations["summary"] == "" || r.Annotations["description"] == "" {
				t.Errorf("%s: summary and description required", r.Alert)
			}
			u := r.Annotations["runbook_url"]
			want := base + "alert-" + strings.ToLower(r.Alert)
			if u != want {
				t.Errorf("%s: runbook_url %q, want %q", r.Alert, u, want)
			}
			if !strings.Contains(string(rb), `<a id="alert-`+strings.ToLower(r.Alert)+`"></a>`) {
				t.Errorf("%s: no anchor alert-%s in examples/RUNBOOK.md", r.Alert, strings.ToLower(r.Alert))
			}
			if !regexp.MustCompile(`alertname: ` + r.Alert + `\n`).Match(tests) {
				t.Errorf("%s: no promtool unit test", r.Alert)
			}
		}
	}
	if n < 10 {
		t.Errorf("%d alerts", n)
	}
}

// The chart ships the rule file verbatim (helm reads only files inside
// the chart).
func TestChartAlertsMatch(t *testing.T) {
	want, err := os.ReadFile(alertsPath())
	if err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile(filepath.Join(ChartDir(), "files", "remediate.rules.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if string(got) != string(want) {
		t.Error("deploy/helm/remediate/files/remediate.rules.yaml differs from deploy/alerts/remediate.rules.yaml: copy it")
	}
}
