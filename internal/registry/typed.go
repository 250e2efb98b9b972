package registry

import "fmt"

// Defaulter is implemented (on the pointer) by parameter structs that set
// their own defaults; NewParams calls it. A parameter struct without it
// starts from its zero value.
type Defaulter interface {
	SetDefaults()
}

// NewParams returns a fresh *P with the type's defaults applied.
func NewParams[P any]() *P {
	p := new(P)
	if d, ok := any(p).(Defaulter); ok {
		d.SetDefaults()
	}
	return p
}

// Typed turns a typed factory into the untyped pair the policy loader and
// the engine use: a constructor of fresh parameters (with the type's
// defaults), and a builder that hands the factory those parameters. The
// builder's assertion cannot fail for values from the constructor;
// anything else is an error, not a panic.
func Typed[P, D, R any](name string, factory func(*P, D) (R, error)) (func() any, func(any, D) (R, error)) {
	newParams := func() any { return NewParams[P]() }
	build := func(params any, d D) (R, error) {
		p, ok := params.(*P)
		if !ok {
			var zero R
			return zero, fmt.Errorf("%s: params are %T, want %T", name, params, p)
		}
		return factory(p, d)
	}
	return newParams, build
}

// Types is the registry of detector or action types: descriptors T,
// named by name and complete when valid says so.
type Types[T any] struct {
	r      *Registry[T]
	prefix string
	name   func(T) string
	valid  func(T) bool
}

// NewTypes returns an empty registry of types; kind ("detector",
// "action") names its entries in panics, prefix (the package) starts them.
func NewTypes[T any](prefix, kind string, name func(T) string, valid func(T) bool) *Types[T] {
	return &Types[T]{r: New[T](kind), prefix: prefix, name: name, valid: valid}
}

// Add applies the declarations opts to t and registers it. It panics on an
// incomplete or duplicate registration: a programming error, found at
// init.
func (ts *Types[T]) Add(t T, opts ...func(*T)) {
	for _, o := range opts {
		o(&t)
	}
	if !ts.valid(t) {
		panic(fmt.Sprintf("%s: incomplete registration %+v", ts.prefix, t))
	}
	ts.r.Add(ts.name(t), t)
}

// Get returns the type registered under name.
func (ts *Types[T]) Get(name string) (T, bool) { return ts.r.Get(name) }

// All returns every registered type, sorted by name.
func (ts *Types[T]) All() []T { return ts.r.All() }
