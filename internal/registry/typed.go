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

// Untyped adapts a typed factory to the untyped form the policy loader
// feeds (a params value it got from NewParams). The assertion cannot fail
// for values from NewParams[P]; anything else is an error, not a panic.
func Untyped[P, D, R any](name string, f func(*P, D) (R, error)) func(any, D) (R, error) {
	return func(params any, d D) (R, error) {
		p, ok := params.(*P)
		if !ok {
			var zero R
			return zero, fmt.Errorf("%s: params are %T, want %T", name, params, p)
		}
		return f(p, d)
	}
}
