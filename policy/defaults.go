package policy

import "time"

// Defaults, in one place. A field absent from the policy file keeps these
// values; `remediate policy show` prints the result.
const (
	DefaultMode               = Audit
	DefaultInterval           = 30 * time.Second
	DefaultJitter             = 0.1
	DefaultDetectorTimeout    = 10 * time.Second
	DefaultActionTimeout      = 60 * time.Second
	DefaultMetricsURL         = "http://127.0.0.1:10249/metrics"
	DefaultHealthzURL         = "http://127.0.0.1:10256/healthz"
	DefaultProxyModeURL       = "http://127.0.0.1:10249/proxyMode"
	DefaultSyncPeriod         = 30 * time.Second
	DefaultScrapeTimeout      = 2 * time.Second
	DefaultMaxActionsPerHour  = 6
	DefaultMaxTargetsPerCycle = 3

	DefaultBudgetSlots   = 1
	DefaultBudgetTTL     = 10 * time.Minute
	DefaultStormMaxShare = 0.3
	DefaultStormMinNodes = 3

	DefaultFor          = 2 * time.Minute
	DefaultCooldown     = 15 * time.Minute
	DefaultRateLimitMax = 3
	DefaultRateLimitPer = time.Hour
	DefaultMaxAttempts  = 3
	DefaultVerifyAfter  = time.Minute
)

func (p *Policy) setDefaults() {
	p.Mode = DefaultMode
	p.Interval = D(DefaultInterval)
	p.Jitter = DefaultJitter
	p.DetectorTimeout = D(DefaultDetectorTimeout)
	p.ActionTimeout = D(DefaultActionTimeout)
	p.KubeProxy = KubeProxy{
		MetricsURL:    DefaultMetricsURL,
		HealthzURL:    DefaultHealthzURL,
		ProxyModeURL:  DefaultProxyModeURL,
		SyncPeriod:    D(DefaultSyncPeriod),
		ScrapeTimeout: D(DefaultScrapeTimeout),
	}
	p.Guardrails = NodeGuardrails{
		MaxActionsPerHour:  DefaultMaxActionsPerHour,
		MaxTargetsPerCycle: DefaultMaxTargetsPerCycle,
	}
	p.Cluster = Cluster{
		BudgetSlots:   DefaultBudgetSlots,
		BudgetTTL:     D(DefaultBudgetTTL),
		StormMaxShare: DefaultStormMaxShare,
		StormMinNodes: DefaultStormMinNodes,
	}
}

func (r *Rule) setDefaults() {
	r.For = D(DefaultFor)
	r.Cooldown = D(DefaultCooldown)
	r.RateLimit = RateLimit{Max: DefaultRateLimitMax, Per: D(DefaultRateLimitPer)}
	r.MaxAttempts = DefaultMaxAttempts
	r.VerifyAfter = D(DefaultVerifyAfter)
}

// Default returns a policy holding only defaults (no rules).
func Default() *Policy {
	p := &Policy{APIVersion: APIVersion, Kind: Kind}
	p.setDefaults()
	return p
}
