package e2e

import (
	"context"
	"errors"
	"fmt"
	"math/rand"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"go.uber.org/zap/zaptest"
	authzv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"

	"github.com/remediate-dev/remediate/deploy"
	"github.com/remediate-dev/remediate/detect"
	"github.com/remediate-dev/remediate/internal/finding"
	"github.com/remediate-dev/remediate/internal/kube"
	"github.com/remediate-dev/remediate/internal/node"
	"github.com/remediate-dev/remediate/internal/testing/controlplane"
	"github.com/remediate-dev/remediate/internal/testing/deploytest"
	"github.com/remediate-dev/remediate/policy"
	"github.com/remediate-dev/remediate/remediate"
	"github.com/remediate-dev/remediate/remediate/action"
	"github.com/remediate-dev/remediate/remediate/exporters/kubeexporter"
	"github.com/remediate-dev/remediate/remediate/guardrails"
	"github.com/remediate-dev/remediate/remediate/journal"
)

func daemonClient(t *testing.T, cp *controlplane.ControlPlane, node string) *kube.Client {
	t.Helper()
	c, err := kube.NewClient(deploytest.AsDaemon(cp, node), kube.Options{QPS: 50, Burst: 100})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func mkNode(t *testing.T, cs kubernetes.Interface, name string) {
	t.Helper()
	_, err := cs.CoreV1().Nodes().Create(context.Background(), &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
}

// TestClusterEndToEnd runs every Kubernetes-facing proof against one real
// control plane (starting it dominates the cost).
func TestClusterEndToEnd(t *testing.T) {
	cp := controlplane.Start(t, controlplane.Options{})
	ctx := context.Background()
	for _, n := range []string{"n1", "n2", "n3"} {
		mkNode(t, cp.Client, n)
	}
	// No controller manager runs: create the default ServiceAccount that
	// pod admission looks up.
	if _, err := cp.Client.CoreV1().ServiceAccounts("kube-system").Create(ctx,
		&corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "default"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Run("manifests", func(t *testing.T) { testManifests(t, cp) })
	t.Run("permissions", func(t *testing.T) { testPermissions(t, cp) })
	t.Run("budget", func(t *testing.T) { testBudget(t, cp) })
	t.Run("reporting", func(t *testing.T) { testReporting(t, cp) })
	t.Run("actions", func(t *testing.T) { testActions(t, cp) })
	t.Run("node-pods", func(t *testing.T) { testNodePods(t, cp) })
	t.Run("fleet", func(t *testing.T) { testFleet(t, cp) })
	t.Run("apiserver-down", func(t *testing.T) { testAPIServerDown(t, cp) })
}

// testManifests: every object of both overlays, and of the Helm chart
// rendered in audit and enforce mode (its uninstall hook included), passes
// server-side dry-run apply; the chart's objects as the apiserver would
// store them (defaults filled in) equal the overlays' after
// deploy.Normalize. Then the enforce overlay is applied for real (the
// action and permission tests need its RBAC and admission policy).
func testManifests(t *testing.T, cp *controlplane.ControlPlane) {
	ctx := context.Background()
	// A server-side dry run cannot create the namespace its objects go
	// into; kubectl apply creates the Namespace first, for real, as here.
	if _, err := cp.Client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: deploytest.Namespace}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	kAudit := deploytest.ApplyOverlay(t, cp, "audit", true)
	kEnforce := deploytest.ApplyOverlay(t, cp, "enforce", true)

	t.Run("helm", func(t *testing.T) {
		helm, err := deploy.HelmBin()
		if err != nil {
			if os.Getenv("REMEDIATE_E2E_REQUIRED") != "" {
				t.Fatalf("REMEDIATE_E2E_REQUIRED is set but: %v", err)
			}
			t.Skip(err)
		}
		for _, tc := range []struct {
			name string
			set  []string
			want []*unstructured.Unstructured
		}{{"audit", nil, kAudit}, {"enforce", []string{"--set", "enforce=true"}, kEnforce}} {
			objs, err := deploy.RenderChart(ctx, helm, deploytest.Namespace, tc.set...)
			if err != nil {
				t.Fatal(err)
			}
			var installed []*unstructured.Unstructured
			for _, o := range objs {
				if !deploy.IsHook(o) && !deploy.ChartOnly[deploy.ObjectKey(o)] {
					installed = append(installed, o)
				}
			}
			deploytest.ApplyObjects(t, cp, "chart "+tc.name+" (hooks)", objs, true)
			got := deploytest.ApplyObjects(t, cp, "chart "+tc.name, installed, true)
			if len(got) != len(installed) {
				continue
			}
			want := make([]*unstructured.Unstructured, 0, len(tc.want))
			for _, o := range tc.want {
				if !deploy.KustomizeOnly[deploy.ObjectKey(o)] {
					want = append(want, o.DeepCopy())
				}
			}
			for _, o := range append(append([]*unstructured.Unstructured{}, want...), got...) {
				stripServerFields(o)
				deploy.Normalize(o)
			}
			wm, wkeys := deploy.ByKey(want)
			gm, gkeys := deploy.ByKey(got)
			if d := cmp.Diff(wkeys, gkeys); d != "" {
				t.Errorf("%s: objects differ (-kustomize +chart):\n%s", tc.name, d)
			}
			for _, k := range wkeys {
				if g, ok := gm[k]; ok {
					if d := cmp.Diff(wm[k].Object, g.Object); d != "" {
						t.Errorf("%s: %s as stored differs (-kustomize +chart):\n%s", tc.name, k, d)
					}
				}
			}
		}
	})

	// Enforce for real: the action tests need its RBAC (the audit
	// overlay's is read-only; testPermissions checks it too).
	deploytest.ApplyOverlay(t, cp, "enforce", false)
	// Nothing was created by the dry run of the audit overlay.
	cms, _ := cp.Client.CoreV1().ConfigMaps(deploytest.Namespace).List(ctx, metav1.ListOptions{})
	for _, cm := range cms.Items {
		if strings.HasPrefix(cm.Name, "remediate-policy-audit") {
			t.Errorf("dry run created %s", cm.Name)
		}
	}
}

// stripServerFields removes what the apiserver adds to every object
// (identity, timestamps, field ownership, status), keeping spec defaults.
func stripServerFields(o *unstructured.Unstructured) {
	for _, f := range []string{"uid", "resourceVersion", "generation", "creationTimestamp", "managedFields"} {
		unstructured.RemoveNestedField(o.Object, "metadata", f)
	}
	unstructured.RemoveNestedField(o.Object, "status")
	if a := o.GetAnnotations(); len(a) == 0 {
		unstructured.RemoveNestedField(o.Object, "metadata", "annotations")
	}
}

// testPermissions: the ServiceAccount can do exactly what the daemon does
// and is refused the rest (SubjectAccessReview), and the admission policy
// confines pod deletes and node updates to its own node (impersonation).
func testPermissions(t *testing.T, cp *controlplane.ControlPlane) {
	ctx := context.Background()
	type ra struct {
		verb, group, resource, sub, ns string
	}
	allowed := []ra{
		{"list", "", "services", "", ""}, {"watch", "", "services", "", ""},
		{"list", "discovery.k8s.io", "endpointslices", "", ""}, {"watch", "discovery.k8s.io", "endpointslices", "", ""},
		{"get", "", "nodes", "", ""}, {"list", "", "nodes", "", ""}, {"watch", "", "nodes", "", ""}, {"update", "", "nodes", "", ""},
		{"patch", "", "nodes", "status", ""},
		{"get", "coordination.k8s.io", "leases", "", deploytest.Namespace}, {"list", "coordination.k8s.io", "leases", "", deploytest.Namespace},
		{"create", "coordination.k8s.io", "leases", "", deploytest.Namespace}, {"update", "coordination.k8s.io", "leases", "", deploytest.Namespace},
		// Pod delete in the node agents' namespace (Role
		// remediate-node-agents in kube-system; the admission policy
		// narrows it further).
		{"list", "", "pods", "", "kube-system"}, {"delete", "", "pods", "", "kube-system"},
		// The watch of this node's pods (field selector; RBAC cannot narrow
		// it).
		{"list", "", "pods", "", ""}, {"watch", "", "pods", "", ""},
		{"create", "events.k8s.io", "events", "", "kube-system"}, {"patch", "events.k8s.io", "events", "", "kube-system"},
		// PodsNetworkNotReady: a stuck pod's kubelet Events (one LIST by
		// involvedObject.uid; no watch, no get).
		{"list", "", "events", "", ""}, {"list", "", "events", "", "default"},
	}
	refused := []ra{
		{"watch", "", "events", "", ""}, {"get", "", "events", "", "default"}, {"delete", "", "events", "", "default"},
		// Pod delete outside the node agents' namespaces, refused by RBAC
		// alone (whether or not the admission policy is installed):
		// calico-system only with its component (testNodePods adds it).
		{"delete", "", "pods", "", "default"}, {"delete", "", "pods", "", "calico-system"}, {"delete", "", "pods", "", deploytest.Namespace},
		{"delete", "", "pods", "", ""},
		{"get", "", "secrets", "", "kube-system"}, {"list", "", "secrets", "", "kube-system"}, {"list", "", "secrets", "", ""},
		{"watch", "", "secrets", "", "default"}, {"get", "", "secrets", "", "default"},
		{"create", "", "pods", "", "kube-system"}, {"update", "", "pods", "", "kube-system"}, {"patch", "", "pods", "", ""},
		{"update", "", "pods", "status", ""}, {"deletecollection", "", "pods", "", "kube-system"}, {"get", "", "pods", "", "kube-system"}, {"create", "", "pods", "eviction", "kube-system"},
		{"delete", "", "nodes", "", ""}, {"patch", "", "nodes", "", ""}, {"create", "", "nodes", "", ""},
		{"update", "", "nodes", "status", ""},
		{"delete", "coordination.k8s.io", "leases", "", deploytest.Namespace}, {"create", "coordination.k8s.io", "leases", "", "default"},
		// No Lease outside its own namespace: not the controller-manager's
		// or scheduler's leader Leases in kube-system.
		{"get", "coordination.k8s.io", "leases", "", "kube-system"}, {"list", "coordination.k8s.io", "leases", "", "kube-system"},
		{"create", "coordination.k8s.io", "leases", "", "kube-system"}, {"update", "coordination.k8s.io", "leases", "", "kube-system"},
		{"create", "events.k8s.io", "events", "", deploytest.Namespace},
		{"create", "events.k8s.io", "events", "", "default"}, {"create", "", "events", "", "kube-system"},
		{"update", "", "services", "", "default"}, {"delete", "discovery.k8s.io", "endpointslices", "", "default"},
		{"get", "", "configmaps", "", "kube-system"}, {"update", "apps", "daemonsets", "", "kube-system"},
		{"create", "rbac.authorization.k8s.io", "rolebindings", "", "kube-system"},
		{"impersonate", "", "serviceaccounts", "", "kube-system"},
	}
	checkNamed := func(a ra, name string) bool {
		sar := &authzv1.SubjectAccessReview{Spec: authzv1.SubjectAccessReviewSpec{
			User:   deploytest.SAUser,
			Groups: []string{"system:serviceaccounts", "system:serviceaccounts:remediate", "system:authenticated"},
			ResourceAttributes: &authzv1.ResourceAttributes{Verb: a.verb, Group: a.group, Resource: a.resource,
				Subresource: a.sub, Namespace: a.ns, Name: name},
		}}
		res, err := cp.Client.AuthorizationV1().SubjectAccessReviews().Create(ctx, sar, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return res.Status.Allowed
	}
	check := func(a ra) bool { return checkNamed(a, "") }
	for _, a := range allowed {
		if !check(a) {
			t.Errorf("ServiceAccount refused %+v, which the daemon needs", a)
		}
	}
	for _, a := range refused {
		if check(a) {
			t.Errorf("ServiceAccount allowed %+v, which the daemon does not need", a)
		}
	}
	// The fleet controls' watches (kube.OneWatch): one object each, by
	// name (list and watch carry the field selector metadata.name).
	for _, a := range []ra{{"get", "", "configmaps", "", deploytest.Namespace}, {"list", "", "configmaps", "", deploytest.Namespace}, {"watch", "", "configmaps", "", deploytest.Namespace}} {
		if !checkNamed(a, kube.FleetConfigMap) || checkNamed(a, "remediate-other") || check(a) {
			t.Errorf("ConfigMap %s: %+v allowed other than by that name", kube.FleetConfigMap, a)
		}
	}
	for _, a := range []ra{{"get", "apps", "daemonsets", "", "kube-system"}, {"list", "apps", "daemonsets", "", "kube-system"}, {"watch", "apps", "daemonsets", "", "kube-system"}} {
		if !checkNamed(a, "kube-proxy") || checkNamed(a, "calico-node") || check(a) {
			t.Errorf("DaemonSet kube-proxy: %+v allowed other than by that name", a)
		}
	}
	if checkNamed(ra{"update", "", "configmaps", "", deploytest.Namespace}, kube.FleetConfigMap) {
		t.Errorf("ServiceAccount may update the fleet ConfigMap")
	}

	// The audit overlay's RBAC is read-only: no pod delete, no Node
	// update, while reporting keeps working.
	deploytest.ApplyOverlay(t, cp, "audit", false)
	waitFor(t, 30*time.Second, "audit RBAC", func() (bool, string) {
		return !check(ra{"delete", "", "pods", "", "kube-system"}), "pods delete still allowed"
	})
	for _, a := range []ra{{"delete", "", "pods", "", "kube-system"}, {"delete", "", "pods", "", "calico-system"}, {"update", "", "nodes", "", ""}} {
		if check(a) {
			t.Errorf("audit overlay allows %+v", a)
		}
	}
	for _, a := range []ra{{"patch", "", "nodes", "status", ""}, {"list", "", "pods", "", "kube-system"}, {"watch", "", "pods", "", ""}, {"create", "events.k8s.io", "events", "", "kube-system"},
		{"update", "coordination.k8s.io", "leases", "", deploytest.Namespace}, {"watch", "", "nodes", "", ""}} {
		if !check(a) {
			t.Errorf("audit overlay refuses %+v, which reporting needs", a)
		}
	}
	deploytest.ApplyOverlay(t, cp, "enforce", false)
	waitFor(t, 30*time.Second, "enforce RBAC back", func() (bool, string) {
		return check(ra{"delete", "", "pods", "", "kube-system"}), "pods delete still refused"
	})

	// The admission policy: as the daemon on n1, deleting n2's kube-proxy
	// pod or updating n2 is denied; n1's own are allowed.
	for _, p := range []*corev1.Pod{kubeProxyPod("kp-n1", "n1"), kubeProxyPod("kp-n2", "n2"), otherPod("dns-n1", "n1")} {
		if _, err := cp.Client.CoreV1().Pods("kube-system").Create(ctx, p, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	n1 := kubernetes.NewForConfigOrDie(deploytest.AsDaemon(cp, "n1"))
	waitFor(t, 30*time.Second, "admission policy active", func() (bool, string) {
		err := n1.CoreV1().Pods("kube-system").Delete(ctx, "kp-n2", metav1.DeleteOptions{DryRun: []string{metav1.DryRunAll}})
		return err != nil && strings.Contains(err.Error(), "only delete the pod of a node agent"), fmt.Sprint(err)
	})
	if err := n1.CoreV1().Pods("kube-system").Delete(ctx, "dns-n1", metav1.DeleteOptions{DryRun: []string{metav1.DryRunAll}}); err == nil {
		t.Error("daemon may delete a non-kube-proxy pod on its node")
	}
	if err := n1.CoreV1().Pods("kube-system").Delete(ctx, "kp-n1", metav1.DeleteOptions{DryRun: []string{metav1.DryRunAll}}); err != nil {
		t.Errorf("daemon may not delete its own node's kube-proxy pod: %v", err)
	}
	// A kube-proxy-labelled pod of n1 in default: refused by RBAC itself
	// (Forbidden before admission runs), not only by the admission policy.
	if _, err := cp.Client.CoreV1().ServiceAccounts("default").Create(ctx,
		&corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "default"}}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	if _, err := cp.Client.CoreV1().Pods("default").Create(ctx, func() *corev1.Pod {
		p := kubeProxyPod("kp-default-n1", "n1")
		p.Namespace = "default"
		return p
	}(), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	err := n1.CoreV1().Pods("default").Delete(ctx, "kp-default-n1", metav1.DeleteOptions{DryRun: []string{metav1.DryRunAll}})
	if !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), `cannot delete resource "pods" in API group "" in the namespace "default"`) {
		t.Errorf("delete of a pod in default as the daemon on n1: %v, want RBAC's refusal", err)
	}
	_ = cp.Client.CoreV1().Pods("default").Delete(ctx, "kp-default-n1", metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)})
	if _, err := kube.Cordon(ctx, n1, "n2", kube.CordonRecord{Detector: "x"}); err == nil || !strings.Contains(err.Error(), "only update its own Node") {
		t.Errorf("daemon on n1 cordoned n2: %v", err)
	}
	testOwnNodeFields(t, cp, n1)
	testOwnNodeAttacks(t, cp)
	testSubjectInAnotherNamespace(t, cp)
	if _, err := n1.CoreV1().Secrets("kube-system").List(ctx, metav1.ListOptions{}); !apierrors.IsForbidden(err) {
		t.Errorf("secrets list: %v", err)
	}
	for _, p := range []string{"kp-n1", "kp-n2", "dns-n1"} {
		_ = cp.Client.CoreV1().Pods("kube-system").Delete(ctx, p, metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)})
	}
}

func kubeProxyPod(name, node string) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "kube-system", Labels: map[string]string{"k8s-app": "kube-proxy"}},
		Spec: corev1.PodSpec{NodeName: node, Containers: []corev1.Container{{Name: "kube-proxy", Image: "registry.k8s.io/kube-proxy:v1.34.4"}},
			TerminationGracePeriodSeconds: ptr.To[int64](0)},
	}
}

func otherPod(name, node string) *corev1.Pod {
	p := kubeProxyPod(name, node)
	p.Labels = map[string]string{"k8s-app": "kube-dns"}
	return p
}

func waitFor(t *testing.T, timeout time.Duration, what string, f func() (bool, string)) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	last := ""
	for time.Now().Before(deadline) {
		ok, msg := f()
		if ok {
			return
		}
		last = msg
		time.Sleep(250 * time.Millisecond)
	}
	t.Fatalf("timed out waiting for %s: %s", what, last)
}

func req(rule, target, act string, disruptive, dry bool) *guardrails.Request {
	return &guardrails.Request{Rule: &policy.Rule{Name: rule}, ActionType: act, Disruptive: disruptive,
		Finding: finding.Finding{Target: target}, DryRun: dry, Now: time.Now()}
}

// testBudget: three daemons (each its own client, impersonating the
// ServiceAccount on its node) hammer a 2-slot budget concurrently; at no
// moment do more than 2 hold a slot, measured both in-process and by
// reading the Leases.
func testBudget(t *testing.T, cp *controlplane.ControlPlane) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	const slots = 2
	var holding, maxHolding, acquired, blocked atomic.Int64
	var wg sync.WaitGroup
	stop := time.Now().Add(8 * time.Second)
	errs := make(chan error, 100)
	for i, n := range []string{"n1", "n2", "n3"} {
		b := guardrails.NewBudget(daemonClient(t, cp, n).Interface,
			guardrails.BudgetOptions{Namespace: deploytest.Namespace, Slots: slots, TTL: 30 * time.Second, Node: n})
		wg.Add(1)
		go func(i int, n string, b *guardrails.Budget) {
			defer wg.Done()
			rng := rand.New(rand.NewSource(int64(i)))
			for k := 0; time.Now().Before(stop); k++ {
				// Dry runs never take a slot.
				if err := b.Check(ctx, req("r", "t", "RestartKubeProxy", true, true)); err != nil {
					var bl *guardrails.Blocked
					if !errors.As(err, &bl) {
						errs <- err
						return
					}
				}
				if len(b.Held()) != 0 {
					errs <- fmt.Errorf("%s: dry run took a slot", n)
				}
				r := req("restart", fmt.Sprintf("kube-proxy/%s/%d", n, k), "RestartKubeProxy", true, false)
				err := b.Check(ctx, r)
				var bl *guardrails.Blocked
				if errors.As(err, &bl) {
					blocked.Add(1)
					time.Sleep(time.Duration(rng.Intn(20)) * time.Millisecond)
					continue
				}
				if err != nil {
					errs <- fmt.Errorf("%s: %w", n, err)
					return
				}
				acquired.Add(1)
				h := holding.Add(1)
				for {
					m := maxHolding.Load()
					if h <= m || maxHolding.CompareAndSwap(m, h) {
						break
					}
				}
				time.Sleep(time.Duration(20+rng.Intn(60)) * time.Millisecond)
				holding.Add(-1)
				b.Release(ctx, r)
			}
		}(i, n, b)
	}
	// Watch the Leases themselves meanwhile.
	var maxLeased int
	done := make(chan struct{})
	go func() {
		defer close(done)
		for time.Now().Before(stop) {
			l, err := cp.Client.CoordinationV1().Leases(deploytest.Namespace).List(ctx, metav1.ListOptions{LabelSelector: guardrails.LabelLease + "=" + guardrails.LeaseBudget})
			if err == nil {
				held := 0
				for i := range l.Items {
					if !guardrails.SlotFree(&l.Items[i], time.Now()) {
						held++
					}
				}
				maxLeased = max(maxLeased, held)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}()
	wg.Wait()
	<-done
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	t.Logf("budget: %d acquisitions, %d blocked, max concurrent holders %d (in-process), %d (leases)", acquired.Load(), blocked.Load(), maxHolding.Load(), maxLeased)
	if maxHolding.Load() > slots || maxLeased > slots {
		t.Fatalf("more than %d slots held at once: %d in-process, %d leases", slots, maxHolding.Load(), maxLeased)
	}
	if acquired.Load() < 10 || blocked.Load() == 0 {
		t.Fatalf("test did not exercise contention: %d acquired, %d blocked", acquired.Load(), blocked.Load())
	}

	// A crashed holder's slot expires after its TTL.
	short := func(n string) *guardrails.Budget {
		return guardrails.NewBudget(daemonClient(t, cp, n).Interface,
			guardrails.BudgetOptions{Namespace: deploytest.Namespace, Slots: 1, TTL: 2 * time.Second, Node: n, Prefix: "remediate-budget-ttl"})
	}
	if err := short("n1").Check(ctx, req("r", "t", "X", true, false)); err != nil {
		t.Fatal(err)
	}
	b2 := short("n2")
	if err := b2.Check(ctx, req("r", "t", "X", true, false)); err == nil {
		t.Fatal("second holder got the only slot")
	}
	time.Sleep(3 * time.Second) // n1 "crashed": never renewed, never released
	if err := b2.Check(ctx, req("r", "t", "X", true, false)); err != nil {
		t.Fatalf("expired slot not taken over: %v", err)
	}
}

// testReporting: events are created and deduplicated into series, the
// condition turns False after ProblemAfter and True again after
// ClearAfter, and the node-status Lease feeds the storm guard.
func testReporting(t *testing.T, cp *controlplane.ControlPlane) {
	ctx := context.Background()
	c := daemonClient(t, cp, "n1")
	storm := guardrails.NewStorm(c.Interface, guardrails.StormOptions{Namespace: deploytest.Namespace, Node: "n1", MinNodes: 2, MaxShare: 0.3})
	r := kubeexporter.New(c.Interface, kubeexporter.Options{Node: "n1", Firing: storm.Publish,
		Hysteresis: kubeexporter.Hysteresis{ProblemAfter: 2 * time.Second, ClearAfter: 3 * time.Second}, Log: zaptest.NewLogger(t)})
	sick := &remediate.Report{
		Findings: []remediate.ReportFinding{{Rule: "stale", Finding: finding.Finding{Detector: "KubeProxySyncStale",
			Target: "kube-proxy/IPv4", Severity: finding.Critical, Message: "last sync 95s ago"}}},
		Decisions: []remediate.Decision{{Rule: "stale", Action: "RestartKubeProxy", Target: "kube-proxy/IPv4",
			Outcome: remediate.OutcomeDryRun, Reason: "audit mode: would delete pod kube-system/kube-proxy-x"}},
	}
	for i := 0; i < 4; i++ {
		if err := r.Report(ctx, sick); err != nil {
			t.Fatal(err)
		}
		time.Sleep(time.Second)
	}
	if err := r.Flush(ctx); err != nil { // the series is written every 5 minutes, or at shutdown
		t.Fatal(err)
	}
	evs, err := cp.Client.EventsV1().Events("kube-system").List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var dry []string
	for _, e := range evs.Items {
		if e.Reason == kubeexporter.ReasonDryRun && e.Regarding.Name == "n1" {
			dry = append(dry, fmt.Sprintf("%s series=%v", e.Name, e.Series))
			if e.Series == nil || e.Series.Count != 4 {
				t.Errorf("event not deduplicated into a series of 4: %+v", e)
			}
		}
	}
	if len(dry) != 1 {
		t.Fatalf("dry-run events: %v", dry)
	}
	// Also visible through the core/v1 Events API, as kubectl describe node uses.
	core, _ := cp.Client.CoreV1().Events("kube-system").List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.kind=Node,involvedObject.name=n1"})
	if len(core.Items) == 0 {
		t.Error("no core/v1 view of the node events")
	}
	cond := func() corev1.NodeCondition {
		n, err := cp.Client.CoreV1().Nodes().Get(ctx, "n1", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		for _, c := range n.Status.Conditions {
			if c.Type == kubeexporter.DefaultConditionType {
				return c
			}
		}
		return corev1.NodeCondition{}
	}
	if c := cond(); c.Status != corev1.ConditionFalse || c.Reason != "KubeProxySyncStale" || !strings.Contains(c.Message, "last sync 95s ago") {
		t.Fatalf("condition after persistent problem: %+v", c)
	}
	// The storm guard sees n1 firing "stale" in its Lease; with n2 also
	// firing it, 2 of 2 live nodes is a storm.
	// ListTTL -1: its second Check, 4 s later, must see n1's recovery.
	storm2 := guardrails.NewStorm(daemonClient(t, cp, "n2").Interface, guardrails.StormOptions{Namespace: deploytest.Namespace, Node: "n2", MinNodes: 2, MaxShare: 0.3, ListTTL: -1})
	if err := storm2.Publish(ctx, []string{"stale"}); err != nil {
		t.Fatal(err)
	}
	if err := storm2.Check(ctx, req("stale", "kube-proxy/IPv4", "RestartKubeProxy", true, false)); err == nil || !strings.Contains(err.Error(), "2 of 2 nodes") {
		t.Errorf("storm not detected: %v", err)
	}
	// Healthy: stays False for ClearAfter, then True.
	healthy := &remediate.Report{}
	_ = r.Report(ctx, healthy)
	if c := cond(); c.Status != corev1.ConditionFalse {
		t.Fatalf("cleared without hysteresis: %+v", c)
	}
	time.Sleep(3500 * time.Millisecond)
	if err := r.Report(ctx, healthy); err != nil {
		t.Fatal(err)
	}
	if c := cond(); c.Status != corev1.ConditionTrue || c.Reason != kubeexporter.ReasonHealthy {
		t.Fatalf("condition not cleared: %+v", c)
	}
	// n1 no longer fires "stale": only n2 does, 1 of 2 is not a storm.
	if err := storm2.Check(ctx, req("stale", "kube-proxy/IPv4", "RestartKubeProxy", true, false)); err != nil {
		t.Errorf("storm after n1 recovered: %v", err)
	}
}

// testActions: RestartKubeProxy (RestartNodeAgent under its old name) and
// CordonNode against the real API, as
// the ServiceAccount on n1 (RBAC and the admission policy apply).
func testActions(t *testing.T, cp *controlplane.ControlPlane) {
	ctx := context.Background()
	c := daemonClient(t, cp, "n1")
	n := &node.Node{Name: "n1", Kube: c.Interface}
	f := finding.Finding{Detector: "KubeProxySyncStale", Target: "kube-proxy/IPv4", Subject: finding.Subject{Kind: finding.KindKubeProxy}}

	// No controller manager runs here: the test plays the DaemonSet
	// controller (owner reference, then a Ready replacement).
	ds := &metav1.OwnerReference{APIVersion: "apps/v1", Kind: "DaemonSet", Name: "kube-proxy", UID: "ds-uid", Controller: ptr.To(true)}
	mk := func(name string, ready bool) {
		p := kubeProxyPod(name, "n1")
		p.OwnerReferences = []metav1.OwnerReference{*ds}
		p, err := cp.Client.CoreV1().Pods("kube-system").Create(ctx, p, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if ready {
			p.Status = corev1.PodStatus{Phase: corev1.PodRunning, Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}}
			if _, err := cp.Client.CoreV1().Pods("kube-system").UpdateStatus(ctx, p, metav1.UpdateOptions{}); err != nil {
				t.Fatal(err)
			}
		}
	}
	mk("kube-proxy-old", true)
	typ, _ := action.Lookup("RestartKubeProxy")
	params := typ.NewParams().(*action.RestartKubeProxyParams)
	params.ReadyTimeout, params.PollInterval = policy.D(20*time.Second), policy.D(200*time.Millisecond)
	a, err := typ.New(params, n)
	if err != nil {
		t.Fatal(err)
	}
	plan, err := a.Plan(ctx, f)
	if err != nil || !strings.Contains(plan.Summary, "kube-system/kube-proxy-old") {
		t.Fatalf("plan: %+v %v", plan, err)
	}
	go func() {
		waitGone := time.Now().Add(15 * time.Second)
		for time.Now().Before(waitGone) {
			if _, err := cp.Client.CoreV1().Pods("kube-system").Get(ctx, "kube-proxy-old", metav1.GetOptions{}); apierrors.IsNotFound(err) {
				break
			}
			time.Sleep(100 * time.Millisecond)
		}
		mk("kube-proxy-new", true)
	}()
	res, err := a.Execute(ctx, f)
	if err != nil {
		t.Fatalf("execute: %v", err)
	}
	if res.Details["newPod"] != "kube-proxy-new" {
		t.Fatalf("result %+v", res)
	}
	_ = cp.Client.CoreV1().Pods("kube-system").Delete(ctx, "kube-proxy-new", metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)})

	// CordonNode, then the reporter uncordons once the finding is gone.
	ctyp, _ := action.Lookup("CordonNode")
	ca, err := ctyp.New(&action.CordonNodeParams{Enabled: true, Taint: &action.TaintParams{Key: "remediate.dev/dataplane", Effect: "NoSchedule"}}, n)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ca.Execute(ctx, f); err != nil {
		t.Fatalf("cordon: %v", err)
	}
	nd, _ := cp.Client.CoreV1().Nodes().Get(ctx, "n1", metav1.GetOptions{})
	if !nd.Spec.Unschedulable || !hasTaint(nd, "remediate.dev/dataplane") || nd.Annotations[kube.AnnotationCordonedBy] == "" {
		t.Fatalf("not cordoned: %+v", nd.Spec)
	}
	r := kubeexporter.New(c.Interface, kubeexporter.Options{Node: "n1", UncordonAfter: time.Second})
	_ = r.Report(ctx, &remediate.Report{})
	time.Sleep(1100 * time.Millisecond)
	_ = r.Report(ctx, &remediate.Report{})
	nd, _ = cp.Client.CoreV1().Nodes().Get(ctx, "n1", metav1.GetOptions{})
	if nd.Spec.Unschedulable || hasTaint(nd, "remediate.dev/dataplane") || nd.Annotations[kube.AnnotationCordonedBy] != "" {
		t.Fatalf("not uncordoned: %+v %v", nd.Spec, nd.Annotations)
	}
}

func hasTaint(n *corev1.Node, key string) bool {
	for _, t := range n.Spec.Taints {
		if t.Key == key {
			return true
		}
	}
	return false
}

// Test detector and actions for the engine run with the apiserver down.
// generation makes each cycle's finding a new target, so every cycle goes
// through the guardrails (instead of verifying the previous attempt).
var generation atomic.Int64

type alwaysFinding struct{}

func (alwaysFinding) Detect(context.Context) ([]finding.Finding, error) {
	return []finding.Finding{{Detector: "E2EAlways", Target: fmt.Sprintf("e2e/%d", generation.Load()), Severity: finding.Warning, Message: "e2e"}}, nil
}

type countAction struct{ n *atomic.Int64 }

func (a countAction) Plan(context.Context, finding.Finding) (action.Plan, error) {
	return action.Plan{Summary: "count"}, nil
}
func (a countAction) Execute(context.Context, finding.Finding) (action.Result, error) {
	a.n.Add(1)
	return action.Result{Summary: "counted"}, nil
}

var localRuns, apiRuns atomic.Int64

type empty struct{}

func init() {
	detect.Define("E2EAlways", "test detector",
		func(*empty, *node.Node) (detect.Detector, error) { return alwaysFinding{}, nil })
	action.Define("E2ELocal", "test action",
		func(*empty, *node.Node) (action.Action, error) { return countAction{&localRuns}, nil }, action.ActsOnAnyFinding())
	action.Define("E2EDisruptive", "test action",
		func(*empty, *node.Node) (action.Action, error) { return countAction{&apiRuns}, nil }, action.ActsOnAnyFinding(), action.Disruptive())
}

const e2ePolicy = `apiVersion: remediate.dev/v1alpha1
kind: RemediationPolicy
mode: enforce
rules:
- name: local
  detector: {type: E2EAlways}
  for: 0s
  action: {type: E2ELocal}
  cooldown: 0s
  rateLimit: {max: 100, per: 1h}
  verifyAfter: 0s
- name: api
  detector: {type: E2EAlways}
  for: 0s
  action: {type: E2EDisruptive}
  cooldown: 0s
  rateLimit: {max: 100, per: 1h}
  verifyAfter: 0s
guardrails:
  maxActionsPerHour: 100
  maxTargetsPerCycle: 10
`

// testAPIServerDown: with kube-apiserver stopped mid-run the view turns
// stale, the engine keeps executing the node-local rule and blocks the
// disruptive one with the reason; after a restart the view reconnects and
// the disruptive rule may act again.
func testAPIServerDown(t *testing.T, cp *controlplane.ControlPlane) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	c := daemonClient(t, cp, "n1")
	view, err := kube.NewView(c.Interface, c.Contact, nil, zaptest.NewLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	view.Start(ctx)
	sctx, scancel := context.WithTimeout(ctx, 30*time.Second)
	defer scancel()
	if !view.WaitForSync(sctx) {
		t.Fatal("view did not sync")
	}
	nw := kube.NewNodeWatch(c.Interface, "n1")
	nw.Start(ctx)
	nw.WaitForSync(sctx)
	n := &node.Node{Name: "n1", Kube: c.Interface, Cluster: view, Unavailable: map[string]string{}}
	guards := guardrails.Cluster{
		OptOut:    guardrails.NewOptOut(nw),
		Freshness: guardrails.NewFreshness(view, ""),
		Storm:     guardrails.NewStorm(c.Interface, guardrails.StormOptions{Namespace: deploytest.Namespace, Node: "n1"}),
		Budget:    guardrails.NewBudget(c.Interface, guardrails.BudgetOptions{Namespace: deploytest.Namespace, Slots: 3, TTL: time.Minute, Node: "n1", Prefix: "remediate-budget-e2e"}),
	}
	p, err := policy.Parse("e2e.yaml", []byte(e2ePolicy), remediate.Catalog{})
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	j, err := journal.Open(dir, 1<<20, 2)
	if err != nil {
		t.Fatal(err)
	}
	eng, err := remediate.New(p, remediate.Options{Node: n, StateDir: dir, Cluster: guards, Journal: j, Log: zaptest.NewLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	outcome := func(rep *remediate.Report, rule string) remediate.Decision {
		for _, d := range rep.Decisions {
			if d.Rule == rule {
				return d
			}
		}
		t.Fatalf("no decision for %s in %+v", rule, rep.Decisions)
		return remediate.Decision{}
	}
	generation.Add(1)
	rep, err := eng.Cycle(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if d := outcome(rep, "api"); d.Outcome != remediate.OutcomeExecuted {
		t.Fatalf("api rule with the apiserver up: %+v", d)
	}

	cp.StopAPIServer()
	waitFor(t, 60*time.Second, "view to notice the apiserver is gone", func() (bool, string) {
		f := view.Freshness()
		return !f.Connected, fmt.Sprintf("%+v", f)
	})
	before := localRuns.Load()
	generation.Add(1)
	rep, err = eng.Cycle(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if d := outcome(rep, "local"); d.Outcome != remediate.OutcomeExecuted || localRuns.Load() != before+1 {
		t.Errorf("node-local rule with the apiserver down: %+v", d)
	}
	d := outcome(rep, "api")
	if d.Outcome != remediate.OutcomeBlocked || d.Guardrail != "api-freshness" || !strings.Contains(d.Reason, "API server unreachable") {
		t.Errorf("disruptive rule with the apiserver down: %+v", d)
	}
	t.Logf("with the apiserver down: %s", d.Reason)

	cp.StartAPIServer()
	waitFor(t, 90*time.Second, "view to reconnect", func() (bool, string) {
		f := view.Freshness()
		return f.Connected && f.Synced, fmt.Sprintf("%+v", f)
	})
	generation.Add(1)
	rep, err = eng.Cycle(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if d := outcome(rep, "api"); d.Outcome != remediate.OutcomeExecuted {
		t.Errorf("disruptive rule after reconnect: %+v", d)
	}
	eng.Close(ctx)
}

// testOwnNodeFields: on its own Node the daemon may cordon with its own
// taint and annotation and set its condition, and nothing else: no label
// (node-restriction.kubernetes.io/* included), no other taint, annotation
// or condition (issue 13).
func testOwnNodeFields(t *testing.T, cp *controlplane.ControlPlane, n1 kubernetes.Interface) {
	ctx := context.Background()
	dry := metav1.UpdateOptions{DryRun: []string{metav1.DryRunAll}}
	edit := func(what string, change func(n *corev1.Node), wantDenied string) {
		t.Helper()
		n, err := n1.CoreV1().Nodes().Get(ctx, "n1", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		change(n)
		_, err = n1.CoreV1().Nodes().Update(ctx, n, dry)
		switch {
		case wantDenied == "" && err != nil:
			t.Errorf("%s: refused: %v", what, err)
		case wantDenied != "" && (err == nil || !strings.Contains(err.Error(), wantDenied)):
			t.Errorf("%s: %v, want denied with %q", what, err, wantDenied)
		}
	}
	edit("cordon with remediate's taint and annotation", func(n *corev1.Node) {
		n.Spec.Unschedulable = true
		n.Spec.Taints = append(n.Spec.Taints, corev1.Taint{Key: "remediate.dev/dataplane-unhealthy", Effect: corev1.TaintEffectNoSchedule})
		if n.Annotations == nil {
			n.Annotations = map[string]string{}
		}
		n.Annotations[kube.AnnotationCordonedBy] = `{"detector":"x"}`
	}, "")
	edit("node-restriction label", func(n *corev1.Node) {
		if n.Labels == nil {
			n.Labels = map[string]string{}
		}
		n.Labels["node-restriction.kubernetes.io/pool"] = "trusted"
	}, "may not change a Node's labels")
	edit("another taint", func(n *corev1.Node) {
		n.Spec.Taints = append(n.Spec.Taints, corev1.Taint{Key: "dedicated", Value: "x", Effect: corev1.TaintEffectNoSchedule})
	}, "only taints whose key starts with remediate.dev/")
	edit("another annotation", func(n *corev1.Node) {
		if n.Annotations == nil {
			n.Annotations = map[string]string{}
		}
		n.Annotations["node.alpha.kubernetes.io/ttl"] = "0"
	}, "only the remediate.dev/cordoned-by annotation")
	edit("pod CIDR", func(n *corev1.Node) { n.Spec.PodCIDR = "10.9.0.0/24" }, "only spec.unschedulable and its own taints")
	patch := func(cond string) error {
		body := fmt.Sprintf(`{"status":{"conditions":[{"type":%q,"status":"False","reason":"Forged","message":"x"}]}}`, cond)
		_, err := n1.CoreV1().Nodes().Patch(ctx, "n1", types.StrategicMergePatchType, []byte(body), metav1.PatchOptions{DryRun: []string{metav1.DryRunAll}}, "status")
		return err
	}
	if err := patch("Ready"); err == nil || !strings.Contains(err.Error(), "only the KubeProxyDataplaneHealthy condition") {
		t.Errorf("forging Ready: %v", err)
	}
	if err := patch("KubeProxyDataplaneHealthy"); err != nil {
		t.Errorf("setting its condition: %v", err)
	}
}

// testOwnNodeAttacks (issue 27, item 10): with a real pod-bound token of
// the ServiceAccount on n1, every write to its own Node beyond what the
// daemon does is refused by the admission policy (status addresses,
// allocatable and capacity, labels through nodes/status, a dangling
// ownerReference or a finalizer that would let the garbage collector or a
// stuck deletion take the Node, unschedulable without remediate's cordon
// record, uncordoning someone else's cordon), and every write the daemon
// makes, through its own code, still succeeds: kube.Cordon with its taint,
// kube.Uncordon, the KubeProxyDataplaneHealthy condition as the Reporter
// sets it, and its removal.
func testOwnNodeAttacks(t *testing.T, cp *controlplane.ControlPlane) {
	ctx := context.Background()
	cs := kubernetes.NewForConfigOrDie(deploytest.AsBoundPod(t, cp, deploytest.Namespace, "remediate", "n1"))
	dry := []string{metav1.DryRunAll}
	denied := func(what string, err error, want string) {
		t.Helper()
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: %v, want denied with %q", what, err, want)
		} else {
			t.Logf("%s: refused: %v", what, err)
		}
	}
	statusPatch := func(body string) error {
		_, err := cs.CoreV1().Nodes().Patch(ctx, "n1", types.StrategicMergePatchType, []byte(body), metav1.PatchOptions{DryRun: dry}, "status")
		return err
	}
	update := func(change func(n *corev1.Node)) error {
		n, err := cs.CoreV1().Nodes().Get(ctx, "n1", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		change(n)
		_, err = cs.CoreV1().Nodes().Update(ctx, n, metav1.UpdateOptions{DryRun: dry})
		return err
	}
	const statusMsg = "only the KubeProxyDataplaneHealthy condition of its Node's status"
	const metaMsg = "no metadata of its Node but the remediate.dev/cordoned-by annotation"
	const cordonMsg = "may set spec.unschedulable only with its remediate.dev/cordoned-by annotation"
	denied("status.addresses", statusPatch(`{"status":{"addresses":[{"type":"InternalIP","address":"10.66.6.6"}]}}`), statusMsg)
	denied("allocatable.pods=0", statusPatch(`{"status":{"allocatable":{"pods":"0"}}}`), statusMsg)
	denied("capacity.pods=0", statusPatch(`{"status":{"capacity":{"pods":"0"}}}`), statusMsg)
	denied("its condition together with addresses", statusPatch(
		`{"status":{"conditions":[{"type":"KubeProxyDataplaneHealthy","status":"True","reason":"x"}],"addresses":[{"type":"Hostname","address":"evil"}]}}`), statusMsg)
	denied("a label through nodes/status", statusPatch(`{"metadata":{"labels":{"node-restriction.kubernetes.io/pool":"trusted"}}}`), "may not change a Node's labels")
	denied("a dangling ownerReference", update(func(n *corev1.Node) {
		n.OwnerReferences = append(n.OwnerReferences, metav1.OwnerReference{APIVersion: "v1", Kind: "ConfigMap", Name: "gone", UID: "0b8c5f1e-0000-4000-8000-000000000027"})
	}), metaMsg)
	denied("a finalizer", update(func(n *corev1.Node) { n.Finalizers = append(n.Finalizers, "remediate.dev/hold") }), metaMsg)
	denied("unschedulable without the cordon record", update(func(n *corev1.Node) { n.Spec.Unschedulable = true }), cordonMsg)
	denied("the cordon record without unschedulable", update(func(n *corev1.Node) {
		if n.Annotations == nil {
			n.Annotations = map[string]string{}
		}
		n.Annotations[kube.AnnotationCordonedBy] = `{"detector":"x"}`
	}), cordonMsg)
	denied("providerID", update(func(n *corev1.Node) { n.Spec.ProviderID = "evil://n1" }), "only spec.unschedulable and its own taints")

	// Someone else's cordon is not remediate's to undo.
	n, err := cp.Client.CoreV1().Nodes().Get(ctx, "n1", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	n.Spec.Unschedulable = true
	if _, err := cp.Client.CoreV1().Nodes().Update(ctx, n, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	denied("uncordoning an operator's cordon", update(func(n *corev1.Node) { n.Spec.Unschedulable = false }), cordonMsg)
	denied("uncordoning an operator's cordon with a forged record", update(func(n *corev1.Node) {
		n.Spec.Unschedulable = false
		if n.Annotations == nil {
			n.Annotations = map[string]string{}
		}
		n.Annotations[kube.AnnotationCordonedBy] = `{"detector":"x"}`
	}), cordonMsg)
	if _, err := kube.Cordon(ctx, cs, "n1", kube.CordonRecord{Detector: "x"}); !errors.Is(err, kube.ErrCordonedByOther) {
		t.Errorf("kube.Cordon of an operator's cordon: %v, want ErrCordonedByOther", err)
	}
	n, err = cp.Client.CoreV1().Nodes().Get(ctx, "n1", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	n.Spec.Unschedulable = false
	if _, err := cp.Client.CoreV1().Nodes().Update(ctx, n, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}

	// What the daemon does, for real, through its own code.
	before, err := cp.Client.CoreV1().Nodes().Get(ctx, "n1", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	taint := &corev1.Taint{Key: "remediate.dev/dataplane-unhealthy", Effect: corev1.TaintEffectNoSchedule}
	if _, err := kube.Cordon(ctx, cs, "n1", kube.CordonRecord{Detector: "IPTablesRules", Target: "n1", Time: time.Now().UTC(), Taint: taint}); err != nil {
		t.Fatalf("kube.Cordon with its taint: %v", err)
	}
	n, err = cp.Client.CoreV1().Nodes().Get(ctx, "n1", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	hasTaint := func(n *corev1.Node) bool {
		for _, x := range n.Spec.Taints {
			if x.Key == taint.Key && x.Effect == taint.Effect {
				return true
			}
		}
		return false
	}
	if rec, ours := kube.CordonedBy(n); !n.Spec.Unschedulable || !ours || rec.Taint == nil || !hasTaint(n) || len(n.Spec.Taints) != len(before.Spec.Taints)+1 {
		t.Errorf("after kube.Cordon: unschedulable %v, record %+v (%v), taints %v", n.Spec.Unschedulable, rec, ours, n.Spec.Taints)
	}
	if changed, err := kube.Uncordon(ctx, cs, "n1"); err != nil || !changed {
		t.Fatalf("kube.Uncordon: %v (changed %v)", err, changed)
	}
	n, err = cp.Client.CoreV1().Nodes().Get(ctx, "n1", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if _, ours := kube.CordonedBy(n); n.Spec.Unschedulable || ours || hasTaint(n) || len(n.Spec.Taints) != len(before.Spec.Taints) {
		t.Errorf("after kube.Uncordon: unschedulable %v, record %v, taints %v", n.Spec.Unschedulable, ours, n.Spec.Taints)
	}
	rep := kubeexporter.New(cs, kubeexporter.Options{Node: "n1", Log: zaptest.NewLogger(t)})
	if err := rep.Report(ctx, &remediate.Report{Time: time.Now()}); err != nil {
		t.Fatalf("the Reporter's condition: %v", err)
	}
	n, err = cp.Client.CoreV1().Nodes().Get(ctx, "n1", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	patch := kube.RemoveConditionPatch(n, kubeexporter.DefaultConditionType)
	if patch == nil {
		t.Fatalf("the Reporter set no %s condition: %+v", kubeexporter.DefaultConditionType, n.Status.Conditions)
	}
	if _, err := cs.CoreV1().Nodes().PatchStatus(ctx, "n1", patch); err != nil {
		t.Errorf("removing its condition: %v", err)
	}
}

// testSubjectInAnotherNamespace: the deployment moved into another
// namespace by a kustomize overlay is still confined to its own node (the
// policy's subject used to name kube-system; issue 18).
func testSubjectInAnotherNamespace(t *testing.T, cp *controlplane.ControlPlane) {
	ctx := context.Background()
	crb := &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "remediate-ops"},
		RoleRef:  rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "ClusterRole", Name: "remediate"},
		Subjects: []rbacv1.Subject{{Kind: "ServiceAccount", Name: "remediate", Namespace: "ops"}}}
	if _, err := cp.Client.RbacV1().ClusterRoleBindings().Create(ctx, crb, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	defer cp.Client.RbacV1().ClusterRoleBindings().Delete(ctx, crb.Name, metav1.DeleteOptions{})
	cfg := rest.CopyConfig(cp.RestConfig)
	cfg.Impersonate = rest.ImpersonationConfig{UserName: "system:serviceaccount:ops:remediate",
		Groups: []string{"system:serviceaccounts", "system:serviceaccounts:ops", "system:authenticated"},
		Extra:  map[string][]string{deploytest.NodeKey: {"n1"}}}
	ops := kubernetes.NewForConfigOrDie(cfg)
	waitFor(t, 30*time.Second, "ops:remediate confined to n1", func() (bool, string) {
		_, err := kube.Cordon(ctx, ops, "n2", kube.CordonRecord{Detector: "x"})
		return err != nil && strings.Contains(err.Error(), "only update its own Node"), fmt.Sprint(err)
	})
}
