package kube

import (
	"context"
	"fmt"
	"sort"
	"sync"
	"time"

	"go.uber.org/zap"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"

	"github.com/remediate-dev/remediate/internal/clip"
	"github.com/remediate-dev/remediate/internal/cluster"
)

// PodWatch is the cluster.PodView of the pods bound to one node: a watch
// with the field selector spec.nodeName=<node> (what the kubelet itself
// watches; never a cluster-wide list), resync disabled, each Pod stripped
// by its transform to a compact cluster.Pod.
type PodWatch struct {
	node    string
	log     *zap.Logger
	contact *Contact
	factory informers.SharedInformerFactory
	inf     cache.SharedIndexInformer

	mu         sync.Mutex
	lastEvent  time.Time
	watchErr   error
	watchErrAt time.Time
}

var _ cluster.PodView = (*PodWatch)(nil)

// maxWaitingMessage bounds the kubelet's waiting message kept per
// container (CNI errors can be long).
const maxWaitingMessage = 512

// NewPodWatch builds the watch of node's pods. contact (may be nil) is the
// client's reachability tracker. Call Start.
func NewPodWatch(cs kubernetes.Interface, node string, contact *Contact, log *zap.Logger) (*PodWatch, error) {
	if log == nil {
		log = zap.NewNop()
	}
	w := &PodWatch{node: node, log: log, contact: contact}
	w.factory = informers.NewSharedInformerFactoryWithOptions(cs, 0,
		informers.WithTweakListOptions(func(o *metav1.ListOptions) {
			o.FieldSelector = fields.OneTermEqualSelector("spec.nodeName", node).String()
		}),
		informers.WithTransform(TransformPod))
	w.inf = w.factory.Core().V1().Pods().Informer()
	if err := w.inf.SetWatchErrorHandlerWithContext(func(ctx context.Context, r *cache.Reflector, err error) {
		now := time.Now()
		w.mu.Lock()
		w.watchErr, w.watchErrAt = fmt.Errorf("pods watch: %w", err), now
		w.mu.Unlock()
		w.log.Debug("node pod watch failed", zap.Error(err))
		cache.DefaultWatchErrorHandler(ctx, r, err)
	}); err != nil {
		return nil, fmt.Errorf("pods watch error handler: %w", err)
	}
	touch := func() {
		now := time.Now()
		w.mu.Lock()
		w.lastEvent = now
		w.mu.Unlock()
	}
	if _, err := w.inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: func(any) { touch() }, UpdateFunc: func(_, _ any) { touch() }, DeleteFunc: func(any) { touch() },
	}); err != nil {
		return nil, err
	}
	return w, nil
}

// Start runs the watch until ctx ends. It does not wait for sync.
func (w *PodWatch) Start(ctx context.Context) {
	w.factory.Start(ctx.Done())
	go func() {
		<-ctx.Done()
		w.factory.Shutdown()
	}()
}

// WaitForSync waits for the initial list.
func (w *PodWatch) WaitForSync(ctx context.Context) bool {
	return cache.WaitForCacheSync(ctx.Done(), w.inf.HasSynced)
}

// NodePods implements cluster.PodView.
func (w *PodWatch) NodePods() []cluster.Pod {
	objs := w.inf.GetStore().List()
	out := make([]cluster.Pod, 0, len(objs))
	for _, o := range objs {
		if p, ok := o.(*compactPod); ok && p.pod.Namespace != "" {
			out = append(out, p.pod)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Key() < out[j].Key() })
	return out
}

// Freshness implements cluster.PodView, as View.Freshness does.
func (w *PodWatch) Freshness() cluster.Freshness {
	w.mu.Lock()
	f := cluster.Freshness{Synced: w.inf.HasSynced(), LastEvent: w.lastEvent, LastError: w.watchErr, LastErrorTime: w.watchErrAt}
	w.mu.Unlock()
	f.Connected = f.LastError == nil
	if w.contact != nil {
		st := w.contact.Snapshot()
		f.Connected = !st.LastOK.IsZero() && !st.LastOK.Before(f.LastErrorTime)
	}
	return f
}

// String names the watch.
func (w *PodWatch) String() string { return "pod watch spec.nodeName=" + w.node }

// compactPod is the store's record of a Pod (see compact.go).
type compactPod struct {
	objMeta
	pod cluster.Pod
}

// GetObjectMeta implements metav1.ObjectMetaAccessor (store keys).
func (c *compactPod) GetObjectMeta() metav1.Object { return c.objectMeta() }

// GetObjectKind implements runtime.Object.
func (c *compactPod) GetObjectKind() schema.ObjectKind { return schema.EmptyObjectKind }

// DeepCopyObject implements runtime.Object; records are immutable.
func (c *compactPod) DeepCopyObject() runtime.Object { cp := *c; return &cp }

// TransformPod is the pod watch's cache.TransformFunc: a Pod becomes a
// compact record (ToPod); other objects pass unchanged.
func TransformPod(obj any) (any, error) {
	p, ok := obj.(*corev1.Pod)
	if !ok {
		return obj, nil
	}
	return &compactPod{objMeta: meta(&p.ObjectMeta), pod: ToPod(p)}, nil
}

// ToPod keeps what cluster.Pod holds of a Pod.
func ToPod(p *corev1.Pod) cluster.Pod {
	out := cluster.Pod{Namespace: intern(p.Namespace), Name: p.Name, UID: string(p.UID), Created: p.CreationTimestamp.Time,
		Terminating: p.DeletionTimestamp != nil, HostNetwork: p.Spec.HostNetwork, Phase: intern(string(p.Status.Phase))}
	if len(p.Labels) > 0 {
		out.Labels = make(map[string]string, len(p.Labels))
		for k, v := range p.Labels {
			out.Labels[intern(k)] = intern(v)
		}
	}
	if c := metav1.GetControllerOf(p); c != nil {
		out.ControllerKind, out.ControllerName = intern(c.Kind), intern(c.Name)
	}
	// The kubelet's mirror of a static pod.
	if m := p.Annotations[cluster.MirrorAnnotation]; m != "" && len(m) <= 64 {
		out.MirrorOf = m
	}
	for _, c := range p.Status.Conditions {
		cond := cluster.Condition{Status: intern(string(c.Status)), Since: c.LastTransitionTime.Time}
		switch c.Type {
		case corev1.PodReadyToStartContainers:
			out.SandboxReady = cond
		case corev1.PodReady:
			out.Ready = cond
		case corev1.PodScheduled:
			out.Scheduled = cond
		}
	}
	add := func(sts []corev1.ContainerStatus, init bool) {
		for _, s := range sts {
			c := cluster.ContainerStatus{Name: s.Name, Init: init, Ready: s.Ready, RestartCount: s.RestartCount}
			if w := s.State.Waiting; w != nil {
				c.WaitingReason = intern(w.Reason)
				c.WaitingMessage = clip.String(w.Message, maxWaitingMessage)
			}
			if t := s.LastTerminationState.Terminated; t != nil {
				c.LastTerminatedReason = intern(t.Reason)
				c.LastTerminatedExitCode = t.ExitCode
				c.LastTerminatedAt = t.FinishedAt.Time
			}
			out.Containers = append(out.Containers, c)
		}
	}
	add(p.Status.InitContainerStatuses, true)
	add(p.Status.ContainerStatuses, false)
	for _, ip := range p.Status.PodIPs {
		if ip.IP != "" {
			out.IPs = append(out.IPs, ip.IP)
		}
	}
	if len(out.IPs) == 0 && p.Status.PodIP != "" {
		out.IPs = []string{p.Status.PodIP}
	}
	for _, c := range p.Spec.Containers {
		for _, cp := range c.Ports {
			if cp.HostPort == 0 {
				continue
			}
			proto := string(cp.Protocol)
			if proto == "" {
				proto = string(corev1.ProtocolTCP)
			}
			out.HostPorts = append(out.HostPorts, cluster.HostPort{Container: intern(c.Name), HostPort: cp.HostPort,
				ContainerPort: cp.ContainerPort, Protocol: intern(proto), HostIP: cp.HostIP})
		}
	}
	return out
}
