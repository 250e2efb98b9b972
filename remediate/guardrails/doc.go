// Package guardrails holds every check that may block an action, node and
// cluster, one file each behind one interface (Guardrail), and Chain, the
// one function that puts them in order (the order is written down there,
// once).
//
// Node guardrails read the engine's persisted state through Ledger:
// escalation, cooldown, the rule's rate limit, the node-wide
// actions-per-hour limit and max targets per cycle. Cluster guardrails need
// the API: the node opt-out (a label or annotation on the Node that stops
// all actions on it), API freshness (no API-dependent or disruptive action
// on a stale view), the storm guard (hold back when a large share of the
// nodes report the same problem at once: suspect the control plane, not the
// nodes) and the cluster-wide budget (a Lease-based semaphore limiting how
// many disruptive actions run at once across all nodes; it also implements
// Holder). Dry-run comes last. All of them fail closed: an error blocks.
package guardrails

// Labels and annotations the guardrails read and write.
const (
	// LabelLease marks the Leases this package manages; its value is
	// LeaseBudget or LeaseNodeStatus.
	LabelLease = "remediate.dev/lease"
	// LeaseBudget marks a budget slot Lease.
	LeaseBudget = "budget"
	// LeaseNodeStatus marks a node's status Lease (storm guard).
	LeaseNodeStatus = "node-status"
	// AnnotationRule, AnnotationTarget and AnnotationAction describe what a
	// budget slot is held for.
	AnnotationRule   = "remediate.dev/rule"
	AnnotationTarget = "remediate.dev/target"
	AnnotationAction = "remediate.dev/action"
	// AnnotationFiring on a node-status Lease lists (JSON array) the rules
	// currently firing on that node.
	AnnotationFiring = "remediate.dev/firing"
	// OptOutKey as a label or annotation on the Node, with any value but
	// "false", stops every action on that node.
	OptOutKey = "remediate.dev/opt-out"
)
