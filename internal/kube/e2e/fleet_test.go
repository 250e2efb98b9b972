package e2e

import (
	"context"
	"errors"
	"os"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"

	"github.com/remediate-dev/remediate/deploy"
	"github.com/remediate-dev/remediate/internal/kube"
	"github.com/remediate-dev/remediate/internal/testing/controlplane"
	"github.com/remediate-dev/remediate/internal/testing/deploytest"
	"github.com/remediate-dev/remediate/policy"
	"github.com/remediate-dev/remediate/remediate/exporters/kubeexporter"
	"github.com/remediate-dev/remediate/remediate/guardrails"
)

// testFleet: the fleet controls against the real apiserver, each as the
// identity the manifests give it: the daemon's ServiceAccount (the enforce
// overlay's RBAC, applied by testManifests; the chart's is the same,
// deploy.TestChartMatchesKustomize) watches the pause ConfigMap and
// kube-proxy's DaemonSet by name, the guardrails follow them; the
// uninstall hook's (its RBAC applied from the rendered chart)
// ServiceAccount removes remediate's condition, cordon and taint from
// every node and leaves another's cordon alone.
func testFleet(t *testing.T, cp *controlplane.ControlPlane) {
	ctx := context.Background()
	helm, err := deploy.HelmBin()
	if err != nil {
		if os.Getenv("REMEDIATE_E2E_REQUIRED") != "" {
			t.Fatalf("REMEDIATE_E2E_REQUIRED is set but: %v", err)
		}
		t.Skip(err)
	}
	objs, err := deploy.RenderChart(ctx, helm, deploy.ChartNamespace)
	if err != nil {
		t.Fatal(err)
	}
	dyn, err := dynamic.NewForConfig(cp.RestConfig)
	if err != nil {
		t.Fatal(err)
	}
	applied := 0
	for _, o := range objs {
		if !deploy.ChartOnly[deploy.ObjectKey(o)] && !(deploy.IsHook(o) && o.GetKind() != "Job") {
			continue
		}
		if o.GetKind() == "Job" {
			continue
		}
		applyReal(t, dyn, o)
		applied++
	}
	if applied < 3 {
		t.Fatalf("applied %d hook RBAC objects", applied)
	}

	cs := daemonClient(t, cp, "n1").Interface
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	pw := kube.NewFleetPauseWatch(cs, deploytest.Namespace)
	pw.Start(wctx)
	dw := kube.NewDaemonSetWatch(cs, "kube-system", "kube-proxy")
	dw.Start(wctx)
	sctx, scancel := context.WithTimeout(ctx, 20*time.Second)
	if !pw.WaitForSync(sctx) || !dw.WaitForSync(sctx) {
		t.Fatal("the daemon's ServiceAccount could not list/watch the fleet ConfigMap or kube-proxy's DaemonSet")
	}
	scancel()
	pause := guardrails.NewFleetPause(pw, deploytest.Namespace)
	rollout := guardrails.NewKubeProxyRollout(dw)
	check := func(g guardrails.Guardrail) string {
		r := &guardrails.Request{Rule: &policy.Rule{Name: "restart"}, ActionType: "RestartKubeProxy", Disruptive: true, Now: time.Now()}
		err := g.Check(ctx, r)
		var b *guardrails.Blocked
		if errors.As(err, &b) {
			return b.Reason
		}
		if err != nil {
			return "error " + err.Error()
		}
		return ""
	}
	eventually := func(what string, cond func() bool) {
		t.Helper()
		deadline := time.Now().Add(15 * time.Second)
		for !cond() {
			if time.Now().After(deadline) {
				t.Fatalf("timed out waiting for %s", what)
			}
			time.Sleep(100 * time.Millisecond)
		}
	}

	t.Run("pause", func(t *testing.T) {
		if r := check(pause); r != "" {
			t.Fatalf("blocked before any pause: %s", r)
		}
		admin := cp.Client.CoreV1().ConfigMaps(deploytest.Namespace)
		if _, err := admin.Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: kube.FleetConfigMap},
			Data: map[string]string{kube.PauseKey: "upgrading to 1.35"}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		eventually("the pause", func() bool { return strings.Contains(check(pause), "upgrading to 1.35") })
		// Another ConfigMap is invisible to the daemon (RBAC by name).
		if _, err := cs.CoreV1().ConfigMaps(deploytest.Namespace).Get(ctx, "remediate-policy-audit", metav1.GetOptions{}); err == nil {
			t.Error("the daemon can read other ConfigMaps")
		}
		cm, _ := admin.Get(ctx, kube.FleetConfigMap, metav1.GetOptions{})
		cm.Data[kube.PauseKey] = "false"
		if _, err := admin.Update(ctx, cm, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		eventually("pause=false", func() bool { return check(pause) == "" })
		if err := admin.Delete(ctx, kube.FleetConfigMap, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
	})

	t.Run("kube-proxy-rollout", func(t *testing.T) {
		dsc := cp.Client.AppsV1().DaemonSets("kube-system")
		labels := map[string]string{"k8s-app": "kube-proxy"}
		_, err := dsc.Create(ctx, &appsv1.DaemonSet{ObjectMeta: metav1.ObjectMeta{Name: "kube-proxy"},
			Spec: appsv1.DaemonSetSpec{Selector: &metav1.LabelSelector{MatchLabels: labels},
				Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: labels},
					Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "kube-proxy", Image: "registry.k8s.io/kube-proxy:v1.34.4"}}}}}},
			metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		defer dsc.Delete(ctx, "kube-proxy", metav1.DeleteOptions{})
		setStatus := func(updated, available int32) {
			ds, err := dsc.Get(ctx, "kube-proxy", metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			ds.Status = appsv1.DaemonSetStatus{ObservedGeneration: ds.Generation, DesiredNumberScheduled: 3,
				CurrentNumberScheduled: 3, UpdatedNumberScheduled: updated, NumberAvailable: available, NumberReady: available}
			if _, err := dsc.UpdateStatus(ctx, ds, metav1.UpdateOptions{}); err != nil {
				t.Fatal(err)
			}
		}
		// No controller manager: the new DaemonSet's generation is not
		// observed yet, which is a rollout in progress.
		eventually("unobserved generation held", func() bool { return strings.Contains(check(rollout), "not yet observed") })
		setStatus(1, 3)
		eventually("rolling out held", func() bool { return strings.Contains(check(rollout), "1 of 3 pods updated") })
		setStatus(3, 3)
		eventually("settled allowed", func() bool { return check(rollout) == "" })
	})

	t.Run("cleanup", func(t *testing.T) {
		// n3: remediate's condition, cordon and taint. n2: cordoned by
		// someone else, with the condition.
		taint := &corev1.Taint{Key: "remediate.dev/dataplane-unhealthy", Effect: corev1.TaintEffectNoSchedule}
		if _, err := kube.Cordon(ctx, cp.Client, "n3", kube.CordonRecord{Detector: "KubeProxySyncStale", Target: "kube-proxy/ipv4", Time: time.Now(), Taint: taint}); err != nil {
			t.Fatal(err)
		}
		n2, _ := cp.Client.CoreV1().Nodes().Get(ctx, "n2", metav1.GetOptions{})
		wasUnschedulable := n2.Spec.Unschedulable
		n2.Spec.Unschedulable = true
		if _, err := cp.Client.CoreV1().Nodes().Update(ctx, n2, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		defer func() {
			n2, _ := cp.Client.CoreV1().Nodes().Get(ctx, "n2", metav1.GetOptions{})
			n2.Spec.Unschedulable = wasUnschedulable
			cp.Client.CoreV1().Nodes().Update(ctx, n2, metav1.UpdateOptions{})
		}()
		for _, n := range []string{"n2", "n3"} {
			p := `{"status":{"conditions":[{"type":"` + kubeexporter.DefaultConditionType + `","status":"False","reason":"Test","message":"x","lastTransitionTime":"2026-11-23T00:00:00Z","lastHeartbeatTime":"2026-11-23T00:00:00Z"}]}}`
			if _, err := cp.Client.CoreV1().Nodes().PatchStatus(ctx, n, []byte(p)); err != nil {
				t.Fatal(err)
			}
		}
		cleaner := asUser(cp, "system:serviceaccount:"+deploytest.Namespace+":remediate-cleanup")
		done, err := kube.Cleanup(ctx, cleaner, "", kubeexporter.DefaultConditionType)
		if err != nil {
			t.Fatalf("cleanup as the hook's ServiceAccount: %v", err)
		}
		if strings.Join(done["n3"], ",") != "cordon,condition "+kubeexporter.DefaultConditionType || strings.Join(done["n2"], ",") != "condition "+kubeexporter.DefaultConditionType {
			t.Errorf("cleanup did %v", done)
		}
		for _, name := range []string{"n1", "n2", "n3"} {
			n, err := cp.Client.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			for _, c := range n.Status.Conditions {
				if string(c.Type) == kubeexporter.DefaultConditionType {
					t.Errorf("%s still has the condition", name)
				}
			}
			if _, ok := kube.CordonedBy(n); ok {
				t.Errorf("%s still has the cordon annotation", name)
			}
			for _, tt := range n.Spec.Taints {
				if tt.Key == taint.Key {
					t.Errorf("%s still has the taint", name)
				}
			}
			if want := name == "n2"; n.Spec.Unschedulable != want {
				t.Errorf("%s unschedulable=%v, want %v", name, n.Spec.Unschedulable, want)
			}
		}
		// Idempotent: nothing left to do.
		if done, err := kube.Cleanup(ctx, cleaner, "", kubeexporter.DefaultConditionType); err != nil || len(done) != 0 {
			t.Errorf("second cleanup: %v %v", done, err)
		}
	})
}

func applyReal(t *testing.T, dyn dynamic.Interface, o *unstructured.Unstructured) {
	t.Helper()
	js, err := o.MarshalJSON()
	if err != nil {
		t.Fatal(err)
	}
	gvk := o.GroupVersionKind()
	res := map[string]string{"ServiceAccount": "serviceaccounts", "ClusterRole": "clusterroles", "ClusterRoleBinding": "clusterrolebindings",
		"Role": "roles", "RoleBinding": "rolebindings"}[gvk.Kind]
	if res == "" {
		t.Fatalf("applyReal: %s", gvk.Kind)
	}
	var ri dynamic.ResourceInterface = dyn.Resource(gvk.GroupVersion().WithResource(res))
	if o.GetNamespace() != "" {
		ri = dyn.Resource(gvk.GroupVersion().WithResource(res)).Namespace(o.GetNamespace())
	}
	if _, err := ri.Patch(context.Background(), o.GetName(), types.ApplyPatchType, js,
		metav1.PatchOptions{FieldManager: "remediate-e2e", Force: ptr.To(true)}); err != nil {
		t.Fatalf("apply %s: %v", deploy.ObjectKey(o), err)
	}
}

// asUser impersonates a ServiceAccount without a node (a Job's token).
func asUser(cp *controlplane.ControlPlane, user string) kubernetes.Interface {
	cfg := rest.CopyConfig(cp.RestConfig)
	ns := strings.Split(user, ":")[2]
	cfg.Impersonate = rest.ImpersonationConfig{UserName: user,
		Groups: []string{"system:serviceaccounts", "system:serviceaccounts:" + ns, "system:authenticated"}}
	return kubernetes.NewForConfigOrDie(cfg)
}
