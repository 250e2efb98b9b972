package guardrails

// Names of the guardrails, as they appear in block reasons, the decision's
// guardrail field and the remediate_guardrail_blocks_total metric. Chain
// checks them in this order.
const (
	GuardEscalation = "escalation"
	GuardCooldown   = "cooldown"
	GuardRuleRate   = "rule-rate-limit"
	GuardNodeRate   = "node-rate-limit"
	GuardMaxTargets = "max-targets-per-cycle"
	GuardOptOut     = "node-opt-out"
	GuardFreshness  = "api-freshness"
	GuardStorm      = "storm-guard"
	// GuardFleetPause and GuardKubeProxyRollout are the fleet controls
	// (fleet.go).
	GuardFleetPause       = "fleet-pause"
	GuardKubeProxyRollout = "kube-proxy-rollout"
	GuardBudget           = "cluster-budget"
	GuardDryRun           = "dry-run"
)
