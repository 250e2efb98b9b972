package detect

import (
	"context"
	"strings"
	"testing"

	"github.com/remediate-dev/remediate/internal/finding"
	"github.com/remediate-dev/remediate/internal/node"
)

type defineTestParams struct {
	Limit int `yaml:"limit"`
}

func (p *defineTestParams) SetDefaults() { p.Limit = 7 }

type defineTestDetector struct{ limit int }

func (d defineTestDetector) Detect(context.Context) ([]finding.Finding, error) { return nil, nil }

// TestDefine: the one-line registration takes its defaults from the
// parameter type, hands the factory the typed parameters, records the
// declared target kinds, and refuses a foreign parameter value with an
// error instead of a panic. The deprecated Register still works beside it.
func TestDefine(t *testing.T) {
	var got *defineTestParams
	Define("DefineTest", "doc", func(p *defineTestParams, _ *node.Node) (Detector, error) {
		got = p
		return defineTestDetector{p.Limit}, nil
	}, Targets(finding.KindProcess))
	ty, ok := Lookup("DefineTest")
	if !ok || ty.Doc != "doc" || len(ty.Targets) != 1 || ty.Targets[0] != finding.KindProcess {
		t.Fatalf("registered %+v, %v", ty, ok)
	}
	params := ty.NewParams()
	if p, ok := params.(*defineTestParams); !ok || p.Limit != 7 {
		t.Fatalf("NewParams = %#v, want *defineTestParams{Limit: 7}", params)
	}
	params.(*defineTestParams).Limit = 9
	d, err := ty.New(params, &node.Node{})
	if err != nil || d.(defineTestDetector).limit != 9 || got != params {
		t.Fatalf("New = %#v, %v (factory got %p, want %p)", d, err, got, params)
	}
	if _, err := ty.New(&struct{}{}, &node.Node{}); err == nil || !strings.Contains(err.Error(), "params are") {
		t.Fatalf("foreign params: %v", err)
	}
}
