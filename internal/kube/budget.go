package kube

import (
	"fmt"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/tools/cache"
)

// DefaultMemoryBudget is the default of ViewLimits.MemoryBudget: what the
// view's records may cost, well under the chart's 192Mi memory limit (the
// rest of the daemon, the Go runtime and client-go, take ~40 MiB; the heap
// grows to GOGC=25 above the live data).
const DefaultMemoryBudget int64 = 64 << 20

// DefaultMaxViewAge is the default of ViewLimits.MaxAge.
const DefaultMaxViewAge = 2 * time.Minute

// ViewLimits bound the view.
type ViewLimits struct {
	// MemoryBudget bounds the estimated cost of the records the view holds
	// (EndpointCost): a Service or EndpointSlice that would take the view
	// past it is kept as an empty record (its name only), and until no
	// such record is left Freshness.OverBudget says so and every check and
	// action that needs the view is off. 0 means DefaultMemoryBudget; < 0
	// no budget.
	MemoryBudget int64
	// BudgetName is how the budget is named to the operator (the flag),
	// e.g. "--cluster-view-memory 64Mi".
	BudgetName string
	// MaxAge is Freshness.MaxAge (0: DefaultMaxViewAge; < 0: a
	// disconnected view is never used).
	MaxAge time.Duration
}

// Estimated costs, in bytes, of what the view keeps and what its readers
// build from it. A slice's endpoints are merged per Service into one
// cluster.Endpoint per address and port (View.Endpoints: ~150 bytes, plus
// the merge's map entry) every time a check reads them, so a slice costs
// that as well as its compact record: a Service with 10,000 ports and
// 1,000 endpoints costs what it makes its readers allocate.
const (
	objectCost        = 320 // record, store and index entries, cost entry
	endpointCost      = 40  // compactEndpoint
	portCost          = 48  // cluster.ServicePort
	endpointPortCost  = 200 // one merged cluster.Endpoint and its map entry
	serviceStructCost = 240 // cluster.Service
)

// serviceCost estimates what a compact Service costs.
func serviceCost(c *compactService) int64 {
	s := &c.svc
	n := int64(objectCost + serviceStructCost + len(c.name) + len(c.resourceVersion) + len(s.Name) + len(s.ProxyName))
	for _, l := range [][]string{s.ClusterIPs, s.ExternalIPs, s.LoadBalancerIPs} {
		for _, ip := range l {
			n += 16 + int64(len(ip))
		}
	}
	return n + int64(len(s.Ports))*portCost
}

// sliceCost estimates what a compact EndpointSlice costs, its readers'
// merged endpoints included.
func sliceCost(c *compactSlice) int64 {
	n := int64(objectCost + len(c.name) + len(c.resourceVersion) + len(c.service))
	for _, e := range c.endpoints {
		n += endpointCost + int64(len(e.address))
	}
	ports := int64(len(c.ports))
	return n + ports*portCost + int64(len(c.endpoints))*max(ports, 1)*endpointPortCost
}

// FormatBytes prints n as a Kubernetes quantity (64Mi).
func FormatBytes(n int64) string { return resource.NewQuantity(n, resource.BinarySI).String() }

type costEntry struct {
	rv      string
	cost    int64
	dropped bool
}

// budget accounts the cost of the records the informers hold. Transform
// runs in the reflector's goroutine before an object is queued, so it
// decides there; deletions are settled by the event handlers (keyed on
// the resourceVersion, so a late delete does not undo a newer record).
type budget struct {
	limit int64 // < 0: none
	name  string

	mu      sync.Mutex
	total   int64
	peak    int64
	costs   map[string]costEntry // "kind/namespace/name"
	dropped int                  // records kept without their content
	first   time.Time            // when the budget first tripped
}

func newBudget(l ViewLimits) *budget {
	b := &budget{limit: l.MemoryBudget, name: l.BudgetName, costs: map[string]costEntry{}}
	if b.limit == 0 {
		b.limit = DefaultMemoryBudget
	}
	if b.name == "" {
		b.name = "memory budget " + FormatBytes(b.limit)
	}
	return b
}

// admit records a transformed record of cost under key, or refuses it
// (false) when it would take the total past the limit.
func (b *budget) admit(key, rv string, cost int64, now func() time.Time) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	prev := b.costs[key]
	next := b.total - prev.cost + cost
	ok := b.limit < 0 || next <= b.limit
	if prev.dropped {
		b.dropped--
	}
	if ok {
		b.total = next
		b.costs[key] = costEntry{rv: rv, cost: cost}
		b.peak = max(b.peak, b.total)
		return true
	}
	b.total -= prev.cost
	b.costs[key] = costEntry{rv: rv, dropped: true}
	b.dropped++
	if b.first.IsZero() {
		b.first = now()
	}
	return false
}

// forget settles the deletion of the record key at rv.
func (b *budget) forget(key, rv string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	e, ok := b.costs[key]
	if !ok || e.rv != rv {
		return // a newer record replaced it already
	}
	b.total -= e.cost
	if e.dropped {
		b.dropped--
	}
	delete(b.costs, key)
}

// budgetUndo is a record's entry as it was before a transform.
type budgetUndo struct {
	key   string
	entry costEntry
	had   bool
}

// entry returns the entry of key, to restore.
func (b *budget) entry(key string) budgetUndo {
	b.mu.Lock()
	defer b.mu.Unlock()
	e, ok := b.costs[key]
	return budgetUndo{key: key, entry: e, had: ok}
}

// restore puts the entries back as they were, in reverse order (a key
// admitted twice goes back to its first state).
func (b *budget) restore(undo []budgetUndo) {
	b.mu.Lock()
	defer b.mu.Unlock()
	for i := len(undo) - 1; i >= 0; i-- {
		u := undo[i]
		if cur, ok := b.costs[u.key]; ok {
			b.total -= cur.cost
			if cur.dropped {
				b.dropped--
			}
			delete(b.costs, u.key)
		}
		if u.had {
			b.costs[u.key] = u.entry
			b.total += u.entry.cost
			if u.entry.dropped {
				b.dropped++
			}
		}
	}
}

// BudgetState is the view's memory accounting.
type BudgetState struct {
	// Bytes is the estimated cost of the records held; Peak its highest.
	Bytes, Peak int64
	// Limit is the budget (< 0: none).
	Limit int64
	// Dropped counts records held without their content.
	Dropped int
}

func (b *budget) state() BudgetState {
	b.mu.Lock()
	defer b.mu.Unlock()
	return BudgetState{Bytes: b.total, Peak: b.peak, Limit: b.limit, Dropped: b.dropped}
}

// reason is Freshness.OverBudget: empty while nothing is dropped.
func (b *budget) reason() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.dropped == 0 {
		return ""
	}
	return fmt.Sprintf("cluster view over its %s: %d Services/EndpointSlices are not held, so the checks and actions that compare the node with the cluster are off (raise the budget or the pod's memory limit)",
		b.name, b.dropped)
}

// apiRecordKey is the budget's key of an API object the transform will
// compact.
func apiRecordKey(obj runtime.Object) (string, bool) {
	switch o := obj.(type) {
	case *corev1.Service:
		return "svc/" + o.Namespace + "/" + o.Name, true
	case *discoveryv1.EndpointSlice:
		return "eps/" + o.Namespace + "/" + o.Name, true
	}
	return "", false
}

// recordKey is the budget's key of a record.
func recordKey(obj any) (key, rv string, ok bool) {
	if t, isTomb := obj.(cache.DeletedFinalStateUnknown); isTomb {
		obj = t.Obj
	}
	switch c := obj.(type) {
	case *compactService:
		return "svc/" + c.namespace + "/" + c.name, c.resourceVersion, true
	case *compactSlice:
		return "eps/" + c.namespace + "/" + c.name, c.resourceVersion, true
	}
	return "", "", false
}
