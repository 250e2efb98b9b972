package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	coordv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"

	"github.com/remediate-dev/remediate/deploy"
	"github.com/remediate-dev/remediate/internal/testing/controlplane"
	"github.com/remediate-dev/remediate/internal/testing/deploytest"
	"github.com/remediate-dev/remediate/remediate/guardrails"
)

// TestInstalledInKubeSystem (issue 27, item 11): remediate installed into
// kube-system, by a kustomize overlay with `namespace: kube-system` over
// the enforce overlay and by the Helm chart (`helm template -n
// kube-system`, release "ks" so that both installs live side by side),
// gets its Lease Role in kube-system, where the controller-manager's and
// scheduler's leader Leases live. With a real pod-bound token of each
// install's ServiceAccount on n1, the admission policy refuses every write
// to a Lease that is not remediate's own (those two, any other name,
// another node's status Lease), while the budget slot and the node-status
// Lease, written by the guardrails' own code, still work.
func TestInstalledInKubeSystem(t *testing.T) {
	cp := controlplane.Start(t, controlplane.Options{})
	ctx := context.Background()
	for _, n := range []string{"n1", "n2"} {
		mkNode(t, cp.Client, n)
	}
	for _, name := range []string{"kube-controller-manager", "kube-scheduler"} {
		now := metav1.NewMicroTime(time.Now())
		l := &coordv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "kube-system"},
			Spec: coordv1.LeaseSpec{HolderIdentity: ptr.To("cp-1_" + name), LeaseDurationSeconds: ptr.To[int32](15), AcquireTime: &now, RenewTime: &now}}
		if _, err := cp.Client.CoordinationV1().Leases("kube-system").Create(ctx, l, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}

	// Kustomize: the user's overlay moves everything into kube-system.
	dir := t.TempDir()
	rel, err := filepath.Rel(dir, filepath.Join(deploy.Dir(), "overlays", "enforce"))
	if err != nil {
		t.Fatal(err)
	}
	k := "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nnamespace: kube-system\nresources:\n- " + rel + "\n"
	if err := os.WriteFile(filepath.Join(dir, "kustomization.yaml"), []byte(k), 0o644); err != nil {
		t.Fatal(err)
	}
	m, err := deploy.RenderDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	kobjs, err := deploy.KustomizeObjects(m)
	if err != nil {
		t.Fatal(err)
	}
	var kept []*unstructured.Unstructured
	for _, o := range kobjs {
		if o.GetKind() != "Namespace" { // kube-system exists
			kept = append(kept, o)
		}
	}
	deploytest.ApplyObjects(t, cp, "enforce in kube-system", kept, false)
	t.Run("kustomize", func(t *testing.T) { testLeasesInKubeSystem(t, cp, "remediate") })

	t.Run("helm", func(t *testing.T) {
		helm, err := deploy.HelmBin()
		if err != nil {
			if os.Getenv("REMEDIATE_E2E_REQUIRED") != "" {
				t.Fatalf("REMEDIATE_E2E_REQUIRED is set but: %v", err)
			}
			t.Skip(err)
		}
		out, err := deploy.Helm(ctx, helm, "template", "ks", deploy.ChartDir(), "--namespace", "kube-system", "--set", "enforce=true")
		if err != nil {
			t.Fatal(err)
		}
		objs, err := deploy.DecodeObjects(out)
		if err != nil {
			t.Fatal(err)
		}
		var installed []*unstructured.Unstructured
		for _, o := range objs {
			if !deploy.IsHook(o) {
				installed = append(installed, o)
			}
		}
		deploytest.ApplyObjects(t, cp, "chart in kube-system", installed, false)
		testLeasesInKubeSystem(t, cp, "ks-remediate")
	})
}

// testLeasesInKubeSystem checks, as ServiceAccount kube-system/sa on n1
// with a pod-bound token, that RBAC lets it write Leases in kube-system
// (the namespace is no longer the boundary) and that the admission policy
// refuses all but its own.
func testLeasesInKubeSystem(t *testing.T, cp *controlplane.ControlPlane, sa string) {
	ctx := context.Background()
	cs := kubernetes.NewForConfigOrDie(deploytest.AsBoundPod(t, cp, "kube-system", sa, "n1"))
	leases := cs.CoordinationV1().Leases("kube-system")
	const msg = "remediate may write only its own Leases"
	// The policy and its binding take a moment to be enforced after
	// creation; RBAC must already allow the write (or the refusal below
	// would prove nothing about the policy).
	takeOver := func(name string) error {
		l, err := leases.Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return fmt.Errorf("get: %w", err)
		}
		l.Spec.HolderIdentity = ptr.To("remediate-n1")
		_, err = leases.Update(ctx, l, metav1.UpdateOptions{DryRun: []string{metav1.DryRunAll}})
		return err
	}
	waitFor(t, 30*time.Second, "admission policy refusing the controller-manager's Lease", func() (bool, string) {
		err := takeOver("kube-controller-manager")
		return err != nil && strings.Contains(err.Error(), msg), fmt.Sprint(err)
	})
	if err := takeOver("kube-scheduler"); err == nil || !strings.Contains(err.Error(), msg) {
		t.Errorf("update of kube-scheduler's Lease: %v, want refused with %q", err, msg)
	}
	for _, name := range []string{"kube-controller-manager-2", "remediate", guardrails.StatusLeaseName("n2")} {
		_, err := leases.Create(ctx, &coordv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		if err == nil || !strings.Contains(err.Error(), msg) {
			t.Errorf("create of Lease %s: %v, want refused with %q", name, err, msg)
		}
	}
	l, err := cp.Client.CoordinationV1().Leases("kube-system").Get(ctx, "kube-controller-manager", metav1.GetOptions{})
	if err != nil || *l.Spec.HolderIdentity != "cp-1_kube-controller-manager" {
		t.Errorf("kube-controller-manager's Lease after the attempts: %v %v", l.Spec.HolderIdentity, err)
	}

	// remediate's own Leases, through the guardrails' code.
	b := guardrails.NewBudget(cs, guardrails.BudgetOptions{Namespace: "kube-system", Slots: 1, TTL: time.Minute, Node: "n1", Prefix: "remediate-budget-" + sa})
	r := req("restart", "kube-proxy/n1", "RestartKubeProxy", true, false)
	if err := b.Check(ctx, r); err != nil {
		t.Fatalf("budget slot in kube-system: %v", err)
	}
	b.Release(ctx, r)
	storm := guardrails.NewStorm(cs, guardrails.StormOptions{Namespace: "kube-system", Node: "n1"})
	if err := storm.Publish(ctx, []string{"rule-a"}); err != nil {
		t.Fatalf("node-status Lease in kube-system: %v", err)
	}
	if err := guardrails.NewStorm(cs, guardrails.StormOptions{Namespace: "kube-system", Node: "n1"}).Publish(ctx, []string{"rule-b"}); err != nil {
		t.Fatalf("node-status Lease update in kube-system: %v", err)
	}
	_ = cp.Client.CoordinationV1().Leases("kube-system").Delete(ctx, guardrails.StatusLeaseName("n1"), metav1.DeleteOptions{})
}
