// Package clustertest provides a stateful in-memory cluster.View for tests
// of detectors and actions that compare kernel state with the cluster's
// desired state.
package clustertest

import (
	"sort"
	"sync"
	"time"

	"github.com/remediate-dev/remediate/internal/cluster"
)

// Fake is a goroutine-safe, mutable cluster.View. The zero value is not
// usable; use New.
type Fake struct {
	mu        sync.Mutex
	services  map[string]cluster.Service
	endpoints map[string][]cluster.Endpoint
	fresh     cluster.Freshness
	changed   map[string]time.Time
}

var (
	_ cluster.View       = (*Fake)(nil)
	_ cluster.SliceTimes = (*Fake)(nil)
)

// SetEndpointsChanged sets what EndpointsChanged returns for a Service.
func (f *Fake) SetEndpointsChanged(namespace, name string, t time.Time) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.changed == nil {
		f.changed = map[string]time.Time{}
	}
	f.changed[key(namespace, name)] = t
}

// EndpointsChanged implements cluster.SliceTimes.
func (f *Fake) EndpointsChanged(namespace, name string) time.Time {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.changed[key(namespace, name)]
}

// New returns an empty view that is synced, connected and fresh as of now.
func New(now time.Time) *Fake {
	return &Fake{
		services:  map[string]cluster.Service{},
		endpoints: map[string][]cluster.Endpoint{},
		fresh:     cluster.Freshness{Synced: true, Connected: true, LastEvent: now},
	}
}

func key(ns, name string) string { return ns + "/" + name }

// SetService adds or replaces a Service and, when eps is not nil, its
// endpoints.
func (f *Fake) SetService(s cluster.Service, eps ...cluster.Endpoint) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.services[key(s.Namespace, s.Name)] = s
	if eps != nil {
		f.endpoints[key(s.Namespace, s.Name)] = append([]cluster.Endpoint(nil), eps...)
	}
}

// SetEndpoints replaces a Service's endpoints.
func (f *Fake) SetEndpoints(namespace, name string, eps ...cluster.Endpoint) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.endpoints[key(namespace, name)] = append([]cluster.Endpoint(nil), eps...)
}

// DeleteService removes a Service and its endpoints.
func (f *Fake) DeleteService(namespace, name string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.services, key(namespace, name))
	delete(f.endpoints, key(namespace, name))
}

// SetFreshness replaces the reported freshness.
func (f *Fake) SetFreshness(fr cluster.Freshness) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.fresh = fr
}

// Services implements cluster.View, sorted by namespace/name.
func (f *Fake) Services() []cluster.Service {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := make([]cluster.Service, 0, len(f.services))
	for _, s := range f.services {
		out = append(out, s)
	}
	sort.Slice(out, func(i, j int) bool {
		return key(out[i].Namespace, out[i].Name) < key(out[j].Namespace, out[j].Name)
	})
	return out
}

// Endpoints implements cluster.View.
func (f *Fake) Endpoints(namespace, name string) []cluster.Endpoint {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]cluster.Endpoint(nil), f.endpoints[key(namespace, name)]...)
}

// Freshness implements cluster.View.
func (f *Fake) Freshness() cluster.Freshness {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.fresh
}
