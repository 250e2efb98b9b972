package action

import (
	"context"
	"testing"

	"github.com/remediate-dev/remediate/internal/finding"
	"github.com/remediate-dev/remediate/internal/node"
)

type defineTestAction struct{}

func (defineTestAction) Plan(context.Context, finding.Finding) (Plan, error) { return Plan{}, nil }
func (defineTestAction) Execute(context.Context, finding.Finding) (Result, error) {
	return Result{}, nil
}

func TestDefineAndCanActOn(t *testing.T) {
	Define("DefineTestAct", "doc", func(*struct{}, *node.Node) (Action, error) { return defineTestAction{}, nil },
		Disruptive(), ActsOn(finding.KindIPVSRealServer), ActsOnDetectors("SomeDetector"))
	ty, ok := Lookup("DefineTestAct")
	if !ok || !ty.Disruptive || !ty.Declared() {
		t.Fatalf("registered %+v %v", ty, ok)
	}
	for _, c := range []struct {
		det   string
		kinds []finding.Kind
		want  bool
	}{
		{"IPVSStaleRealServer", []finding.Kind{finding.KindIPVSRealServer}, true},
		{"ConntrackExhaustion", []finding.Kind{finding.KindConntrackTable}, false},
		{"SomeDetector", []finding.Kind{finding.KindConntrackTable}, true}, // by name
		{"Undeclared", nil, true}, // not judged
	} {
		if got := ty.CanActOn(c.det, c.kinds); got != c.want {
			t.Errorf("CanActOn(%s, %v) = %v, want %v", c.det, c.kinds, got, c.want)
		}
	}
	func() {
		defer func() {
			if recover() == nil {
				t.Error("an action that declares nothing it can act on was registered")
			}
		}()
		Define("DefineTestUndeclared", "doc", func(*struct{}, *node.Node) (Action, error) { return defineTestAction{}, nil })
	}()
	any, _ := Lookup("CordonNode")
	if !any.CanActOn("ConntrackExhaustion", []finding.Kind{finding.KindConntrackTable}) {
		t.Fatal("CordonNode acts on any finding")
	}
}
