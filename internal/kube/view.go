package kube

import (
	"context"
	"fmt"
	"sort"
	"sync"
	"time"

	"go.uber.org/zap"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	"k8s.io/utils/clock"

	"github.com/remediate-dev/remediate/internal/cluster"
)

// serviceIndex indexes EndpointSlices by "namespace/service".
const serviceIndex = "service"

// View is the informer-backed cluster.View: Services and EndpointSlices
// watched through shared informers with resync disabled (one LIST at start,
// then only WATCH; relists happen only after a watch breaks), stripped by
// Transform to the fields the detectors use.
type View struct {
	log     *zap.Logger
	clock   clock.PassiveClock
	contact *Contact

	factory informers.SharedInformerFactory
	svc     cache.SharedIndexInformer
	eps     cache.SharedIndexInformer

	mu          sync.Mutex
	lastEvent   time.Time
	watchErr    error
	watchErrAt  time.Time
	gen         uint64 // bumped on every Service change
	snapGen     uint64
	snap        []cluster.Service
	snapIsValid bool
}

var _ cluster.View = (*View)(nil)

// NewView builds the view over cs. contact (may be nil) is the client's
// reachability tracker, used for Freshness.Connected. Call Start.
func NewView(cs kubernetes.Interface, contact *Contact, clk clock.PassiveClock, log *zap.Logger) (*View, error) {
	if clk == nil {
		clk = clock.RealClock{}
	}
	if log == nil {
		log = zap.NewNop()
	}
	v := &View{log: log, clock: clk, contact: contact}
	// Resync 0: no periodic re-delivery, and the reflector never re-LISTs
	// unless its watch fails.
	v.factory = informers.NewSharedInformerFactoryWithOptions(cs, 0, informers.WithTransform(Transform))
	v.svc = v.factory.Core().V1().Services().Informer()
	v.eps = v.factory.Discovery().V1().EndpointSlices().Informer()
	if err := v.eps.AddIndexers(cache.Indexers{serviceIndex: sliceServiceKey}); err != nil {
		return nil, fmt.Errorf("endpointslice indexer: %w", err)
	}
	for name, inf := range map[string]cache.SharedIndexInformer{"services": v.svc, "endpointslices": v.eps} {
		name := name
		if err := inf.SetWatchErrorHandlerWithContext(func(ctx context.Context, r *cache.Reflector, err error) {
			v.recordWatchError(name, err)
			cache.DefaultWatchErrorHandler(ctx, r, err)
		}); err != nil {
			return nil, fmt.Errorf("%s watch error handler: %w", name, err)
		}
	}
	svcChanged := func(any) { v.touch(true) }
	if _, err := v.svc.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: svcChanged, UpdateFunc: func(_, _ any) { v.touch(true) }, DeleteFunc: svcChanged,
	}); err != nil {
		return nil, err
	}
	epsChanged := func(any) { v.touch(false) }
	if _, err := v.eps.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: epsChanged, UpdateFunc: func(_, _ any) { v.touch(false) }, DeleteFunc: epsChanged,
	}); err != nil {
		return nil, err
	}
	return v, nil
}

// Start runs the informers until ctx ends. It does not wait for sync.
func (v *View) Start(ctx context.Context) {
	v.factory.Start(ctx.Done())
	go func() {
		<-ctx.Done()
		v.factory.Shutdown()
	}()
}

// WaitForSync blocks until the initial LIST of both informers completed or
// ctx ends; it returns whether the view is synced.
func (v *View) WaitForSync(ctx context.Context) bool {
	return cache.WaitForCacheSync(ctx.Done(), v.svc.HasSynced, v.eps.HasSynced)
}

func (v *View) touch(svc bool) {
	now := v.clock.Now()
	v.mu.Lock()
	v.lastEvent = now
	if svc {
		v.gen++
	}
	v.mu.Unlock()
}

func (v *View) recordWatchError(informer string, err error) {
	now := v.clock.Now()
	v.mu.Lock()
	v.watchErr = fmt.Errorf("%s watch: %w", informer, err)
	v.watchErrAt = now
	v.mu.Unlock()
	v.log.Warn("cluster view watch failed", zap.String("informer", informer), zap.Error(err))
}

// Freshness implements cluster.View. Connected is false while the last
// watch error is newer than the last successful request to the apiserver.
func (v *View) Freshness() cluster.Freshness {
	v.mu.Lock()
	f := cluster.Freshness{
		Synced:        v.svc.HasSynced() && v.eps.HasSynced(),
		LastEvent:     v.lastEvent,
		LastError:     v.watchErr,
		LastErrorTime: v.watchErrAt,
	}
	v.mu.Unlock()
	f.Connected = true
	if v.contact != nil {
		ok, err, errAt := v.contact.Snapshot()
		if err != nil && errAt.After(f.LastErrorTime) {
			f.LastError, f.LastErrorTime = err, errAt
		}
		// The contact tracker uses wall time; so does a real clock.
		f.Connected = !ok.IsZero() && !ok.Before(f.LastErrorTime)
	} else if f.LastError != nil {
		f.Connected = false
	}
	return f
}

// Services implements cluster.View. The snapshot is rebuilt only after a
// Service changed; callers must not modify it.
func (v *View) Services() []cluster.Service {
	v.mu.Lock()
	if v.snapIsValid && v.snapGen == v.gen {
		s := v.snap
		v.mu.Unlock()
		return s
	}
	gen := v.gen
	v.mu.Unlock()

	objs := v.svc.GetStore().List()
	out := make([]cluster.Service, 0, len(objs))
	for _, o := range objs {
		if s, ok := o.(*corev1.Service); ok {
			out = append(out, toService(s))
		}
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Namespace != out[j].Namespace {
			return out[i].Namespace < out[j].Namespace
		}
		return out[i].Name < out[j].Name
	})
	v.mu.Lock()
	v.snap, v.snapGen, v.snapIsValid = out, gen, true
	v.mu.Unlock()
	return out
}

// Endpoints implements cluster.View: all slices of the Service merged, one
// Endpoint per address and port, duplicates across slices (seen while a
// slice is being replaced) collapsed with the most-ready condition kept.
func (v *View) Endpoints(namespace, name string) []cluster.Endpoint {
	objs, err := v.eps.GetIndexer().ByIndex(serviceIndex, namespace+"/"+name)
	if err != nil {
		return nil
	}
	slices := make([]*discoveryv1.EndpointSlice, 0, len(objs))
	for _, o := range objs {
		if s, ok := o.(*discoveryv1.EndpointSlice); ok {
			slices = append(slices, s)
		}
	}
	return MergeSlices(slices)
}

// MergeSlices flattens EndpointSlices into Endpoints, sorted by address,
// port name and port, deduplicated.
func MergeSlices(slices []*discoveryv1.EndpointSlice) []cluster.Endpoint {
	type key struct {
		addr, portName, proto string
		port                  int32
	}
	idx := map[key]int{}
	var out []cluster.Endpoint
	for _, s := range slices {
		for _, ep := range s.Endpoints {
			ready := ep.Conditions.Ready == nil || *ep.Conditions.Ready
			serving := ready
			if ep.Conditions.Serving != nil {
				serving = *ep.Conditions.Serving
			}
			terminating := ep.Conditions.Terminating != nil && *ep.Conditions.Terminating
			node := ""
			if ep.NodeName != nil {
				node = *ep.NodeName
			}
			for _, addr := range ep.Addresses {
				for _, p := range s.Ports {
					if p.Port == nil {
						continue
					}
					proto := string(corev1.ProtocolTCP)
					if p.Protocol != nil {
						proto = string(*p.Protocol)
					}
					pn := ""
					if p.Name != nil {
						pn = *p.Name
					}
					e := cluster.Endpoint{Address: addr, Port: *p.Port, Protocol: proto, PortName: pn, NodeName: node,
						Ready: ready, Serving: serving, Terminating: terminating}
					k := key{addr, pn, proto, *p.Port}
					if i, dup := idx[k]; dup {
						if rank(e) > rank(out[i]) {
							out[i] = e
						}
						continue
					}
					idx[k] = len(out)
					out = append(out, e)
				}
			}
		}
	}
	sort.Slice(out, func(i, j int) bool {
		a, b := out[i], out[j]
		if a.Address != b.Address {
			return a.Address < b.Address
		}
		if a.PortName != b.PortName {
			return a.PortName < b.PortName
		}
		if a.Port != b.Port {
			return a.Port < b.Port
		}
		return a.Protocol < b.Protocol
	})
	return out
}

func rank(e cluster.Endpoint) int {
	r := 0
	if e.Ready {
		r += 4
	}
	if e.Serving {
		r += 2
	}
	if !e.Terminating {
		r++
	}
	return r
}

func toService(s *corev1.Service) cluster.Service {
	out := cluster.Service{Namespace: s.Namespace, Name: s.Name, ExternalIPs: s.Spec.ExternalIPs}
	for _, ip := range s.Spec.ClusterIPs {
		if ip != "" && ip != corev1.ClusterIPNone {
			out.ClusterIPs = append(out.ClusterIPs, ip)
		}
	}
	for _, in := range s.Status.LoadBalancer.Ingress {
		if in.IP != "" {
			out.LoadBalancerIPs = append(out.LoadBalancerIPs, in.IP)
		}
	}
	out.Ports = make([]cluster.ServicePort, 0, len(s.Spec.Ports))
	for _, p := range s.Spec.Ports {
		proto := string(p.Protocol)
		if proto == "" {
			proto = string(corev1.ProtocolTCP)
		}
		out.Ports = append(out.Ports, cluster.ServicePort{Name: p.Name, Protocol: proto, Port: p.Port, NodePort: p.NodePort})
	}
	return out
}

func sliceServiceKey(obj any) ([]string, error) {
	s, ok := obj.(*discoveryv1.EndpointSlice)
	if !ok {
		return nil, nil
	}
	svc := s.Labels[discoveryv1.LabelServiceName]
	if svc == "" {
		return nil, nil
	}
	return []string{s.Namespace + "/" + svc}, nil
}

// Transform is the informers' cache.TransformFunc: it replaces each Service
// and EndpointSlice by a fresh object holding only what the view uses, so
// the decoded original (managedFields, annotations, labels, status, hints,
// target references) is garbage. Other objects pass unchanged. It is
// idempotent.
func Transform(obj any) (any, error) {
	switch o := obj.(type) {
	case *corev1.Service:
		return stripService(o), nil
	case *discoveryv1.EndpointSlice:
		return stripSlice(o), nil
	default:
		return obj, nil
	}
}

func minimalMeta(m metav1.ObjectMeta) metav1.ObjectMeta {
	return metav1.ObjectMeta{Name: m.Name, Namespace: m.Namespace, UID: m.UID, ResourceVersion: m.ResourceVersion}
}

func stripService(s *corev1.Service) *corev1.Service {
	out := &corev1.Service{ObjectMeta: minimalMeta(s.ObjectMeta)}
	out.Spec.Type = s.Spec.Type
	out.Spec.ClusterIPs = s.Spec.ClusterIPs
	if len(out.Spec.ClusterIPs) == 0 && s.Spec.ClusterIP != "" {
		out.Spec.ClusterIPs = []string{s.Spec.ClusterIP}
	}
	out.Spec.ExternalIPs = s.Spec.ExternalIPs
	if len(s.Spec.Ports) > 0 {
		out.Spec.Ports = make([]corev1.ServicePort, len(s.Spec.Ports))
		for i, p := range s.Spec.Ports {
			out.Spec.Ports[i] = corev1.ServicePort{Name: p.Name, Protocol: p.Protocol, Port: p.Port, NodePort: p.NodePort}
		}
	}
	for _, in := range s.Status.LoadBalancer.Ingress {
		if in.IP != "" {
			out.Status.LoadBalancer.Ingress = append(out.Status.LoadBalancer.Ingress, corev1.LoadBalancerIngress{IP: in.IP})
		}
	}
	return out
}

func stripSlice(s *discoveryv1.EndpointSlice) *discoveryv1.EndpointSlice {
	out := &discoveryv1.EndpointSlice{ObjectMeta: minimalMeta(s.ObjectMeta), AddressType: s.AddressType}
	if svc := s.Labels[discoveryv1.LabelServiceName]; svc != "" {
		out.Labels = map[string]string{discoveryv1.LabelServiceName: svc}
	}
	out.Ports = s.Ports
	if len(s.Endpoints) > 0 {
		out.Endpoints = make([]discoveryv1.Endpoint, len(s.Endpoints))
		for i, e := range s.Endpoints {
			out.Endpoints[i] = discoveryv1.Endpoint{Addresses: e.Addresses, Conditions: e.Conditions, NodeName: e.NodeName}
		}
	}
	return out
}
