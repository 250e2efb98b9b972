package kube

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
)

// NodeWatch keeps this node's Node object (labels, annotations,
// unschedulable, taints, and the kubelet's addresses and port for
// KubeletPodStartup's scrape) current through a watch restricted to its
// name.
// The opt-out guardrail reads it; it keeps the last known state while the
// API is unreachable.
type NodeWatch struct {
	name    string
	factory informers.SharedInformerFactory
	inf     cache.SharedIndexInformer
}

// NewNodeWatch builds the watch for node name. Call Start.
func NewNodeWatch(cs kubernetes.Interface, name string) *NodeWatch {
	f := informers.NewSharedInformerFactoryWithOptions(cs, 0,
		informers.WithTweakListOptions(func(o *metav1.ListOptions) {
			o.FieldSelector = fields.OneTermEqualSelector("metadata.name", name).String()
		}),
		informers.WithTransform(func(obj any) (any, error) {
			n, ok := obj.(*corev1.Node)
			if !ok {
				return obj, nil
			}
			var addrs []corev1.NodeAddress
			for _, a := range n.Status.Addresses {
				if a.Type == corev1.NodeInternalIP || a.Type == corev1.NodeExternalIP {
					addrs = append(addrs, a)
				}
			}
			return &corev1.Node{
				ObjectMeta: metav1.ObjectMeta{Name: n.Name, UID: n.UID, ResourceVersion: n.ResourceVersion,
					Labels: n.Labels, Annotations: n.Annotations},
				Spec:   corev1.NodeSpec{Unschedulable: n.Spec.Unschedulable, Taints: n.Spec.Taints},
				Status: corev1.NodeStatus{Addresses: addrs, DaemonEndpoints: n.Status.DaemonEndpoints},
			}, nil
		}))
	return &NodeWatch{name: name, factory: f, inf: f.Core().V1().Nodes().Informer()}
}

// Start runs the watch until ctx ends.
func (w *NodeWatch) Start(ctx context.Context) {
	w.factory.Start(ctx.Done())
	go func() {
		<-ctx.Done()
		w.factory.Shutdown()
	}()
}

// WaitForSync waits for the initial list.
func (w *NodeWatch) WaitForSync(ctx context.Context) bool {
	return cache.WaitForCacheSync(ctx.Done(), w.inf.HasSynced)
}

// Node returns the last known (stripped) Node and whether it is known.
func (w *NodeWatch) Node() (*corev1.Node, bool) {
	if !w.inf.HasSynced() {
		return nil, false
	}
	o, ok, err := w.inf.GetStore().GetByKey(w.name)
	if err != nil || !ok {
		return nil, false
	}
	n, ok := o.(*corev1.Node)
	return n, ok
}

// String names the watch.
func (w *NodeWatch) String() string { return fmt.Sprintf("node watch %s", w.name) }
