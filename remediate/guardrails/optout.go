package guardrails

import (
	"context"

	corev1 "k8s.io/api/core/v1"
)

// NodeSource returns the last known Node object (internal/kube.NodeWatch).
type NodeSource interface {
	Node() (*corev1.Node, bool)
}

// OptOut blocks every action (node-local ones too) on a node that carries
// OptOutKey as a label or annotation with a value other than "false".
// While the Node is unknown (no cluster access, not yet listed) it allows:
// the freshness guardrail already blocks what needs the API, and a node
// without API access must keep healing locally.
type OptOut struct{ nodes NodeSource }

// NewOptOut returns the guardrail; nodes may be nil (no cluster access).
func NewOptOut(nodes NodeSource) *OptOut { return &OptOut{nodes: nodes} }

// Name implements Guardrail.
func (g *OptOut) Name() string { return GuardOptOut }

// Check implements Guardrail.
func (g *OptOut) Check(_ context.Context, _ *Request) error {
	if g.nodes == nil {
		return nil
	}
	n, ok := g.nodes.Node()
	if !ok {
		return nil
	}
	if why := OptedOut(n); why != "" {
		return Block(g.Name(), "node %s opted out by %s", n.Name, why)
	}
	return nil
}

// OptedOut says how n opts out ("label remediate.dev/opt-out=true"), or "".
func OptedOut(n *corev1.Node) string {
	if v, ok := n.Labels[OptOutKey]; ok && v != "false" {
		return "label " + OptOutKey + "=" + v
	}
	if v, ok := n.Annotations[OptOutKey]; ok && v != "false" {
		return "annotation " + OptOutKey + "=" + v
	}
	return ""
}
