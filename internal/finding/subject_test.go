package finding

import "testing"

type refA struct{ n int }

func (refA) Kind() Kind { return KindPod }

type refB struct{}

func (refB) Kind() Kind { return KindProcess }

// TestRefOf: the first reference of the asked type, none when absent.
func TestRefOf(t *testing.T) {
	s := Subject{Refs: []Ref{refB{}, refA{1}, refA{2}}}
	if a, ok := RefOf[refA](s); !ok || a.n != 1 {
		t.Errorf("RefOf[refA] = %v, %v; want the first, 1", a, ok)
	}
	if _, ok := RefOf[refB](Subject{Refs: []Ref{refA{}}}); ok {
		t.Error("found a refB that is not there")
	}
	if _, ok := RefOf[refA](Subject{}); ok {
		t.Error("found a reference in an empty subject")
	}
}
