// Package policy defines the remediation policy: one YAML document of kind
// RemediationPolicy that sets the mode (audit or enforce), the detection
// loop, node-wide guardrails and the rules. Each rule pairs a detector (and
// its thresholds) with one action (and its bounds) and the rule's own
// guardrails.
//
// Load parses strictly: unknown fields are errors, every error carries
// file:line:col and the field path, and all errors of a file are reported
// together. Defaults are applied in one place (SetDefaults) and the effective
// policy can be printed (Marshal).
package policy

// APIVersion is the only policy version this build understands.
const APIVersion = "remediate.dev/v1alpha1"

// Kind is the policy document kind.
const Kind = "RemediationPolicy"

// Mode says whether actions are carried out.
type Mode string

// Modes.
const (
	// Audit changes nothing: every action is reported as "dry-run".
	Audit Mode = "audit"
	// Enforce carries out actions that pass the guardrails.
	Enforce Mode = "enforce"
)

// Policy is the whole document.
type Policy struct {
	APIVersion string `yaml:"apiVersion"`
	Kind       string `yaml:"kind"`
	// Mode is audit (default) or enforce.
	Mode Mode `yaml:"mode"`
	// Interval between detection cycles in the daemon.
	Interval Duration `yaml:"interval"`
	// Jitter spreads cycles (and the first cycle) by up to this fraction of
	// Interval, so a DaemonSet's pods do not act in lockstep.
	Jitter float64 `yaml:"jitter"`
	// DetectorTimeout bounds each detector's run in a cycle.
	DetectorTimeout Duration `yaml:"detectorTimeout"`
	// ActionTimeout bounds each action's Execute.
	ActionTimeout Duration `yaml:"actionTimeout"`
	// KubeProxy says where kube-proxy's endpoints are and how it is set up.
	KubeProxy KubeProxy `yaml:"kubeProxy"`
	// Guardrails are node-wide limits across all rules.
	Guardrails NodeGuardrails `yaml:"guardrails"`
	// Cluster configures the cluster-wide guardrails (used only with
	// cluster access).
	Cluster Cluster `yaml:"cluster"`
	// Rules pair detectors with actions.
	Rules []Rule `yaml:"rules"`
	// Notes are what the loader says about a valid policy without refusing
	// it (a deprecated type name), positioned as errors are; `policy
	// check` prints them. Not part of the document.
	Notes []*Error `yaml:"-" json:"-"`
}

// KubeProxy locates kube-proxy's observable surface.
type KubeProxy struct {
	// MetricsURL is kube-proxy's Prometheus endpoint.
	MetricsURL string `yaml:"metricsURL"`
	// HealthzURL is kube-proxy's /healthz.
	HealthzURL string `yaml:"healthzURL"`
	// ProxyModeURL is kube-proxy's /proxyMode.
	ProxyModeURL string `yaml:"proxyModeURL"`
	// SyncPeriod is kube-proxy's configured iptables/ipvs syncPeriod;
	// thresholds are expressed relative to it.
	SyncPeriod Duration `yaml:"syncPeriod"`
	// ScrapeTimeout bounds each HTTP request to kube-proxy.
	ScrapeTimeout Duration `yaml:"scrapeTimeout"`
}

// NodeGuardrails limit what the daemon does on this node, across rules.
type NodeGuardrails struct {
	// MaxActionsPerHour caps executed actions on the node in any sliding
	// hour.
	MaxActionsPerHour int `yaml:"maxActionsPerHour"`
	// MaxTargetsPerCycle caps how many targets are acted on in one cycle.
	MaxTargetsPerCycle int `yaml:"maxTargetsPerCycle"`
}

// Cluster configures the guardrails shared by every node's daemon.
// Changes take effect when the daemon restarts (the Leases are set up once).
type Cluster struct {
	// Namespace holds the budget and node-status Leases ("" =
	// $POD_NAMESPACE, else the pod's service account namespace, else
	// kube-system). Events about the Node are in
	// kube-system (the apiserver keeps them in default or kube-system).
	Namespace string `yaml:"namespace"`
	// BudgetSlots is how many disruptive actions (restart kube-proxy,
	// cordon, delete IPVS servers) may be in progress cluster-wide.
	BudgetSlots int `yaml:"budgetSlots"`
	// BudgetTTL: a slot not renewed for this long (a crashed holder) is free.
	BudgetTTL Duration `yaml:"budgetTTL"`
	// StormMaxShare: when more than this share of live nodes report the same
	// rule firing at once, hold back (suspect the control plane).
	StormMaxShare float64 `yaml:"stormMaxShare"`
	// StormMinNodes: the storm guard judges only with at least this many
	// nodes reporting.
	StormMinNodes int `yaml:"stormMinNodes"`
}

// Rule is one detector → action pairing with its guardrails.
type Rule struct {
	// Name identifies the rule in reports, the journal and the state file.
	Name string `yaml:"name"`
	// Detector names the detector type and sets its thresholds.
	Detector Component `yaml:"detector"`
	// For is how long a finding must persist before the rule fires.
	For Duration `yaml:"for"`
	// Action names the action type and sets its bounds. Optional: a rule
	// without an action only reports.
	Action *Component `yaml:"action,omitempty"`
	// DryRun makes this rule report "dry-run" even in enforce mode.
	DryRun bool `yaml:"dryRun"`
	// Cooldown is the minimum time between two actions of this rule on the
	// same target.
	Cooldown Duration `yaml:"cooldown"`
	// RateLimit caps this rule's executed actions over a sliding window.
	RateLimit RateLimit `yaml:"rateLimit"`
	// MaxAttempts failed attempts on a target escalate it: no more actions
	// until the finding clears.
	MaxAttempts int `yaml:"maxAttempts"`
	// VerifyAfter is how long after acting the finding is re-checked.
	VerifyAfter Duration `yaml:"verifyAfter"`
}

// RateLimit is "at most Max per Per".
type RateLimit struct {
	Max int      `yaml:"max"`
	Per Duration `yaml:"per"`
}

// Component is a detector or action reference: its registered Type plus its
// parameters, written inline next to `type` in YAML. Params holds the
// type's parameter struct (from the Catalog) after Load.
type Component struct {
	Type   string
	Params any
}
