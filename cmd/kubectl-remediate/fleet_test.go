package main

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/spf13/cobra"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	testingclock "k8s.io/utils/clock/testing"

	"github.com/remediate-dev/remediate/internal/finding"
	"github.com/remediate-dev/remediate/internal/kube"
	"github.com/remediate-dev/remediate/internal/testing/controlplane"
	"github.com/remediate-dev/remediate/policy"
	"github.com/remediate-dev/remediate/remediate"
	"github.com/remediate-dev/remediate/remediate/exporters/fleetview"
	"github.com/remediate-dev/remediate/remediate/exporters/kubeexporter"
	"github.com/remediate-dev/remediate/remediate/guardrails"
)

// countingConfig returns cp's config with a transport counting the
// requests per "METHOD path?query".
type requestLog struct {
	mu   sync.Mutex
	reqs []string
}

func (l *requestLog) count(prefix string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for _, r := range l.reqs {
		if strings.HasPrefix(r, prefix) {
			n++
		}
	}
	return n
}

type logRT struct {
	next http.RoundTripper
	l    *requestLog
}

func (t *logRT) RoundTrip(r *http.Request) (*http.Response, error) {
	t.l.mu.Lock()
	t.l.reqs = append(t.l.reqs, r.Method+" "+r.URL.Path+"?"+r.URL.RawQuery)
	t.l.mu.Unlock()
	return t.next.RoundTrip(r)
}

// The fleet view against a real kube-apiserver, over what the daemon's own
// code writes there (kubeexporter.Reporter: the condition and Events;
// guardrails.Storm: the node-status Lease; guardrails.Budget: a slot), not
// over hand-written objects: a healthy node, a node whose condition turned
// False after a finding persisted and that acted (executed, then failed),
// a node whose daemon stopped writing 20 minutes ago (its True condition
// shows as Unknown, stale), a node remediate never ran on, the budget slot
// the sick node holds, and the fleet pause. Nodes and Events are read in
// pages of 2.
func TestFleetAgainstAPIServer(t *testing.T) {
	cp := controlplane.Start(t, controlplane.Options{})
	ctx := context.Background()
	const ns = "remediate"
	if _, err := cp.Client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	for _, n := range []string{"fv-healthy", "fv-sick", "fv-stale", "fv-none", "fv-other"} {
		if _, err := cp.Client.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: n,
			Labels: map[string]string{"fleet-test": map[bool]string{true: "other", false: "main"}[n == "fv-other"]}}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	now := time.Now()
	report := func(node string, clk *testingclock.FakePassiveClock, rep *remediate.Report) {
		t.Helper()
		r := kubeexporter.New(cp.Client, kubeexporter.Options{Node: node, Clock: clk})
		if err := r.Report(ctx, rep); err != nil {
			t.Fatalf("report %s: %v", node, err)
		}
	}
	// Healthy: one clean cycle a minute ago.
	report("fv-healthy", testingclock.NewFakePassiveClock(now.Add(-time.Minute)), &remediate.Report{})
	// Sick: the finding persists 2 minutes (ProblemAfter 1m), the action
	// executes, then fails.
	sickFinding := remediate.ReportFinding{Rule: "restart-stale-kube-proxy", Finding: finding.Finding{Detector: "KubeProxySyncStale",
		Target: "kube-proxy/ipv4", Severity: finding.Critical, Message: "no sync for 10m"}}
	{
		clk := testingclock.NewFakePassiveClock(now.Add(-6 * time.Minute))
		r := kubeexporter.New(cp.Client, kubeexporter.Options{Node: "fv-sick", Clock: clk})
		for i, d := range []remediate.Decision{
			{},
			{Rule: sickFinding.Rule, Action: "RestartKubeProxy", Target: sickFinding.Target, Outcome: remediate.OutcomeExecuted, Reason: "restarted"},
			{Rule: sickFinding.Rule, Action: "RestartKubeProxy", Target: sickFinding.Target, Outcome: remediate.OutcomeFailed, Reason: "still stale after verify"},
		} {
			rep := &remediate.Report{Findings: []remediate.ReportFinding{sickFinding}}
			if d.Rule != "" {
				rep.Decisions = []remediate.Decision{d}
			}
			if err := r.Report(ctx, rep); err != nil {
				t.Fatalf("cycle %d: %v", i, err)
			}
			clk.SetTime(clk.Now().Add(90 * time.Second))
		}
	}
	storm := guardrails.NewStorm(cp.Client, guardrails.StormOptions{Namespace: ns, Node: "fv-sick"})
	if err := storm.Publish(ctx, []string{sickFinding.Rule}); err != nil {
		t.Fatal(err)
	}
	budget := guardrails.NewBudget(cp.Client, guardrails.BudgetOptions{Namespace: ns, Slots: 2, Node: "fv-sick"})
	if err := budget.Check(ctx, &guardrails.Request{Rule: &policy.Rule{Name: sickFinding.Rule}, ActionType: "RestartKubeProxy",
		Disruptive: true, Finding: sickFinding.Finding, Now: now}); err != nil {
		t.Fatal(err)
	}
	// Stale: healthy 20 minutes ago, then the daemon went away.
	report("fv-stale", testingclock.NewFakePassiveClock(now.Add(-20*time.Minute)), &remediate.Report{})
	report("fv-other", testingclock.NewFakePassiveClock(now), &remediate.Report{})
	if _, err := cp.Client.CoreV1().ConfigMaps(ns).Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: kube.FleetConfigMap},
		Data: map[string]string{kube.PauseKey: "upgrading to 1.35"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	log := &requestLog{}
	d := deps{restConfig: func(string, string) (*rest.Config, error) {
		cfg := rest.CopyConfig(cp.RestConfig)
		cfg.WrapTransport = func(rt http.RoundTripper) http.RoundTripper { return &logRT{next: rt, l: log} }
		return cfg, nil
	}}
	var out, errb bytes.Buffer
	if code := run(ctx, []string{"fleet", "-o", "json", "--page-size", "2", "-l", "fleet-test=main"}, &out, &errb, d); code != 0 {
		t.Fatalf("exit %d: %s", code, errb.String())
	}
	var f fleetview.Fleet
	if err := json.Unmarshal(out.Bytes(), &f); err != nil {
		t.Fatalf("%v\n%s", err, out.String())
	}
	if len(f.Warnings) > 0 {
		t.Errorf("warnings: %v", f.Warnings)
	}
	if f.SchemaVersion != 1 || !f.Pause.Paused || f.Pause.Reason != "upgrading to 1.35" {
		t.Errorf("header: %+v", f)
	}
	rows := map[string]fleetview.Node{}
	var names []string
	for _, n := range f.Nodes {
		rows[n.Name] = n
		names = append(names, n.Name)
	}
	if strings.Join(names, ",") != "fv-healthy,fv-none,fv-sick,fv-stale" {
		t.Fatalf("nodes (-l fleet-test=main) %v", names)
	}
	if r := rows["fv-healthy"]; r.Status != "True" || r.Stale || r.LastAction != nil || r.TopFinding != "" || r.Heartbeat == nil {
		t.Errorf("healthy: %+v", r)
	}
	if r := rows["fv-none"]; r.Status != fleetview.StatusNone || r.Heartbeat != nil {
		t.Errorf("none: %+v", r)
	}
	if r := rows["fv-stale"]; r.Status != "Unknown" || !r.Stale || r.Reported != "True" {
		t.Errorf("stale: %+v", r)
	}
	r := rows["fv-sick"]
	if r.Status != "False" || r.Reason != "KubeProxySyncStale" || !strings.HasPrefix(r.TopFinding, "restart-stale-kube-proxy: kube-proxy/ipv4: no sync") {
		t.Errorf("sick condition: %+v", r)
	}
	if a := r.LastAction; a == nil || a.Outcome != "failed" || a.Action != "RestartKubeProxy" || a.Reason != kubeexporter.ReasonFailed {
		t.Errorf("sick last action: %+v", a)
	}
	if strings.Join(r.Firing, ",") != sickFinding.Rule || r.DaemonRenewed == nil {
		t.Errorf("sick node-status lease: %+v", r)
	}
	if len(r.BudgetSlots) != 1 || len(f.Budget) != 1 || f.Budget[0].Holder != "fv-sick" || f.Budget[0].Rule != sickFinding.Rule {
		t.Errorf("budget: row %v, slots %+v", r.BudgetSlots, f.Budget)
	}
	// Paginated: the 4 Nodes of -l in pages of 2 is 2 LISTs, each with
	// limit=2, the second with the first's continue token.
	if n := log.count("GET /api/v1/nodes?"); n != 2 || log.count("GET /api/v1/nodes?continue=") != 1 {
		t.Errorf("%d node LISTs, want 2 pages: %v", n, log.reqs)
	}
	for _, q := range log.reqs {
		if strings.Contains(q, "/nodes?") || strings.Contains(q, "/events?") {
			if !strings.Contains(q, "limit=2") {
				t.Errorf("unpaginated LIST: %s", q)
			}
		}
	}
	if n := log.count("GET /apis/events.k8s.io/v1/namespaces/kube-system/events?"); n < 2 {
		t.Errorf("%d event LISTs, want at least 2 pages (the sick node's 3 events and the condition events, 2 a page)", n)
	}

	// Text, worst first.
	out.Reset()
	if code := run(ctx, []string{"fleet", "--sort-by", "status"}, &out, &errb, d); code != 0 {
		t.Fatalf("exit %d: %s", code, errb.String())
	}
	txt := out.String()
	t.Logf("kubectl remediate fleet --sort-by status:\n%s", txt)
	for _, want := range []string{"FLEET PAUSED: upgrading to 1.35", "Budget slot remediate-budget-", "held by fv-sick for RestartKubeProxy on kube-proxy/ipv4",
		"Unknown(stale,was True)", "RestartKubeProxy failed"} {
		if !strings.Contains(txt, want) {
			t.Errorf("text lacks %q:\n%s", want, txt)
		}
	}
	order := []string{}
	for _, line := range strings.Split(txt, "\n") {
		if strings.HasPrefix(line, "fv-") {
			order = append(order, strings.Fields(line)[0])
		}
	}
	if strings.Join(order, ",") != "fv-sick,fv-stale,fv-none,fv-healthy,fv-other" {
		t.Errorf("--sort-by status: %v\n%s", order, txt)
	}
	if code := run(ctx, []string{"fleet", "--sort-by", "color"}, &out, &errb, d); code != 1 {
		t.Errorf("bad --sort-by: exit %d", code)
	}
}

// The README's command-line block names every plugin subcommand.
func TestREADMEListsPluginCommands(t *testing.T) {
	b, err := os.ReadFile(filepath.Join("..", "..", "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	root := &cobra.Command{Use: "x"}
	root.AddCommand(fleetCmd(nil, deps{}), onceCmd(nil, nil, deps{}))
	for _, c := range root.Commands() {
		if !strings.Contains(string(b), "kubectl remediate "+c.Name()+" ") {
			t.Errorf("README does not list `kubectl remediate %s`", c.Name())
		}
	}
}
