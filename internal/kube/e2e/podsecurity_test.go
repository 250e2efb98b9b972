package e2e

import (
	"context"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/remediate-dev/remediate/deploy"
	"github.com/remediate-dev/remediate/internal/testing/controlplane"
	"github.com/remediate-dev/remediate/internal/testing/deploytest"
)

// TestPodSecurityNamespaceE2E: on the real apiserver (Pod Security
// Admission built in), the DaemonSet's pod (hostNetwork, hostPID, hostPath)
// is admitted in the namespace the kustomize install creates (labelled
// privileged) and refused, with the reason, in one that enforces baseline,
// the common default that accepted the DaemonSet and refused its pods.
func TestPodSecurityNamespaceE2E(t *testing.T) {
	cp := controlplane.Start(t, controlplane.Options{})
	ctx := context.Background()
	deploytest.ApplyOverlay(t, cp, "audit", false)
	m, err := deploy.Render("audit")
	if err != nil {
		t.Fatal(err)
	}
	objs, err := deploy.KustomizeObjects(m)
	if err != nil {
		t.Fatal(err)
	}
	var ds appsv1.DaemonSet
	for _, o := range objs {
		if o.GetKind() == "DaemonSet" {
			if err := runtime.DefaultUnstructuredConverter.FromUnstructured(o.Object, &ds); err != nil {
				t.Fatal(err)
			}
		}
	}
	if ds.Name == "" {
		t.Fatal("no DaemonSet rendered")
	}
	pod := func(ns string) *corev1.Pod {
		return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "psa-probe", Namespace: ns, Labels: ds.Spec.Template.Labels},
			Spec: *ds.Spec.Template.Spec.DeepCopy()}
	}
	dry := metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}}
	got, err := cp.Client.CoreV1().Namespaces().Get(ctx, ds.Namespace, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if got.Labels["pod-security.kubernetes.io/enforce"] != "privileged" {
		t.Errorf("namespace %s as stored: labels %v", ds.Namespace, got.Labels)
	}
	if _, err := cp.Client.CoreV1().Pods(ds.Namespace).Create(ctx, pod(ds.Namespace), dry); err != nil {
		t.Errorf("the DaemonSet's pod refused in the install's namespace %s: %v", ds.Namespace, err)
	}

	const baseline = "psa-baseline"
	if _, err := cp.Client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: baseline,
		Labels: map[string]string{"pod-security.kubernetes.io/enforce": "baseline"}}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := cp.Client.CoreV1().ServiceAccounts(baseline).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: ds.Spec.Template.Spec.ServiceAccountName}},
		metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	_, err = cp.Client.CoreV1().Pods(baseline).Create(ctx, pod(baseline), dry)
	if err == nil || !strings.Contains(err.Error(), "violates PodSecurity") || !strings.Contains(err.Error(), "host") {
		t.Errorf("the DaemonSet's pod in a baseline namespace: %v, want refused by PodSecurity (host namespaces, hostPath)", err)
	}
}
