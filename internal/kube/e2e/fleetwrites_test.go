package e2e

import (
	"context"
	"testing"
	"time"

	"go.uber.org/zap/zaptest"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/remediate-dev/remediate/internal/finding"
	"github.com/remediate-dev/remediate/internal/testing/clusterload"
	"github.com/remediate-dev/remediate/internal/testing/controlplane"
	"github.com/remediate-dev/remediate/internal/testing/deploytest"
	"github.com/remediate-dev/remediate/remediate"
	"github.com/remediate-dev/remediate/remediate/exporters/kubeexporter"
	"github.com/remediate-dev/remediate/remediate/guardrails"
)

// TestReporterWritesPerNode: what one sick node's daemon writes to the
// apiserver while a finding lasts (bench-fleet's per-node writes). On a
// real kube-apiserver with an audit log, the Reporter and storm guard as
// the daemon's ServiceAccount on n1 (audit overlay RBAC) publish 21 cycles
// of 30 s (a fake clock: 10 minutes) of one finding with its dry-run
// decision. The audit log counts n1's requests: the dry-run Event created
// once and its series PATCHed twice (every 5 minutes; 20 times on main,
// every cycle), the node-status Lease read once (6 GETs on main, one per
// renewal) and updated every 100 s (5 times; created at the first), the
// Node condition patched twice (False, then its heartbeat); the Event's
// count on the server is the true one after Flush. Then another writer changes the Lease: the
// next renewal's UPDATE conflicts, and the guard reads it and writes once
// more, its firing rules intact.
func TestReporterWritesPerNode(t *testing.T) {
	args, auditLog := clusterload.AuditArgs(t)
	cp := controlplane.Start(t, controlplane.Options{ExtraAPIServerArgs: args})
	ctx := context.Background()
	mkNode(t, cp.Client, "n1")
	deploytest.ApplyOverlay(t, cp, "audit", false)
	c := daemonClient(t, cp, "n1")
	clk := clocktesting.NewFakeClock(time.Now())
	storm := guardrails.NewStorm(c.Interface, guardrails.StormOptions{Namespace: deploytest.Namespace, Node: "n1", Clock: clk})
	r := kubeexporter.New(c.Interface, kubeexporter.Options{Node: "n1", Firing: storm.Publish, Clock: clk, Log: zaptest.NewLogger(t)})
	sick := &remediate.Report{
		Findings: []remediate.ReportFinding{{Rule: "stale", Finding: finding.Finding{Detector: "KubeProxySyncStale",
			Target: "kube-proxy/IPv4", Severity: finding.Critical, Message: "last sync 95s ago"}}},
		Decisions: []remediate.Decision{{Rule: "stale", Action: "RestartKubeProxy", Target: "kube-proxy/IPv4",
			Outcome: remediate.OutcomeDryRun, Reason: "audit mode: would delete pod kube-system/kube-proxy-x"}},
	}
	tally := clusterload.NewAuditTally(nil)
	n1 := clusterload.Who{Node: "n1", Role: "daemon"}
	count := func() map[clusterload.Key]int {
		time.Sleep(time.Second) // the audit log's last lines
		if err := tally.ReadFile(auditLog); err != nil {
			t.Fatal(err)
		}
		return tally.Snapshot()[n1]
	}
	for i := 0; i <= 20; i++ {
		if err := r.Report(ctx, sick); err != nil {
			t.Fatalf("cycle %d: %v", i, err)
		}
		clk.Step(30 * time.Second)
	}
	got := count()
	t.Logf("n1's requests in 21 cycles: %s", clusterload.FormatKeys(got, 1))
	want := map[clusterload.Key]int{
		{Verb: "patch", Resource: "events"}:          2,
		{Verb: "get", Resource: "leases", Code: 404}: 1, // the first: not there yet
		{Verb: "create", Resource: "leases"}:         1,
		{Verb: "update", Resource: "leases"}:         5,
		{Verb: "patch", Resource: "nodes/status"}:    2, // False at 1m, the heartbeat at 6m
	}
	for k, n := range want {
		if got[k] != n {
			t.Errorf("%s %s: %d in 21 cycles of 30 s, want %d", k.Verb, k.Resource, got[k], n)
		}
	}
	if err := r.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	evs, err := cp.Client.EventsV1().Events("kube-system").List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	dry := 0
	for _, e := range evs.Items {
		if e.Reason == kubeexporter.ReasonDryRun && e.Regarding.Name == "n1" {
			dry++
			if e.Series == nil || e.Series.Count != 21 || !e.Series.LastObservedTime.Time.Equal(clk.Now().Add(-30*time.Second).Truncate(time.Microsecond)) {
				t.Errorf("dry-run event series %+v, want 21 occurrences, the last at %v", e.Series, clk.Now().Add(-30*time.Second))
			}
		}
	}
	if dry != 1 {
		t.Fatalf("%d dry-run events, want 1", dry)
	}

	// Another writer changes the Lease (resourceVersion moves on): the
	// guard's UPDATE of the Lease it kept conflicts; it reads it and
	// writes once more.
	name := guardrails.StatusLeaseName("n1")
	l, err := cp.Client.CoordinationV1().Leases(deploytest.Namespace).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	l.Labels["touched-by"] = "test"
	if _, err := cp.Client.CoordinationV1().Leases(deploytest.Namespace).Update(ctx, l, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	before := count()
	if err := storm.Publish(ctx, []string{"other", "stale"}); err != nil {
		t.Fatalf("publish after a conflict: %v", err)
	}
	after := count()
	if d := clusterload.Delta(map[clusterload.Who]map[clusterload.Key]int{n1: before}, map[clusterload.Who]map[clusterload.Key]int{n1: after})[n1]; d[clusterload.Key{Verb: "update", Resource: "leases", Code: 409}] != 1 ||
		d[clusterload.Key{Verb: "get", Resource: "leases"}] != 1 || d[clusterload.Key{Verb: "update", Resource: "leases"}] != 1 {
		t.Errorf("publish after another writer: %s, want a 409 update, a get and an update", clusterload.FormatKeys(d, 1))
	}
	l, err = cp.Client.CoordinationV1().Leases(deploytest.Namespace).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if l.Annotations[guardrails.AnnotationFiring] != `["other","stale"]` || l.Labels["touched-by"] != "test" || !l.Spec.RenewTime.Time.Equal(clk.Now().Truncate(time.Microsecond)) {
		t.Errorf("lease after the conflict: %+v", l)
	}
}
