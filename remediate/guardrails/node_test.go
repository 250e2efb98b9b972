package guardrails

import (
	"context"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/remediate-dev/remediate/internal/finding"
	"github.com/remediate-dev/remediate/policy"
)

type fakeLedger struct {
	escalated map[string][2]any
	unknown   time.Time
	attempts  []Attempt
}

func (l *fakeLedger) Escalated(key string) (int, string, bool) {
	e, ok := l.escalated[key]
	if !ok {
		return 0, "", false
	}
	return e[0].(int), e[1].(string), true
}
func (l *fakeLedger) UnknownHistorySince() time.Time { return l.unknown }
func (l *fakeLedger) Attempts() []Attempt            { return l.attempts }

type named struct{ name string }

func (n named) Name() string                          { return n.name }
func (n named) Check(context.Context, *Request) error { return nil }

// TestChainOrder: the order is the one written down in Chain's doc, nil
// cluster guardrails are left out, the fleet controls go before the
// budget and dry-run is last.
func TestChainOrder(t *testing.T) {
	acted := 0
	n := Node{Ledger: &fakeLedger{}, MaxActionsPerHour: 1, MaxTargetsPerCycle: 1, Acted: &acted}
	full := Cluster{OptOut: named{GuardOptOut}, Freshness: named{GuardFreshness}, Storm: named{GuardStorm}, Budget: named{GuardBudget},
		FleetPause: named{GuardFleetPause}, KubeProxyRollout: named{GuardKubeProxyRollout}}
	names := func(gs []Guardrail) string {
		var s []string
		for _, g := range gs {
			s = append(s, g.Name())
		}
		return strings.Join(s, ",")
	}
	if got, want := names(Chain(n, full, "mode audit")), "escalation,cooldown,rule-rate-limit,node-rate-limit,max-targets-per-cycle,node-opt-out,api-freshness,storm-guard,fleet-pause,kube-proxy-rollout,cluster-budget,dry-run"; got != want {
		t.Fatalf("chain\n got %s\nwant %s", got, want)
	}
	if got, want := names(Chain(n, Cluster{Freshness: named{GuardFreshness}, Budget: named{GuardBudget}}, "")), "escalation,cooldown,rule-rate-limit,node-rate-limit,max-targets-per-cycle,api-freshness,cluster-budget,dry-run"; got != want {
		t.Fatalf("no-access chain\n got %s\nwant %s", got, want)
	}
}

// TestChainTakesEveryClusterField: a field added to Cluster and not to
// Chain would be a guardrail built and never checked; each field is a
// single Guardrail (no list of extras beside the named ones).
func TestChainTakesEveryClusterField(t *testing.T) {
	var c Cluster
	v := reflect.ValueOf(&c).Elem()
	gt := reflect.TypeOf((*Guardrail)(nil)).Elem()
	for i := 0; i < v.NumField(); i++ {
		f := v.Type().Field(i)
		if f.Type != gt {
			t.Fatalf("Cluster.%s is a %s, not a Guardrail: one named field per guardrail", f.Name, f.Type)
		}
		v.Field(i).Set(reflect.ValueOf(named{"field:" + f.Name}))
	}
	seen := map[string]int{}
	for _, g := range Chain(Node{}, c, "") {
		seen[g.Name()]++
	}
	for i := 0; i < v.NumField(); i++ {
		if n := seen["field:"+v.Type().Field(i).Name]; n != 1 {
			t.Errorf("Cluster.%s is in the chain %d times, want once", v.Type().Field(i).Name, n)
		}
	}
	if got := strings.Join(BlockNames(c), ","); strings.Contains(got, GuardDryRun) || len(BlockNames(c)) != len(Chain(Node{}, c, ""))-1 {
		t.Errorf("BlockNames = %s", got)
	}
}

func TestNodeGuardrails(t *testing.T) {
	now := time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)
	rule := &policy.Rule{Name: "r", Cooldown: policy.D(10 * time.Minute), RateLimit: policy.RateLimit{Max: 2, Per: policy.D(time.Hour)}}
	req := &Request{Rule: rule, ActionType: "A", Finding: finding.Finding{Target: "t"}, Now: now}
	ctx := context.Background()
	blockedBy := func(g Guardrail) string {
		if b := AsBlocked(g.Name(), g.Check(ctx, req)); b != nil {
			return b.Guardrail + ": " + b.Reason
		}
		return ""
	}
	l := &fakeLedger{escalated: map[string][2]any{}}
	acted := 0
	for _, g := range Chain(Node{Ledger: l, MaxActionsPerHour: 3, MaxTargetsPerCycle: 1, Acted: &acted}, Cluster{}, "") {
		if got := blockedBy(g); got != "" {
			t.Fatalf("empty ledger: %s", got)
		}
	}
	l.escalated["r|t"] = [2]any{3, "boom"}
	if got := blockedBy(Escalation{l}); !strings.Contains(got, "escalated after 3 failed attempts (last: boom)") {
		t.Errorf("escalation: %q", got)
	}
	l.attempts = []Attempt{
		{Time: now.Add(-50 * time.Minute), Rule: "r", Target: "u", Changed: true},
		{Time: now.Add(-20 * time.Minute), Rule: "other", Target: "t", Changed: true},
		{Time: now.Add(-5 * time.Minute), Rule: "r", Target: "t", Changed: false}, // refused: changed nothing
		{Time: now.Add(-4 * time.Minute), Rule: "r", Target: "t", Changed: true},
	}
	if got := blockedBy(Cooldown{l}); !strings.HasPrefix(got, "cooldown: last action on this target at 2026-01-01T11:56:00Z") {
		t.Errorf("cooldown: %q", got)
	}
	if got := blockedBy(RuleRateLimit{l}); !strings.HasPrefix(got, "rule-rate-limit: 2 actions of this rule in the last 1h0m0s (max 2); next slot at 2026-01-01T12:10:00Z") {
		t.Errorf("rule rate: %q", got)
	}
	if got := blockedBy(NodeRateLimit{l, 3}); !strings.HasPrefix(got, "node-rate-limit: 3 actions on this node") {
		t.Errorf("node rate: %q", got)
	}
	if got := blockedBy(NodeRateLimit{l, 4}); got != "" {
		t.Errorf("node rate under the limit: %q", got)
	}
	acted = 1
	if got := blockedBy(MaxTargets{1, &acted}); got != "max-targets-per-cycle: already 1 targets this cycle (max 1)" {
		t.Errorf("max targets: %q", got)
	}
	l.attempts, l.unknown = nil, now.Add(-time.Minute)
	for _, g := range []Guardrail{Cooldown{l}, RuleRateLimit{l}, NodeRateLimit{l, 3}} {
		if got := blockedBy(g); !strings.Contains(got, "state file was corrupt") {
			t.Errorf("%s with unknown history: %q", g.Name(), got)
		}
	}
	req.DryRun = true
	if got := blockedBy(DryRun{"mode audit"}); got != "dry-run: mode audit" {
		t.Errorf("dry run: %q", got)
	}
	p := &policy.Policy{Mode: policy.Enforce}
	if DryRunReason(p, rule, true) != "--dry-run" || DryRunReason(p, rule, false) != "" || DryRunReason(&policy.Policy{Mode: policy.Audit}, rule, false) != "mode audit" {
		t.Error("DryRunReason")
	}
}
