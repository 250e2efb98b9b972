package guardrails

// Node is what the node guardrails are built from for one cycle.
type Node struct {
	Ledger             Ledger
	MaxActionsPerHour  int
	MaxTargetsPerCycle int
	// Acted counts the targets acted on (or dry-run) this cycle.
	Acted *int
}

// Cluster holds the cluster guardrails, one named field each; a nil one is
// left out of the chain. Built once, in one place (the daemon's wiring,
// cmd/remediate wire_kube.go: they hold API clients, watches and leases),
// and reused every cycle. To add a guardrail: a field here, its place in
// Chain below, its name in names.go, and the line that builds it in the
// wiring; there is no other way in (internal/layering
// TestOneWayToAddAGuardrail).
type Cluster struct {
	OptOut    Guardrail
	Freshness Guardrail
	Storm     Guardrail
	// FleetPause: the fleet ConfigMap's pause (NewFleetPause).
	FleetPause Guardrail
	// KubeProxyRollout: disruptive actions held while kube-proxy's
	// DaemonSet rolls out (NewKubeProxyRollout).
	KubeProxyRollout Guardrail
	Budget           Guardrail
}

// Chain returns the guardrails in the one order they are checked; the
// first that blocks gives the reason:
//
//  1. escalation            a target whose attempts are exhausted
//  2. cooldown              per rule and target
//  3. rule-rate-limit       rule.rateLimit
//  4. node-rate-limit       guardrails.maxActionsPerHour
//  5. max-targets-per-cycle guardrails.maxTargetsPerCycle
//  6. node-opt-out          the Node's remediate.dev/opt-out
//  7. api-freshness         a fresh cluster view for what needs the API
//  8. storm-guard           too many nodes reporting the same rule
//  9. fleet-pause           the fleet ConfigMap pauses every node
//  10. kube-proxy-rollout   disruptive actions wait out kube-proxy's rollout
//  11. cluster-budget       last of the limits: a slot is taken only when
//     everything else allows
//  12. dry-run              last of all, so an audit report shows what
//     enforce mode would do, blocks included
//
// dryRunWhy is DryRunReason for the rule.
func Chain(n Node, c Cluster, dryRunWhy string) []Guardrail {
	g := []Guardrail{
		Escalation{n.Ledger},
		Cooldown{n.Ledger},
		RuleRateLimit{n.Ledger},
		NodeRateLimit{n.Ledger, n.MaxActionsPerHour},
		MaxTargets{n.MaxTargetsPerCycle, n.Acted},
	}
	for _, cg := range []Guardrail{c.OptOut, c.Freshness, c.Storm, c.FleetPause, c.KubeProxyRollout, c.Budget} {
		if cg != nil {
			g = append(g, cg)
		}
	}
	return append(g, DryRun{dryRunWhy})
}

// BlockNames are the names of the guardrails of c's chain that can block
// (all but dry-run), in the chain's order: the guardrail label values of
// remediate_guardrail_blocks_total exported at 0.
func BlockNames(c Cluster) []string {
	var out []string
	for _, g := range Chain(Node{}, c, "") {
		if g.Name() != GuardDryRun {
			out = append(out, g.Name())
		}
	}
	return out
}
