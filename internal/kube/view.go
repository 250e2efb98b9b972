package kube

import (
	"context"
	"fmt"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sort"
	"sync"
	"time"

	"go.uber.org/zap"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
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
	allGen      uint64 // bumped on every Service or EndpointSlice change
	snapGen     uint64
	snap        []cluster.Service
	snapIsValid bool
	// versions is each Service's version (cluster.ServiceVersions): the
	// allGen of its last Service or EndpointSlice event. A Service's
	// entry goes with the Service's deletion; slices left without their
	// Service keep theirs until they go too.
	versions map[serviceKey]uint64

	limits   ViewLimits
	budget   *budget
	warnOnce sync.Once
}

var (
	_ cluster.View            = (*View)(nil)
	_ cluster.SliceTimes      = (*View)(nil)
	_ cluster.ServiceVersions = (*View)(nil)
)

// serviceKey names a Service in View.versions.
type serviceKey struct{ namespace, name string }

// serviceOf returns the Service an informer object belongs to (a Service
// itself, or an EndpointSlice's Service), deletion tombstones included.
func serviceOf(obj any) (serviceKey, bool) {
	if t, isTomb := obj.(cache.DeletedFinalStateUnknown); isTomb {
		obj = t.Obj
	}
	switch c := obj.(type) {
	case *compactService:
		return serviceKey{c.namespace, c.name}, true
	case *compactSlice:
		if c.service != "" {
			return serviceKey{c.namespace, c.service}, true
		}
	}
	return serviceKey{}, false
}

// KubeProxyLabelSelector is the selector kube-proxy's informers use
// (cmd/kube-proxy/app/server.go): objects of an alternative service proxy
// and headless Services' EndpointSlices are ignored.
const KubeProxyLabelSelector = "!service.kubernetes.io/service-proxy-name,!service.kubernetes.io/headless"

// NewView builds the view over cs. contact (may be nil) is the client's
// reachability tracker, used for Freshness.Connected. Call Start.
func NewView(cs kubernetes.Interface, contact *Contact, clk clock.PassiveClock, log *zap.Logger) (*View, error) {
	return NewLimitedView(cs, contact, clk, log, ViewLimits{})
}

// NewLimitedView is NewView with a memory budget and a maximum age (zero
// values: the defaults).
func NewLimitedView(cs kubernetes.Interface, contact *Contact, clk clock.PassiveClock, log *zap.Logger, limits ViewLimits) (*View, error) {
	if clk == nil {
		clk = clock.RealClock{}
	}
	if log == nil {
		log = zap.NewNop()
	}
	if limits.MaxAge == 0 {
		limits.MaxAge = DefaultMaxViewAge
	}
	v := &View{log: log, clock: clk, contact: contact, limits: limits, budget: newBudget(limits), versions: map[serviceKey]uint64{}}
	// Resync 0: no periodic re-delivery, and the reflector never re-LISTs
	// unless its watch fails.
	// The same label selector as kube-proxy's own informers: Services
	// handled by another proxy and headless slices are not programmed by
	// kube-proxy, so they are not part of the desired state.
	v.factory = informers.NewSharedInformerFactoryWithOptions(cs, 0, informers.WithTransform(v.transform))
	v.svc = v.factory.InformerFor(&corev1.Service{}, v.newInformer(&corev1.Service{},
		func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
			return cs.CoreV1().Services("").List(ctx, o)
		},
		func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			return cs.CoreV1().Services("").Watch(ctx, o)
		}))
	v.eps = v.factory.InformerFor(&discoveryv1.EndpointSlice{}, v.newInformer(&discoveryv1.EndpointSlice{},
		func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
			return cs.DiscoveryV1().EndpointSlices("").List(ctx, o)
		},
		func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			return cs.DiscoveryV1().EndpointSlices("").Watch(ctx, o)
		}))
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
	// The handlers run after the informer's store changed: a version
	// read before the handler ran is the old one, and what was derived
	// under it is derived again once it moves.
	if _, err := v.svc.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(o any) { v.touch(true, o) },
		UpdateFunc: func(_, o any) { v.touch(true, o) },
		DeleteFunc: func(o any) { v.forget(o); v.touch(true, o); v.dropVersion(o) },
	}); err != nil {
		return nil, err
	}
	if _, err := v.eps.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: func(o any) { v.touch(false, o) },
		// A slice moved to another Service changes both.
		UpdateFunc: func(old, o any) { v.touch(false, old, o) },
		DeleteFunc: func(o any) { v.forget(o); v.touch(false, o) },
	}); err != nil {
		return nil, err
	}
	return v, nil
}

// ListPageSize is how many objects one request of the view's LIST asks
// for: at the EndpointSlice controller's default of 100 endpoints a slice,
// a page decodes to a few MB (at most ~65 MB for slices of the API's
// maximum, 1,000 endpoints).
const ListPageSize = 100

type (
	listFunc  func(context.Context, metav1.ListOptions) (runtime.Object, error)
	watchFunc func(context.Context, metav1.ListOptions) (watch.Interface, error)
)

// newInformer builds an informer of the view over list and watch, with
// kube-proxy's label selector and the LIST made by pagedList.
func (v *View) newInformer(obj runtime.Object, list listFunc, w watchFunc) func(kubernetes.Interface, time.Duration) cache.SharedIndexInformer {
	return func(_ kubernetes.Interface, resync time.Duration) cache.SharedIndexInformer {
		lw := &cache.ListWatch{
			ListWithContextFunc: v.pagedList(func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
				o.LabelSelector = KubeProxyLabelSelector
				return list(ctx, o)
			}),
			WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
				o.LabelSelector = KubeProxyLabelSelector
				return w(ctx, o)
			},
		}
		return cache.NewSharedIndexInformer(lw, obj, resync, cache.Indexers{cache.NamespaceIndex: cache.MetaNamespaceIndexFunc})
	}
}

// pagedList is the informers' LIST: the reflector's LIST (its fallback
// when the apiserver refuses the streaming list, and its relist after a
// watch broke) made in pages of ListPageSize, each page transformed (and
// admitted by the budget) before the next is asked for, so at most one
// page of decoded API objects is alive at a time; the reflector gets the
// compact records (transform passes them through).
//
// Without it, client-go's reflector decodes the whole list before the
// transform sees one object: its pager collects every page into one list,
// and its first LIST (resourceVersion "0") is served by the apiserver's
// watch cache whole, its limit ignored (kube-apiserver v1.34.4: a view of
// 1M endpoints peaked at 574 MiB of heap under a 64Mi budget and
// GOMEMLIMIT 150MiB, 40 MiB paged; docs/SCALE.md). The first
// LIST is therefore made at resourceVersion "" (the newest, which "0",
// "any", allows), which the apiserver pages; a relist keeps the
// reflector's resourceVersion (paged, at that version: "Expired" makes the
// reflector list again at "").
func (v *View) pagedList(list listFunc) cache.ListWithContextFunc {
	return func(ctx context.Context, opts metav1.ListOptions) (_ runtime.Object, err error) {
		if opts.ResourceVersion == "0" && opts.ResourceVersionMatch == "" {
			opts.ResourceVersion = ""
		}
		opts.Limit, opts.Continue = ListPageSize, ""
		out := &metav1.List{}
		// A LIST that fails part way (an expired continue token, a
		// broken connection) never reaches the store: the budget's
		// entries of the pages it admitted go back to what they were.
		var undo []budgetUndo
		defer func() {
			if err != nil {
				v.budget.restore(undo)
			}
		}()
		for page := 0; ; page++ {
			var l runtime.Object
			l, err = list(ctx, opts)
			if err != nil {
				return nil, err
			}
			lm, err := apimeta.ListAccessor(l)
			if err != nil {
				return nil, fmt.Errorf("list page %d: %w", page, err)
			}
			if page == 0 {
				out.ResourceVersion = lm.GetResourceVersion()
			}
			if err := apimeta.EachListItem(l, func(o runtime.Object) error {
				if key, ok := apiRecordKey(o); ok {
					undo = append(undo, v.budget.entry(key))
				}
				c, err := v.transform(o)
				if err != nil {
					return err
				}
				if co, ok := c.(runtime.Object); ok {
					out.Items = append(out.Items, runtime.RawExtension{Object: co})
				}
				return nil
			}); err != nil {
				return nil, fmt.Errorf("list page %d: %w", page, err)
			}
			next := lm.GetContinue()
			if next == "" {
				return out, nil
			}
			// Pages after the first are at the first one's version,
			// named by the continue token.
			opts.Continue, opts.ResourceVersion, opts.ResourceVersionMatch = next, "", ""
		}
	}
}

// transform is the informers' TransformFunc: Transform, then the memory
// budget. A record that would take the view past its budget is kept
// without its content (a Service's name, a slice's name and Service), so
// that its deletion and later changes are still seen, and the view says it
// is over budget (Freshness.OverBudget) until no such record is left.
func (v *View) transform(obj any) (any, error) {
	switch obj.(type) {
	case *compactService, *compactSlice:
		// Transformed already (the streaming list's initial store is
		// replaced into the queue): accounted when it was, a record held
		// empty stays so.
		return obj, nil
	}
	out, err := Transform(obj)
	if err != nil {
		return out, err
	}
	var ok bool
	switch c := out.(type) {
	case *compactService:
		if ok = v.budget.admit("svc/"+c.namespace+"/"+c.name, c.resourceVersion, serviceCost(c), v.clock.Now); !ok {
			out = &compactService{objMeta: c.objMeta, svc: cluster.Service{Namespace: c.svc.Namespace, Name: c.svc.Name, Created: c.svc.Created}}
		}
	case *compactSlice:
		if ok = v.budget.admit("eps/"+c.namespace+"/"+c.name, c.resourceVersion, sliceCost(c), v.clock.Now); !ok {
			out = &compactSlice{objMeta: c.objMeta, service: c.service, changed: c.changed}
		}
	default:
		return out, nil
	}
	if !ok {
		v.warnOnce.Do(func() {
			st := v.budget.state()
			v.log.Warn("the cluster view went past its memory budget: the checks and actions that need it are off",
				zap.String("budget", v.budget.name), zap.Int64("budgetBytes", st.Limit), zap.Int64("heldBytes", st.Bytes))
		})
	}
	return out, nil
}

// forget settles a deleted record in the budget.
func (v *View) forget(obj any) {
	if key, rv, ok := recordKey(obj); ok {
		v.budget.forget(key, rv)
	}
}

// Budget returns the view's memory accounting.
func (v *View) Budget() BudgetState { return v.budget.state() }

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

func (v *View) touch(svc bool, objs ...any) {
	now := v.clock.Now()
	v.mu.Lock()
	v.lastEvent = now
	v.allGen++
	if svc {
		v.gen++
	}
	for _, o := range objs {
		if k, ok := serviceOf(o); ok {
			if _, isSvc := o.(*compactService); !isSvc && !v.hasService(k) {
				// A slice whose Service is not (or no longer) in the
				// view: nothing is derived from it; the Service's own
				// Add gives it a version newer than any, and an entry
				// here would outlive a deleted Service for ever.
				delete(v.versions, k)
				continue
			}
			v.versions[k] = v.allGen
		}
	}
	v.mu.Unlock()
}

// hasService reports whether the Service k is in the view's store.
func (v *View) hasService(k serviceKey) bool {
	_, ok, err := v.svc.GetStore().GetByKey(k.namespace + "/" + k.name)
	return ok && err == nil
}

// dropVersion forgets a deleted Service's version: created again, it gets
// a newer one (allGen only grows).
func (v *View) dropVersion(obj any) {
	if k, ok := serviceOf(obj); ok {
		v.mu.Lock()
		delete(v.versions, k)
		v.mu.Unlock()
	}
}

// ServiceVersion implements cluster.ServiceVersions: the view generation
// of the Service's last Service or EndpointSlice event, 0 when it has had
// none (not known to the view).
func (v *View) ServiceVersion(namespace, name string) uint64 {
	v.mu.Lock()
	defer v.mu.Unlock()
	return v.versions[serviceKey{namespace, name}]
}

// Generation implements cluster.Generational: it moves on every Service or
// EndpointSlice event (after the informer's store changed).
func (v *View) Generation() uint64 {
	v.mu.Lock()
	defer v.mu.Unlock()
	return v.allGen
}

// recordWatchError records a failed LIST/WATCH. It is logged as a warning
// when the connection breaks (the apiserver answered since the previous
// failure); the reflector's retries while it stays broken, and failures
// before it ever answered (the daemon says that once at start), are logged
// at debug level.
func (v *View) recordWatchError(informer string, err error) {
	now := v.clock.Now()
	v.mu.Lock()
	prev := v.watchErrAt
	v.watchErr = fmt.Errorf("%s watch: %w", informer, err)
	v.watchErrAt = now
	v.mu.Unlock()
	level := zap.WarnLevel
	if v.contact != nil {
		if ok := v.contact.Snapshot().LastOK; ok.IsZero() || (!prev.IsZero() && ok.Before(prev)) {
			level = zap.DebugLevel
		}
	}
	v.log.Log(level, "cluster view watch failed", zap.String("informer", informer), zap.Error(err))
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
	f.MaxAge, f.OverBudget = max(v.limits.MaxAge, 0), v.budget.reason()
	if v.contact != nil {
		st := v.contact.Snapshot()
		if st.LastError != nil && st.LastErrorTime.After(f.LastErrorTime) {
			f.LastError, f.LastErrorTime = st.LastError, st.LastErrorTime
		}
		// The contact tracker uses wall time; so does a real clock.
		f.Connected = !st.LastOK.IsZero() && !st.LastOK.Before(f.LastErrorTime)
		// Disconnected, the view matched the cluster at least until the
		// API server's last answer (its watches were open until then).
		f.CurrentAt = st.LastOK
	} else if f.LastError != nil {
		f.Connected = false
	}
	if f.Connected {
		f.CurrentAt = v.clock.Now()
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
		if s, ok := o.(*compactService); ok {
			out = append(out, s.svc)
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
	slices := make([]*compactSlice, 0, len(objs))
	for _, o := range objs {
		if s, ok := o.(*compactSlice); ok {
			slices = append(slices, s)
		}
	}
	return mergeCompact(slices)
}

// EndpointsChanged implements cluster.SliceTimes: the newest change time
// (managedFields, creationTimestamp) of the Service's slices.
func (v *View) EndpointsChanged(namespace, name string) time.Time {
	objs, err := v.eps.GetIndexer().ByIndex(serviceIndex, namespace+"/"+name)
	if err != nil {
		return time.Time{}
	}
	var newest int64
	for _, o := range objs {
		if s, ok := o.(*compactSlice); ok && s.changed > newest {
			newest = s.changed
		}
	}
	if newest == 0 {
		return time.Time{}
	}
	return time.Unix(newest, 0)
}

// MergeSlices flattens EndpointSlices into Endpoints, sorted by address,
// port name and port, deduplicated.
func MergeSlices(slices []*discoveryv1.EndpointSlice) []cluster.Endpoint {
	cs := make([]*compactSlice, len(slices))
	for i, s := range slices {
		cs[i] = toCompactSlice(s)
	}
	return mergeCompact(cs)
}

func mergeCompact(slices []*compactSlice) []cluster.Endpoint {
	type key struct {
		addr, portName, proto string
		port                  int32
	}
	idx := map[key]int{}
	var out []cluster.Endpoint
	for _, s := range slices {
		var changed time.Time
		if s.changed != 0 {
			changed = time.Unix(s.changed, 0)
		}
		for _, ep := range s.endpoints {
			for _, p := range s.ports {
				e := cluster.Endpoint{Address: ep.address, Port: p.Port, Protocol: p.Protocol, PortName: p.Name, NodeName: ep.node,
					Ready: ep.flags&epReady != 0, Serving: ep.flags&epServing != 0, Terminating: ep.flags&epTerminating != 0,
					Hinted: ep.flags&epHinted != 0, Secondary: ep.flags&epSecondary != 0, SliceChanged: changed}
				k := key{ep.address, p.Name, p.Protocol, p.Port}
				if i, dup := idx[k]; dup {
					if e.SliceChanged.After(out[i].SliceChanged) {
						out[i].SliceChanged = e.SliceChanged
					}
					if rank(e) > rank(out[i]) {
						sc := out[i].SliceChanged
						out[i] = e
						out[i].SliceChanged = sc
					}
					continue
				}
				idx[k] = len(out)
				out = append(out, e)
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
	if !e.Secondary {
		r += 8 // kube-proxy uses addresses[0]
	}
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
