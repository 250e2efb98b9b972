// Package deploytest installs the deploy/ manifests on a real control
// plane (internal/testing/controlplane) and acts as the DaemonSet's
// ServiceAccount on a node, for the end-to-end tests of the daemon's
// permissions: the RBAC and the admission policy there are then what
// allows or refuses each request.
package deploytest

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	authnv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/restmapper"
	"k8s.io/utils/ptr"

	"github.com/remediate-dev/remediate/deploy"
	"github.com/remediate-dev/remediate/internal/testing/controlplane"
)

const (
	// SAUser is the DaemonSet's ServiceAccount as a user name.
	SAUser = "system:serviceaccount:" + Namespace + ":remediate"
	// Namespace is the manifests' namespace; it holds the guardrail
	// Leases (the daemon's own namespace).
	Namespace = "remediate"
	// NodeKey is the user extra a bound pod token carries its node in.
	NodeKey = "authentication.kubernetes.io/node-name"
)

// saGroups are the groups a ServiceAccount token authenticates with.
var saGroups = []string{"system:serviceaccounts", "system:serviceaccounts:" + Namespace, "system:authenticated"}

// AsDaemon returns a config that impersonates the DaemonSet's
// ServiceAccount on node, the way a bound pod token authenticates.
func AsDaemon(cp *controlplane.ControlPlane, node string) *rest.Config {
	cfg := rest.CopyConfig(cp.RestConfig)
	cfg.Impersonate = rest.ImpersonationConfig{
		UserName: SAUser,
		Groups:   saGroups,
		Extra:    map[string][]string{NodeKey: {node}},
	}
	return cfg
}

// AsBoundPod returns a config that authenticates with a real pod-bound
// ServiceAccount token, as the kubelet projects into the DaemonSet's pod:
// it creates a pod of ServiceAccount namespace/sa on node (no kubelet runs
// it) and requests a token bound to that pod (TokenRequest). The
// apiserver itself then puts the node's name into the token's user extra
// (NodeKey), as on a real node; the function checks that it did
// (SelfSubjectReview). The pod is deleted in t.Cleanup.
func AsBoundPod(t testing.TB, cp *controlplane.ControlPlane, namespace, sa, node string) *rest.Config {
	t.Helper()
	ctx := context.Background()
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{GenerateName: sa + "-" + node + "-", Namespace: namespace},
		Spec: corev1.PodSpec{NodeName: node, ServiceAccountName: sa,
			Containers:                    []corev1.Container{{Name: "remediate", Image: "ghcr.io/remediate-dev/remediate:test"}},
			TerminationGracePeriodSeconds: ptr.To[int64](0)},
	}
	pod, err := cp.Client.CoreV1().Pods(namespace).Create(ctx, pod, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("pod of %s/%s on %s: %v", namespace, sa, node, err)
	}
	t.Cleanup(func() {
		_ = cp.Client.CoreV1().Pods(namespace).Delete(context.Background(), pod.Name, metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)})
	})
	tr, err := cp.Client.CoreV1().ServiceAccounts(namespace).CreateToken(ctx, sa, &authnv1.TokenRequest{Spec: authnv1.TokenRequestSpec{
		ExpirationSeconds: ptr.To[int64](3600),
		BoundObjectRef:    &authnv1.BoundObjectReference{Kind: "Pod", APIVersion: "v1", Name: pod.Name, UID: pod.UID},
	}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("token of %s/%s bound to pod %s: %v", namespace, sa, pod.Name, err)
	}
	cfg := rest.CopyConfig(cp.RestConfig)
	cfg.BearerToken, cfg.BearerTokenFile = tr.Status.Token, ""
	cfg.CertData, cfg.KeyData, cfg.CertFile, cfg.KeyFile = nil, nil, "", ""
	cfg.Impersonate = rest.ImpersonationConfig{}
	ssr, err := kubernetes.NewForConfigOrDie(cfg).AuthenticationV1().SelfSubjectReviews().Create(ctx, &authnv1.SelfSubjectReview{}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("SelfSubjectReview with the bound token: %v", err)
	}
	ui := ssr.Status.UserInfo
	if want := "system:serviceaccount:" + namespace + ":" + sa; ui.Username != want || fmt.Sprint(ui.Extra[NodeKey]) != "["+node+"]" {
		t.Fatalf("bound token authenticates as %q with %s=%v, want %q on node %s", ui.Username, NodeKey, ui.Extra[NodeKey], want, node)
	}
	return cfg
}

// DaemonKubeconfig writes a kubeconfig (for a program run inside the
// control plane's namespace, such as the remediate binary) that
// impersonates the DaemonSet's ServiceAccount on node, as AsDaemon, and
// returns its path.
func DaemonKubeconfig(t testing.TB, cp *controlplane.ControlPlane, node string) string {
	t.Helper()
	token := "    token: " + controlplane.AdminToken + "\n"
	k := strings.Replace(controlplane.Kubeconfig(controlplane.AdminToken), token, token+"    as: "+SAUser+"\n"+
		"    as-groups: ["+strings.Join(saGroups, ", ")+"]\n    as-user-extra: {"+NodeKey+": ["+node+"]}\n", 1)
	path := filepath.Join(t.TempDir(), "daemon-"+node+".kubeconfig")
	if err := os.WriteFile(path, []byte(k), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// ApplyOverlay server-side applies every object of an overlay and returns
// what the apiserver stored (or, with dryRun, would store).
func ApplyOverlay(t testing.TB, cp *controlplane.ControlPlane, overlay string, dryRun bool) []*unstructured.Unstructured {
	t.Helper()
	m, err := deploy.Render(overlay)
	if err != nil {
		t.Fatal(err)
	}
	objs, err := deploy.KustomizeObjects(m)
	if err != nil {
		t.Fatal(err)
	}
	return ApplyObjects(t, cp, overlay, objs, dryRun)
}

// ApplyEnforceWith applies, for real, the enforce overlay with the given
// components of deploy/components (as a user's own overlay would).
func ApplyEnforceWith(t testing.TB, cp *controlplane.ControlPlane, components ...string) {
	t.Helper()
	dir := t.TempDir()
	rel := func(p ...string) string {
		r, err := filepath.Rel(dir, filepath.Join(append([]string{deploy.Dir()}, p...)...))
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	k := "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nresources:\n- " + rel("overlays", "enforce") + "\ncomponents:\n"
	for _, c := range components {
		k += "- " + rel("components", c) + "\n"
	}
	if err := os.WriteFile(filepath.Join(dir, "kustomization.yaml"), []byte(k), 0o644); err != nil {
		t.Fatal(err)
	}
	m, err := deploy.RenderDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	objs, err := deploy.KustomizeObjects(m)
	if err != nil {
		t.Fatal(err)
	}
	ApplyObjects(t, cp, "enforce+"+strings.Join(components, "+"), objs, false)
}

// ApplyObjects server-side applies objs and returns what the apiserver
// answered.
func ApplyObjects(t testing.TB, cp *controlplane.ControlPlane, what string, objs []*unstructured.Unstructured, dryRun bool) []*unstructured.Unstructured {
	t.Helper()
	ctx := context.Background()
	dc, err := discovery.NewDiscoveryClientForConfig(cp.RestConfig)
	if err != nil {
		t.Fatal(err)
	}
	mapper := restmapper.NewDeferredDiscoveryRESTMapper(memory.NewMemCacheClient(dc))
	dyn, err := dynamic.NewForConfig(cp.RestConfig)
	if err != nil {
		t.Fatal(err)
	}
	var out []*unstructured.Unstructured
	for _, o := range objs {
		js, err := o.MarshalJSON()
		if err != nil {
			t.Fatal(err)
		}
		gvk := o.GroupVersionKind()
		mapping, err := mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
		if err != nil {
			t.Fatalf("%s %s: %v", what, deploy.ObjectKey(o), err)
		}
		var ri dynamic.ResourceInterface = dyn.Resource(mapping.Resource)
		if mapping.Scope.Name() == "namespace" {
			ri = dyn.Resource(mapping.Resource).Namespace(o.GetNamespace())
		}
		opts := metav1.PatchOptions{FieldManager: "remediate-e2e", Force: ptr.To(true)}
		if dryRun {
			opts.DryRun = []string{metav1.DryRunAll}
		}
		got, err := ri.Patch(ctx, o.GetName(), types.ApplyPatchType, js, opts)
		if err != nil {
			t.Errorf("%s: server-side apply (dryRun=%v) of %s: %v", what, dryRun, deploy.ObjectKey(o), err)
			continue
		}
		out = append(out, got)
	}
	return out
}
