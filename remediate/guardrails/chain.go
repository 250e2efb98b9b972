package guardrails

// Node is what the node guardrails are built from for one cycle.
type Node struct {
	Ledger             Ledger
	MaxActionsPerHour  int
	MaxTargetsPerCycle int
	// Acted counts the targets acted on (or dry-run) this cycle.
	Acted *int
}

// Cluster holds the cluster guardrails; a nil one is left out of the
// chain. Built once by the daemon's wiring (they hold API clients and
// leases) and reused every cycle.
type Cluster struct {
	OptOut    Guardrail
	Freshness Guardrail
	Storm     Guardrail
	Budget    Guardrail
	// Extra guardrails are checked after the storm guard and before the
	// budget, in the order given.
	Extra []Guardrail
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
//  9. (Cluster.Extra)
//  10. cluster-budget       last of the limits: a slot is taken only when
//     everything else allows
//  11. dry-run              last of all, so an audit report shows what
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
	for _, cg := range []Guardrail{c.OptOut, c.Freshness, c.Storm} {
		if cg != nil {
			g = append(g, cg)
		}
	}
	g = append(g, c.Extra...)
	if c.Budget != nil {
		g = append(g, c.Budget)
	}
	return append(g, DryRun{dryRunWhy})
}
