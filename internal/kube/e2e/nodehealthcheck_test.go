package e2e

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	testingclock "k8s.io/utils/clock/testing"
	"sigs.k8s.io/yaml"

	"github.com/remediate-dev/remediate/deploy"
	"github.com/remediate-dev/remediate/internal/finding"
	"github.com/remediate-dev/remediate/internal/testing/controlplane"
	"github.com/remediate-dev/remediate/remediate"
	"github.com/remediate-dev/remediate/remediate/exporters/kubeexporter"
)

// Defaults of kubeexporter's Hysteresis (kubeexporter.New): the condition
// turns False after a problem persisted problemAfter, True again after
// clearAfter without one.
const (
	problemAfter = time.Minute
	clearAfter   = 5 * time.Minute
)

func readYAML(t *testing.T, path string, into any) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.Unmarshal(b, into); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
}

// escalationWindow is, over the rules of the policy at path that act, the
// longest time from a finding's start until remediate has escalated it
// (every attempt made and verified: for + (maxAttempts-1) × max(cooldown,
// verifyAfter) + verifyAfter) and the condition would have cleared had the
// last attempt worked (+ clearAfter), counted from the condition's turn
// to False (problemAfter after the finding's start), which is when a
// NodeHealthCheck's duration starts.
func escalationWindow(t *testing.T, path string) (time.Duration, string) {
	t.Helper()
	var p struct {
		Rules []struct {
			Name        string         `json:"name"`
			For         string         `json:"for"`
			Cooldown    string         `json:"cooldown"`
			VerifyAfter string         `json:"verifyAfter"`
			MaxAttempts int            `json:"maxAttempts"`
			Action      map[string]any `json:"action"`
		} `json:"rules"`
	}
	readYAML(t, path, &p)
	dur := func(s string) time.Duration {
		if s == "" {
			return 0
		}
		d, err := time.ParseDuration(s)
		if err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		return d
	}
	var worst time.Duration
	var which string
	acting := 0
	for _, r := range p.Rules {
		if r.Action == nil {
			continue
		}
		acting++
		attempts := max(r.MaxAttempts, 1)
		w := dur(r.For) + time.Duration(attempts-1)*max(dur(r.Cooldown), dur(r.VerifyAfter)) + dur(r.VerifyAfter) + clearAfter - problemAfter
		if w > worst {
			worst, which = w, r.Name
		}
	}
	if acting < 5 {
		t.Fatalf("%s: only %d rules with an action: parsed wrong?", path, acting)
	}
	return worst, which
}

// The NodeHealthCheck example (deploy/integrations/nodehealthcheck.yaml)
// on a real kube-apiserver with the operator's CRD (pinned from
// medik8s/node-healthcheck-operator's source): it passes server-side
// validation (strict: no unknown field) while a malformed duration does
// not; its selector matches the worker test nodes and not the
// control-plane one; its unhealthy condition is the type and status the
// daemon's reporter writes on a node whose problem persists (written by
// kubeexporter.Reporter, not by hand); its duration is longer than
// remediate's slowest escalation in examples/enforce.yaml, so remediate's
// own actions come first.
func TestNodeHealthCheckExample(t *testing.T) {
	cp := controlplane.Start(t, controlplane.Options{})
	ctx := context.Background()
	dyn, err := dynamic.NewForConfig(cp.RestConfig)
	if err != nil {
		t.Fatal(err)
	}
	var crd unstructured.Unstructured
	readYAML(t, filepath.Join(deploy.Dir(), "integrations", "testdata", "remediation.medik8s.io_nodehealthchecks.yaml"), &crd.Object)
	crdGVR := schema.GroupVersionResource{Group: "apiextensions.k8s.io", Version: "v1", Resource: "customresourcedefinitions"}
	if _, err := dyn.Resource(crdGVR).Create(ctx, &crd, metav1.CreateOptions{}); err != nil {
		t.Fatalf("creating the NodeHealthCheck CRD: %v", err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for established := false; !established; {
		got, err := dyn.Resource(crdGVR).Get(ctx, crd.GetName(), metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		conds, _, _ := unstructured.NestedSlice(got.Object, "status", "conditions")
		for _, c := range conds {
			m, _ := c.(map[string]any)
			established = established || (m["type"] == "Established" && m["status"] == "True")
		}
		if time.Now().After(deadline) {
			t.Fatalf("CRD not established: %v", conds)
		}
		time.Sleep(100 * time.Millisecond)
	}

	var nhc unstructured.Unstructured
	readYAML(t, filepath.Join(deploy.Dir(), "integrations", "nodehealthcheck.yaml"), &nhc.Object)
	nhcGVR := schema.GroupVersionResource{Group: "remediation.medik8s.io", Version: "v1alpha1", Resource: "nodehealthchecks"}
	strict := metav1.CreateOptions{FieldValidation: metav1.FieldValidationStrict}
	// The schema is enforced: the same object with a malformed duration is
	// refused (retried while the new resource's storage comes up).
	bad := nhc.DeepCopy()
	bad.SetName("bad-duration")
	ucs, _, _ := unstructured.NestedSlice(bad.Object, "spec", "unhealthyConditions")
	ucs[0].(map[string]any)["duration"] = "90 minutes"
	_ = unstructured.SetNestedSlice(bad.Object, ucs, "spec", "unhealthyConditions")
	for {
		_, err = dyn.Resource(nhcGVR).Create(ctx, bad, strict)
		if err != nil && strings.Contains(err.Error(), "duration") {
			break
		}
		if err == nil {
			t.Fatal("a NodeHealthCheck with duration \"90 minutes\" was accepted: is the CRD's schema applied?")
		}
		if time.Now().After(deadline) {
			t.Fatalf("bad duration: %v", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	created, err := dyn.Resource(nhcGVR).Create(ctx, &nhc, strict)
	if err != nil {
		t.Fatalf("the example does not pass server-side validation: %v", err)
	}
	var spec struct {
		Selector            metav1.LabelSelector `json:"selector"`
		UnhealthyConditions []struct {
			Type     string          `json:"type"`
			Status   string          `json:"status"`
			Duration metav1.Duration `json:"duration"`
		} `json:"unhealthyConditions"`
	}
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(created.Object["spec"].(map[string]any), &spec); err != nil {
		t.Fatal(err)
	}

	// Selector: the workers, not the control plane.
	for name, lbl := range map[string]map[string]string{
		"nhc-worker-1": {"kubernetes.io/os": "linux"}, "nhc-worker-2": {"node-role.kubernetes.io/worker": ""},
		"nhc-cp": {"node-role.kubernetes.io/control-plane": ""}} {
		if _, err := cp.Client.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: lbl}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	sel, err := metav1.LabelSelectorAsSelector(&spec.Selector)
	if err != nil || sel.Empty() {
		t.Fatalf("selector %v: %v (an empty selector matches every node)", spec.Selector, err)
	}
	nodes, err := cp.Client.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var matched []string
	for _, n := range nodes.Items {
		if strings.HasPrefix(n.Name, "nhc-") && sel.Matches(labels.Set(n.Labels)) {
			matched = append(matched, n.Name)
		}
	}
	if strings.Join(matched, ",") != "nhc-worker-1,nhc-worker-2" {
		t.Errorf("the selector matches %v, want the two workers", matched)
	}

	// The condition: what the reporter writes on nhc-worker-1 after a
	// problem persisted past problemAfter.
	clk := testingclock.NewFakePassiveClock(time.Now().Add(-10 * time.Minute))
	r := kubeexporter.New(cp.Client, kubeexporter.Options{Node: "nhc-worker-1", Clock: clk})
	f := remediate.ReportFinding{Rule: "restart-stale-kube-proxy", Finding: finding.Finding{Detector: "KubeProxySyncStale", Target: "kube-proxy/ipv4", Severity: finding.Critical, Message: "no sync"}}
	for i := 0; i < 3; i++ {
		if err := r.Report(ctx, &remediate.Report{Findings: []remediate.ReportFinding{f}}); err != nil {
			t.Fatal(err)
		}
		clk.SetTime(clk.Now().Add(problemAfter))
	}
	n, err := cp.Client.CoreV1().Nodes().Get(ctx, "nhc-worker-1", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var written *corev1.NodeCondition
	for i, c := range n.Status.Conditions {
		if string(c.Type) == kubeexporter.DefaultConditionType {
			written = &n.Status.Conditions[i]
		}
	}
	if written == nil || written.Status != corev1.ConditionFalse {
		t.Fatalf("the reporter wrote %+v", written)
	}
	if len(spec.UnhealthyConditions) != 1 {
		t.Fatalf("unhealthyConditions %+v: want the one condition remediate writes", spec.UnhealthyConditions)
	}
	uc := spec.UnhealthyConditions[0]
	if uc.Type != string(written.Type) || uc.Status != string(written.Status) {
		t.Errorf("unhealthyConditions %s=%s, remediate writes %s=%s", uc.Type, uc.Status, written.Type, written.Status)
	}
	window, rule := escalationWindow(t, filepath.Join(deploy.Dir(), "..", "examples", "enforce.yaml"))
	if uc.Duration.Duration <= window {
		t.Errorf("duration %s: not longer than remediate's slowest escalation in examples/enforce.yaml (%s, rule %s)", uc.Duration.Duration, window, rule)
	} else {
		t.Logf("NodeHealthCheck duration %s > remediate's escalation window %s (rule %s)", uc.Duration.Duration, window, rule)
	}
}
