package policy

import (
	"fmt"
	"net/url"
	"regexp"
	"time"
)

// MaxCount bounds the counts a policy sets (actions per hour, a rule's
// rate limit): larger values mean "unlimited", which a guardrail is not.
const MaxCount = 10000

var ruleNameRE = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$`)

// validatePolicy checks values and relations after decoding and defaults.
// Field paths are absolute ("rules[1].cooldown"). written reports whether
// the file sets a field: a relation broken by a default is reported at the
// field the user wrote, naming the default and its value.
func validatePolicy(p *Policy, written func(path string) bool) []FieldError {
	var errs []FieldError
	add := func(field, format string, args ...any) {
		errs = append(errs, FieldError{Field: field, Msg: fmt.Sprintf(format, args...)})
	}
	if p.APIVersion != APIVersion {
		if p.APIVersion == "" {
			add("apiVersion", "required: %s", APIVersion)
		} else {
			add("apiVersion", "unsupported version %q (this build reads %s)", p.APIVersion, APIVersion)
		}
	}
	if p.Kind != Kind {
		add("kind", "must be %s", Kind)
	}
	if p.Mode != Audit && p.Mode != Enforce {
		add("mode", "must be audit or enforce, got %q", p.Mode)
	}
	if p.Interval.Duration < time.Second {
		add("interval", "must be at least 1s")
	} else if p.Interval.Duration > 24*time.Hour {
		add("interval", "must be at most 24h")
	}
	if p.Jitter < 0 || p.Jitter >= 1 {
		add("jitter", "must be in [0, 1)")
	}
	if p.DetectorTimeout.Duration <= 0 {
		add("detectorTimeout", "must be > 0")
	} else if p.Interval.Duration >= time.Second && p.DetectorTimeout.Duration > p.Interval.Duration {
		if written("interval") && !written("detectorTimeout") {
			add("interval", "%s is shorter than detectorTimeout (not set: its default is %s); set detectorTimeout to at most %s, or a longer interval",
				p.Interval.Duration, p.DetectorTimeout.Duration, p.Interval.Duration)
		} else if !written("interval") {
			add("detectorTimeout", "must not exceed interval (not set: its default is %s)", p.Interval.Duration)
		} else {
			add("detectorTimeout", "must not exceed interval (%s)", p.Interval.Duration)
		}
	}
	if p.ActionTimeout.Duration <= 0 {
		add("actionTimeout", "must be > 0")
	} else if p.ActionTimeout.Duration > time.Hour {
		add("actionTimeout", "must be at most 1h")
	}
	for field, u := range map[string]string{
		"kubeProxy.metricsURL":   p.KubeProxy.MetricsURL,
		"kubeProxy.healthzURL":   p.KubeProxy.HealthzURL,
		"kubeProxy.proxyModeURL": p.KubeProxy.ProxyModeURL,
	} {
		pu, err := url.Parse(u)
		if err != nil || (pu.Scheme != "http" && pu.Scheme != "https") || pu.Host == "" {
			add(field, "must be an http(s) URL, got %q", u)
		}
	}
	if p.KubeProxy.SyncPeriod.Duration <= 0 {
		add("kubeProxy.syncPeriod", "must be > 0")
	} else if p.KubeProxy.SyncPeriod.Duration > 24*time.Hour {
		add("kubeProxy.syncPeriod", "must be at most 24h (thresholds are multiples of it)")
	}
	if p.KubeProxy.ScrapeTimeout.Duration <= 0 {
		add("kubeProxy.scrapeTimeout", "must be > 0")
	}
	if p.Guardrails.MaxActionsPerHour < 1 {
		add("guardrails.maxActionsPerHour", "must be >= 1 (use mode: audit to act on nothing)")
	}
	if p.Guardrails.MaxActionsPerHour > MaxCount {
		add("guardrails.maxActionsPerHour", "must be at most %d", MaxCount)
	}
	if p.Guardrails.MaxTargetsPerCycle < 1 {
		add("guardrails.maxTargetsPerCycle", "must be >= 1")
	} else if p.Guardrails.MaxTargetsPerCycle > 100 {
		add("guardrails.maxTargetsPerCycle", "must be at most 100 (each may take actionTimeout)")
	}
	if p.Cluster.Namespace != "" && !ruleNameRE.MatchString(p.Cluster.Namespace) {
		add("cluster.namespace", "must be a valid namespace name")
	}
	if p.Cluster.BudgetSlots < 1 {
		add("cluster.budgetSlots", "must be >= 1")
	} else if p.Cluster.BudgetSlots > 1000 {
		add("cluster.budgetSlots", "must be at most 1000")
	}
	if p.Cluster.BudgetTTL.Duration < 10*time.Second {
		add("cluster.budgetTTL", "must be at least 10s")
	} else if p.Cluster.BudgetTTL.Duration > 24*time.Hour {
		add("cluster.budgetTTL", "must be at most 24h")
	}
	if p.Cluster.StormMaxShare <= 0 || p.Cluster.StormMaxShare > 1 {
		add("cluster.stormMaxShare", "must be in (0, 1]")
	}
	if p.Cluster.StormMinNodes < 1 {
		add("cluster.stormMinNodes", "must be >= 1")
	}
	if len(p.Rules) == 0 {
		add("rules", "at least one rule is required")
	}
	names := map[string]int{}
	for i, r := range p.Rules {
		at := func(f string) string { return fmt.Sprintf("rules[%d].%s", i, f) }
		switch {
		case r.Name == "":
			add(at("name"), "required")
		case !ruleNameRE.MatchString(r.Name):
			add(at("name"), "must be lower-case letters, digits and '-', at most 63 characters")
		default:
			if j, dup := names[r.Name]; dup {
				add(at("name"), "duplicate rule name (also rules[%d])", j)
			}
			names[r.Name] = i
		}
		if r.Detector.Type == "" {
			add(at("detector"), "required")
		}
		if r.For.Duration < 0 {
			add(at("for"), "must be >= 0")
		} else if r.For.Duration > 30*24*time.Hour {
			add(at("for"), "must be at most 720h")
		}
		if r.Cooldown.Duration < 0 {
			add(at("cooldown"), "must be >= 0")
		} else if r.Cooldown.Duration > 30*24*time.Hour {
			add(at("cooldown"), "must be at most 720h")
		}
		if r.RateLimit.Max < 1 {
			add(at("rateLimit.max"), "must be >= 1")
		} else if r.RateLimit.Max > MaxCount {
			add(at("rateLimit.max"), "must be at most %d", MaxCount)
		}
		if r.RateLimit.Per.Duration <= 0 {
			add(at("rateLimit.per"), "must be > 0")
		} else if r.RateLimit.Per.Duration > 30*24*time.Hour {
			add(at("rateLimit.per"), "must be at most 720h")
		}
		if r.MaxAttempts < 1 {
			add(at("maxAttempts"), "must be >= 1")
		} else if r.MaxAttempts > 100 {
			add(at("maxAttempts"), "must be at most 100")
		}
		if r.VerifyAfter.Duration < 0 {
			add(at("verifyAfter"), "must be >= 0")
		} else if r.VerifyAfter.Duration > 24*time.Hour {
			add(at("verifyAfter"), "must be at most 24h")
		}
	}
	return errs
}
