// Package registry is a small name → value registry, safe for concurrent
// use, used for the detector and action types.
package registry

import (
	"sort"
	"sync"
)

// Registry maps names to values of type T.
type Registry[T any] struct {
	kind string
	mu   sync.RWMutex
	m    map[string]T
}

// New returns an empty registry; kind names its entries in panics.
func New[T any](kind string) *Registry[T] {
	return &Registry[T]{kind: kind, m: map[string]T{}}
}

// Add registers v under name; it panics on a duplicate name (a programming
// error, found at init).
func (r *Registry[T]) Add(name string, v T) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, dup := r.m[name]; dup {
		panic("duplicate " + r.kind + " type " + name)
	}
	r.m[name] = v
}

// Get returns the value registered under name.
func (r *Registry[T]) Get(name string) (T, bool) {
	r.mu.RLock()
	defer r.mu.RUnlock()
	v, ok := r.m[name]
	return v, ok
}

// All returns every value, sorted by name.
func (r *Registry[T]) All() []T {
	r.mu.RLock()
	defer r.mu.RUnlock()
	names := make([]string, 0, len(r.m))
	for n := range r.m {
		names = append(names, n)
	}
	sort.Strings(names)
	out := make([]T, len(names))
	for i, n := range names {
		out[i] = r.m[n]
	}
	return out
}
