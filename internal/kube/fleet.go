package kube

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
)

// Fleet controls. FleetConfigMap (in the daemon's namespace) pauses every
// daemon when its PauseKey is set:
//
//	kubectl -n kube-system create configmap remediate-fleet --from-literal=pause="upgrading to 1.35"
//	kubectl -n kube-system delete configmap remediate-fleet      # resume
const (
	FleetConfigMap = "remediate-fleet"
	PauseKey       = "pause"
)

// Paused says whether cm pauses the fleet and why: PauseKey present with
// a value other than "" or "false" (any case); the value is the reason.
func Paused(cm *corev1.ConfigMap) (bool, string) {
	if cm == nil {
		return false, ""
	}
	v, ok := cm.Data[PauseKey]
	v = strings.TrimSpace(v)
	if !ok || v == "" || strings.EqualFold(v, "false") {
		return false, ""
	}
	if len(v) > 200 {
		v = v[:200] + "..."
	}
	return true, v
}

// RollingOut says whether ds is in the middle of a rollout, with kubectl
// rollout status's rules: the controller has not observed the latest spec,
// or not every scheduled pod is updated, or not every one is available.
func RollingOut(ds *appsv1.DaemonSet) (bool, string) {
	if ds == nil {
		return false, ""
	}
	st := ds.Status
	switch {
	case ds.Generation > st.ObservedGeneration:
		return true, fmt.Sprintf("DaemonSet %s/%s: generation %d not yet observed (at %d)", ds.Namespace, ds.Name, ds.Generation, st.ObservedGeneration)
	case st.UpdatedNumberScheduled < st.DesiredNumberScheduled:
		return true, fmt.Sprintf("DaemonSet %s/%s rolling out: %d of %d pods updated", ds.Namespace, ds.Name, st.UpdatedNumberScheduled, st.DesiredNumberScheduled)
	case st.NumberAvailable < st.DesiredNumberScheduled:
		return true, fmt.Sprintf("DaemonSet %s/%s rolling out: %d of %d pods available", ds.Namespace, ds.Name, st.NumberAvailable, st.DesiredNumberScheduled)
	}
	return false, ""
}

// OneWatch keeps one named object current through a watch restricted to
// its name (list/watch with a metadata.name field selector, which RBAC
// resourceNames can grant). Absent and not-yet-listed are told apart.
type OneWatch[T any] struct {
	ns, name string
	factory  informers.SharedInformerFactory
	inf      cache.SharedIndexInformer
}

func oneFactory(cs kubernetes.Interface, ns, name string) informers.SharedInformerFactory {
	return informers.NewSharedInformerFactoryWithOptions(cs, 0, informers.WithNamespace(ns),
		informers.WithTweakListOptions(func(o *metav1.ListOptions) {
			o.FieldSelector = fields.OneTermEqualSelector("metadata.name", name).String()
		}))
}

// NewFleetPauseWatch watches FleetConfigMap in namespace ns.
func NewFleetPauseWatch(cs kubernetes.Interface, ns string) *OneWatch[corev1.ConfigMap] {
	f := oneFactory(cs, ns, FleetConfigMap)
	return &OneWatch[corev1.ConfigMap]{ns: ns, name: FleetConfigMap, factory: f, inf: f.Core().V1().ConfigMaps().Informer()}
}

// NewDaemonSetWatch watches DaemonSet ns/name (kube-proxy's).
func NewDaemonSetWatch(cs kubernetes.Interface, ns, name string) *OneWatch[appsv1.DaemonSet] {
	f := oneFactory(cs, ns, name)
	return &OneWatch[appsv1.DaemonSet]{ns: ns, name: name, factory: f, inf: f.Apps().V1().DaemonSets().Informer()}
}

// Start runs the watch until ctx ends.
func (w *OneWatch[T]) Start(ctx context.Context) {
	w.factory.Start(ctx.Done())
	go func() {
		<-ctx.Done()
		w.factory.Shutdown()
	}()
}

// WaitForSync waits for the initial list.
func (w *OneWatch[T]) WaitForSync(ctx context.Context) bool {
	return cache.WaitForCacheSync(ctx.Done(), w.inf.HasSynced)
}

// Get returns the object (nil when it does not exist) and whether the
// watch has listed at least once (false: unknown).
func (w *OneWatch[T]) Get() (*T, bool) {
	if !w.inf.HasSynced() {
		return nil, false
	}
	o, ok, err := w.inf.GetStore().GetByKey(w.ns + "/" + w.name)
	if err != nil || !ok {
		return nil, true
	}
	t, _ := o.(*T)
	return t, true
}

// String names the watch.
func (w *OneWatch[T]) String() string { return fmt.Sprintf("watch %s/%s", w.ns, w.name) }

// CleanupNode removes what remediate put on Node name: the condition
// conditionType, and, when remediate cordoned the node, its cordon, taint
// and annotation (Uncordon; a node someone else cordoned is left alone).
// It returns what it removed.
func CleanupNode(ctx context.Context, cs kubernetes.Interface, name, conditionType string) ([]string, error) {
	var did []string
	uncordoned, err := Uncordon(ctx, cs, name)
	if err != nil {
		return did, fmt.Errorf("uncordon %s: %w", name, err)
	}
	if uncordoned {
		did = append(did, "cordon")
	}
	n, err := cs.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return did, fmt.Errorf("get node %s: %w", name, err)
	}
	if patch := RemoveConditionPatch(n, conditionType); patch != nil {
		if _, err := cs.CoreV1().Nodes().PatchStatus(ctx, name, patch); err != nil {
			return did, fmt.Errorf("remove condition %s from %s: %w", conditionType, name, err)
		}
		did = append(did, "condition "+conditionType)
	}
	return did, nil
}

// RemoveConditionPatch returns the strategic merge patch of nodes/status
// deleting condition typ, or nil when n does not carry it.
func RemoveConditionPatch(n *corev1.Node, typ string) []byte {
	for _, c := range n.Status.Conditions {
		if string(c.Type) == typ {
			b, _ := json.Marshal(map[string]any{"status": map[string]any{"conditions": []map[string]any{{"type": typ, "$patch": "delete"}}}})
			return b
		}
	}
	return nil
}

// Cleanup runs CleanupNode on node (or on every node when node is "") and
// returns, per node, what was removed. It goes on after a node's error
// and returns the first.
func Cleanup(ctx context.Context, cs kubernetes.Interface, node, conditionType string) (map[string][]string, error) {
	names := []string{node}
	if node == "" {
		names = nil
		l, err := cs.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
		if err != nil {
			return nil, fmt.Errorf("list nodes: %w", err)
		}
		for _, n := range l.Items {
			names = append(names, n.Name)
		}
	}
	out := map[string][]string{}
	var first error
	for _, n := range names {
		did, err := CleanupNode(ctx, cs, n, conditionType)
		if len(did) > 0 {
			out[n] = did
		}
		if err != nil && first == nil {
			first = err
		}
	}
	return out, first
}

// OwnLeasePrefixes are the names of the Leases the daemons write in their
// namespace: the cluster budget's slots and each node's storm status. An
// uninstall deletes them (CleanupLeases); no other Lease is touched.
var OwnLeasePrefixes = []string{"remediate-budget-", "remediate-node-"}

// CleanupLeases deletes, in namespace, the Leases whose names start with one
// of OwnLeasePrefixes and returns their names. It goes on after a Lease's
// error and returns the first; a Lease already gone is not an error.
func CleanupLeases(ctx context.Context, cs kubernetes.Interface, namespace string) ([]string, error) {
	l, err := cs.CoordinationV1().Leases(namespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, fmt.Errorf("list leases in %s: %w", namespace, err)
	}
	var did []string
	var first error
	for _, lease := range l.Items {
		own := false
		for _, p := range OwnLeasePrefixes {
			own = own || strings.HasPrefix(lease.Name, p)
		}
		if !own {
			continue
		}
		err := cs.CoordinationV1().Leases(namespace).Delete(ctx, lease.Name, metav1.DeleteOptions{})
		switch {
		case err == nil:
			did = append(did, lease.Name)
		case apierrors.IsNotFound(err):
		default:
			if first == nil {
				first = fmt.Errorf("delete lease %s/%s: %w", namespace, lease.Name, err)
			}
		}
	}
	return did, first
}
