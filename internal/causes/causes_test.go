package causes

import (
	"math"
	"net/netip"
	"strings"
	"testing"
	"time"
)

func kinds(cs []Cause) string {
	var k []string
	for _, c := range cs {
		k = append(k, string(c.Kind))
	}
	return strings.Join(k, ",")
}

func TestRank(t *testing.T) {
	pfx := func(s ...string) []netip.Prefix {
		var out []netip.Prefix
		for _, x := range s {
			out = append(out, netip.MustParsePrefix(x))
		}
		return out
	}
	cases := []struct {
		name         string
		in           Inputs
		likely, out  string
		top          string // substring of the top summary
		topScoreLow  float64
		topScoreHigh float64
	}{
		{name: "nothing observed"},
		{
			name:   "churn only: 18000 changes in 2 min is 150/s, 15x the guide's 10/s",
			in:     Inputs{Churn: &Churn{Changes: 18000, Window: 2 * time.Minute}},
			likely: "endpoint-churn", top: "endpoint churn 150 changes/s (18000 in the last 2m0s",
			topScoreLow: 15, topScoreHigh: 15,
		},
		{
			// Field guide 2's alert is rate(...[5m]) > 10: per second. 11
			// changes in 5 minutes (0.037/s) is a quiet cluster, not
			// churn 1.1x past the threshold.
			name: "11 changes in 5 min is quiet: the guide's 10 is per second",
			in:   Inputs{Churn: &Churn{Changes: 11, Window: 5 * time.Minute}},
			out:  "endpoint-churn",
		},
		{
			name:   "just past the guide: 3300 changes in 5 min is 11/s",
			in:     Inputs{Churn: &Churn{Changes: 3300, Window: 5 * time.Minute}},
			likely: "endpoint-churn", top: "endpoint churn 11 changes/s", topScoreLow: 1.1, topScoreHigh: 1.1,
		},
		{
			name: "quiet churn is ruled out",
			in:   Inputs{Churn: &Churn{Changes: 2, Window: 5 * time.Minute}},
			out:  "endpoint-churn",
		},
		{
			name: "throttling 80% outranks churn 2x",
			in: Inputs{
				Churn:      &Churn{Changes: 6000, Window: 5 * time.Minute}, // 20/s
				Throttling: &Throttling{Periods: 100, Throttled: 80, ThrottledTime: 4 * time.Second, Window: time.Minute, Cgroup: "/kp"},
			},
			likely: "cpu-throttling,endpoint-churn", top: "kube-proxy CPU-throttled in 80% of periods over the last 1m0s (80 of 100, 4s throttled, summed over CPUs; cgroup /kp",
			topScoreLow: 3.2, topScoreHigh: 3.2,
		},
		{
			name:   "throttling since the cgroup started",
			in:     Inputs{Throttling: &Throttling{Periods: 10, Throttled: 5, Lifetime: true, Cgroup: "/kp"}},
			likely: "cpu-throttling", top: "since its cgroup started", topScoreLow: 2, topScoreHigh: 2,
		},
		{
			name: "no quota periods: not throttled",
			in:   Inputs{Throttling: &Throttling{Periods: 0}},
			out:  "cpu-throttling",
		},
		{
			name: "slow save 640ms is bad; 12k rules concerning",
			in: Inputs{Rules: []RuleSet{
				{Family: "IPv4", Backend: "legacy", Table: "nat", Rules: 12000, Save: 640 * time.Millisecond},
				{Family: "IPv4", Backend: "legacy", Table: "filter", Rules: 40},
			}},
			likely: "slow-save,rule-count", top: "IPv4 legacy save took 640ms (field guide 2: > 500 ms is bad)",
			topScoreLow: 6.4, topScoreHigh: 6.4,
		},
		{
			name:   "a 150 ms save is a problem, small tables are not",
			in:     Inputs{Rules: []RuleSet{{Family: "IPv6", Backend: "nft", Table: "nat", Rules: 30, Save: 150 * time.Millisecond}}},
			likely: "slow-save", out: "rule-count", top: "> 100 ms is a problem", topScoreLow: 1.5, topScoreHigh: 1.5,
		},
		{
			name: "another program on the lock, measured holds",
			in: Inputs{Lock: &LockWindow{Waiters: 2, Holders: []LockHolder{
				{Program: "kube-proxy", PID: 1, KubeProxy: true, Holds: 9, Longest: 5 * time.Second},
				{Program: "python3", PID: 77, Holds: 3, Longest: 2100 * time.Millisecond},
			}}},
			likely: "xtables-lock-holder", top: "xtables lock held by python3 (pid 77), not kube-proxy: 3 holds, longest 2.1s; 2 waiting",
			topScoreLow: 2.1, topScoreHigh: 2.1,
		},
		{
			name:   "snapshot of another holder: at the threshold",
			in:     Inputs{Lock: &LockWindow{Waiters: 1, Holders: []LockHolder{{Program: "iptables", PID: 9, Holds: 1}}}},
			likely: "xtables-lock-holder", top: "holding it when the symptom was seen", topScoreLow: 1, topScoreHigh: 1,
		},
		{
			name: "kube-proxy alone on the lock is no cause",
			in:   Inputs{Lock: &LockWindow{Holders: []LockHolder{{Program: "iptables-restor", KubeProxy: true}}}},
			out:  "xtables-lock-holder",
		},
		{
			name:   "softirq 25% vs 10%",
			in:     Inputs{SoftIRQ: &SoftIRQStat{Share: 0.25, Window: 30 * time.Second}},
			likely: "node-softirq", top: "node softirq 25.0% of CPU time over the last 30s", topScoreLow: 2.5, topScoreHigh: 2.5,
		},
		{
			name: "clusterCIDR not containing the podCIDR; minSyncPeriod 30s on 1.34",
			in: Inputs{Config: &Config{ClusterCIDRs: pfx("10.0.0.0/16"), NodePodCIDRs: pfx("10.244.1.0/24"),
				MinSyncPeriod: 30 * time.Second, Version: "1.34", AtLeast128: true}},
			likely: "large-min-sync-period,cluster-cidr-mismatch", top: "minSyncPeriod 30s on 1.34",
			topScoreLow: 3, topScoreHigh: 3,
		},
		{
			name: "hygienic config; minSyncPeriod unjudged before 1.28",
			in: Inputs{Config: &Config{ClusterCIDRs: pfx("10.244.0.0/16", "fd00::/48"), NodePodCIDRs: pfx("10.244.1.0/24", "fd00::1:0/112"),
				MinSyncPeriod: 30 * time.Second}},
			out: "cluster-cidr-mismatch",
		},
		{
			name:   "a wider podCIDR is not contained",
			in:     Inputs{Config: &Config{ClusterCIDRs: pfx("10.244.1.0/24"), NodePodCIDRs: pfx("10.244.0.0/16")}},
			likely: "cluster-cidr-mismatch", top: "does not contain", topScoreLow: 1, topScoreHigh: 1,
		},
		{
			name:   "absurd figures are capped, never NaN",
			in:     Inputs{Churn: &Churn{Changes: math.Inf(1), Window: time.Second}, SoftIRQ: &SoftIRQStat{Share: math.NaN(), Window: time.Second}},
			likely: "endpoint-churn", out: "node-softirq", top: "endpoint churn", topScoreLow: maxScore, topScoreHigh: maxScore,
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r := Rank(tc.in)
			if got := kinds(r.Likely); got != tc.likely {
				t.Errorf("likely %q, want %q (%+v)", got, tc.likely, r)
			}
			if got := kinds(r.RuledOut); got != tc.out {
				t.Errorf("ruled out %q, want %q", got, tc.out)
			}
			if tc.top == "" {
				if r.Top() != "" {
					t.Errorf("top %q, want none", r.Top())
				}
				return
			}
			if !strings.Contains(r.Top(), tc.top) {
				t.Errorf("top %q, want it to contain %q", r.Top(), tc.top)
			}
			if s := r.Likely[0].Score; s < tc.topScoreLow-1e-9 || s > tc.topScoreHigh+1e-9 {
				t.Errorf("top score %v, want %v..%v", s, tc.topScoreLow, tc.topScoreHigh)
			}
			for _, c := range append(r.Likely, r.RuledOut...) {
				if len(c.Figures) == 0 || c.Summary == "" {
					t.Errorf("%s without figures or summary: %+v", c.Kind, c)
				}
			}
		})
	}
}
