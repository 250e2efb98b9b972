// Package clusterguard holds the guardrails that need the cluster: the
// API-freshness check (no API-dependent or disruptive action on a stale
// view), the cluster-wide budget (a Lease-based semaphore limiting how many
// disruptive actions run at once across all nodes), the storm guard (hold
// back when a large share of the nodes report the same problem at once:
// suspect the control plane, not the nodes) and the node opt-out (a label or
// annotation on the Node that stops all actions on it).
//
// They implement remediate.Guardrail; Budget also implements
// remediate.Holder. All of them fail closed: an API error blocks.
package clusterguard

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
