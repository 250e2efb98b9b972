package detect

import (
	"context"
	"maps"
	"time"

	"github.com/remediate-dev/remediate/internal/finding"
	"github.com/remediate-dev/remediate/internal/node"
)

// EvidenceClusterView is the evidence key that says how old the cluster
// view a finding was judged on is, when it was disconnected but still
// young enough to use (cluster.Freshness.Usable).
const EvidenceClusterView = "clusterView"

// UsesClusterView declares a detector that compares the node with the
// cluster view: its findings (and its Judged figure) say how old the view
// was when the API server could not be reached. Such a detector gates
// with clusterViewGate.
func UsesClusterView() Option {
	return func(t *Type) {
		inner := t.New
		t.New = func(p any, n *node.Node) (Detector, error) {
			d, err := inner(p, n)
			if err != nil || d == nil {
				return d, err
			}
			return &viewAged{d: d, n: n}, nil
		}
	}
}

// clusterViewGate skips unless the cluster view may be used: synced,
// within its memory budget, and connected or disconnected for at most its
// maximum age (cluster.Freshness.Usable).
func clusterViewGate(n *node.Node, what string) error {
	if n.Cluster == nil {
		return finding.Skip("%s", n.Why("kubernetes"))
	}
	if _, skip := n.Cluster.Freshness().Usable(nowOf(n)); skip != "" {
		return finding.Skip("%s: %s", skip, what)
	}
	return nil
}

// viewNote is cluster.Freshness.Usable's note ("" when connected).
func viewNote(n *node.Node) string {
	if n.Cluster == nil {
		return ""
	}
	note, _ := n.Cluster.Freshness().Usable(nowOf(n))
	return note
}

// nowOf is the node's clock's time (the wall clock when it has none).
func nowOf(n *node.Node) time.Time {
	if n.Clock == nil {
		return time.Now()
	}
	return n.Clock.Now()
}

// viewAged adds the view's age to a detector's findings and figure.
type viewAged struct {
	d Detector
	n *node.Node
}

// Detect implements Detector.
func (v *viewAged) Detect(ctx context.Context) ([]finding.Finding, error) {
	fs, err := v.d.Detect(ctx)
	if len(fs) == 0 {
		return fs, err
	}
	if note := viewNote(v.n); note != "" {
		out := make([]finding.Finding, len(fs))
		for i, f := range fs {
			f.Evidence = maps.Clone(f.Evidence)
			if f.Evidence == nil {
				f.Evidence = map[string]any{}
			}
			f.Evidence[EvidenceClusterView] = note
			out[i] = f
		}
		fs = out
	}
	return fs, err
}

// Judged implements Judged.
func (v *viewAged) Judged() string {
	j, ok := v.d.(Judged)
	if !ok {
		return ""
	}
	s := j.Judged()
	if note := viewNote(v.n); note != "" && s != "" {
		s += "; " + note
	}
	return s
}

// Unwrap returns the wrapped detector.
func (v *viewAged) Unwrap() Detector { return v.d }
