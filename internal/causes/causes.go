// Package causes ranks the likely causes behind a kube-proxy symptom (slow
// sync, stale sync, growing pending changes, xtables lock contention) from
// typed observations: endpoint churn, kube-proxy's CPU throttling, rule
// counts and save times, xtables lock holders, node softirq time and
// kube-proxy's configuration. Rank is a pure function: observations in,
// causes with a score and their figures out; the detectors gather the
// observations and put the ranked list in their findings' evidence.
//
// A score is the observed figure over the threshold it is judged against
// (the field guides' where they give one), so 1 means "at the threshold"
// and causes of different kinds compare by how far past their own
// threshold they are. Only causes at or past their threshold are likely;
// the others are reported as checked and ruled out, with their figure.
//
// RankSandbox (sandbox.go) does the same for failing pod sandboxes
// (KubeletPodStartup): the kubelet's classified sandbox Events, the CNI
// configuration, the CNI agent's pods and the xtables lock.
package causes

import (
	"context"
	"fmt"
	"math"
	"net/netip"
	"sort"
	"strings"
	"time"
)

// Kind names a cause.
type Kind string

// The kinds of cause.
const (
	// EndpointChurn: endpoint changes arriving fast (every change makes
	// kube-proxy rewrite rules, in iptables mode under the xtables lock).
	EndpointChurn Kind = "endpoint-churn"
	// CPUThrottling: kube-proxy's cgroup exhausting its CPU quota.
	CPUThrottling Kind = "cpu-throttling"
	// RuleCount: a large rule set (every full sync rewrites it).
	RuleCount Kind = "rule-count"
	// SlowSave: reading the rule set (iptables-save) is slow: kube-proxy's
	// restores are correspondingly slow.
	SlowSave Kind = "slow-save"
	// XtablesLockHolder: another process held the xtables lock kube-proxy needs.
	XtablesLockHolder Kind = "xtables-lock-holder"
	// SoftIRQ: the node spends a large share of CPU time in softirq
	// (packet processing), competing with kube-proxy.
	SoftIRQ Kind = "node-softirq"
	// ClusterCIDRMismatch: kube-proxy's clusterCIDR does not contain the
	// node's podCIDR (its local-traffic detection is wrong).
	ClusterCIDRMismatch Kind = "cluster-cidr-mismatch"
	// LargeMinSyncPeriod: a minSyncPeriod tuned for pre-1.28 full
	// rewrites, which on 1.28+ only delays convergence.
	LargeMinSyncPeriod Kind = "large-min-sync-period"
)

// Thresholds (the field guides' figures where they give one; see the
// runbook for each).
const (
	// ChurnPerSecond: endpoint changes per second above which churn
	// drives lock contention. Field guide 2's KubeProxyEndpointChurn alert
	// is rate(kubeproxy_sync_proxy_rules_endpoint_changes_total[5m]) > 10:
	// PromQL's rate is per second, so 10 changes per second averaged over
	// 5 minutes (3,000 changes in 5 minutes).
	ChurnPerSecond = 10.0
	// ThrottledShare: share of CPU periods throttled (the common
	// CPUThrottlingHigh alert's 25%; field guide 4 names throttling
	// without a figure).
	ThrottledShare = 0.25
	// RulesConcerning: rules in one table (field guide 1: plan a
	// migration before 10,000; guide 2: > 10k is concerning).
	RulesConcerning = 10000.0
	// SaveProblem and SaveBad: iptables-save run time (field guide 2:
	// > 100 ms a problem, > 500 ms bad).
	SaveProblem = 100 * time.Millisecond
	SaveBad     = 500 * time.Millisecond
	// LockHoldLong: a lock hold longer than this drops connections
	// (field guide 2: 1-3 s holds).
	LockHoldLong = time.Second
	// SoftIRQShare: node CPU share in softirq (no guide figure; guide 1
	// and 3 say to correlate with it; 10% is far above an idle node's).
	SoftIRQShareHigh = 0.10
	// MinSyncLarge: the legacy minSyncPeriod tuning field guide 2 shows
	// (10 s) which guide 1 says to revisit on 1.28+.
	MinSyncLarge = 10 * time.Second
)

// Figure is one number behind a cause.
type Figure struct {
	Name  string  `json:"name"`
	Value float64 `json:"value"`
	// Unit: "", "s", "ratio", "per-s", "per-min", "rules".
	Unit string `json:"unit,omitempty"`
}

// Cause is one evaluated cause.
type Cause struct {
	Kind Kind `json:"cause"`
	// Score is the figure over its threshold: >= 1 likely.
	Score float64 `json:"score"`
	// Summary is one line with the figures.
	Summary string   `json:"summary"`
	Figures []Figure `json:"figures"`
}

// Likely reports whether the cause is at or past its threshold.
func (c Cause) Likely() bool { return c.Score >= 1 }

// Churn is the endpoint-change counter's increase over a window
// (kubeproxy_sync_proxy_rules_endpoint_changes_total).
type Churn struct {
	Changes float64
	Window  time.Duration
}

// Throttling is kube-proxy's cgroup cpu.stat increase over a window (or
// since the cgroup started, when Lifetime).
type Throttling struct {
	Periods, Throttled uint64
	ThrottledTime      time.Duration
	Window             time.Duration
	// Lifetime: the figures are the cgroup's totals (no earlier sample).
	Lifetime bool
	// Cgroup is the cgroup path (for the summary).
	Cgroup string
}

// RuleSet is what is known of one rule set: its size and how long reading
// it took.
type RuleSet struct {
	// Family ("IPv4"), Backend ("legacy", "nft") and Table ("nat").
	Family, Backend, Table string
	// Rules in the table; 0 unknown.
	Rules int
	// Save is the duration of the last save of the family and backend
	// (0 unknown); set on one RuleSet per family and backend.
	Save time.Duration
}

// LockHolder is one process seen holding the xtables lock in the window.
type LockHolder struct {
	Program string
	PID     int32
	// KubeProxy: the holder is kube-proxy or its child (its own restore
	// is the sync, not a cause).
	KubeProxy bool
	// Holds is how many holds were seen (1 for a snapshot).
	Holds int
	// Longest is the longest hold seen (0 unknown: seen at one instant).
	Longest time.Duration
}

// LockWindow is what was seen of the xtables lock in a window. Today it is
// the current snapshot of /proc/locks; a hold history can fill it the same
// way.
type LockWindow struct {
	Holders []LockHolder
	// Waiters is the largest number of waiters seen.
	Waiters int
	Window  time.Duration
}

// SoftIRQStat is the node's softirq share of CPU time over a window.
type SoftIRQStat struct {
	Share  float64
	Window time.Duration
}

// Config is kube-proxy's configuration hygiene input.
type Config struct {
	// ClusterCIDRs from /configz (comma-separated in kube-proxy; parsed).
	ClusterCIDRs []netip.Prefix
	// NodePodCIDRs from the Node object.
	NodePodCIDRs []netip.Prefix
	// MinSyncPeriod from /configz.
	MinSyncPeriod time.Duration
	// Version is kube-proxy's version as known ("1.34", "1.33+"; "" not
	// known).
	Version string
	// AtLeast128 is true when kube-proxy is known to be 1.28 or later
	// (from its version, or from series only newer versions export).
	AtLeast128 bool
}

// Inputs are the observations; nil or empty fields were not observed.
type Inputs struct {
	Churn      *Churn
	Throttling *Throttling
	Rules      []RuleSet
	Lock       *LockWindow
	SoftIRQ    *SoftIRQStat
	Config     *Config
	// Logs are the classified lines of kube-proxy's and the CNI agents'
	// logs over a window (logs.go).
	Logs []LogLine
}

// Result is the ranked answer.
type Result struct {
	// Likely are the causes at or past their threshold, highest score
	// first.
	Likely []Cause `json:"likely"`
	// RuledOut are the causes checked and found under their threshold.
	RuledOut []Cause `json:"ruledOut,omitempty"`
}

// Top returns the one-line summary of the highest-ranked likely cause, or
// "" when there is none.
func (r Result) Top() string {
	if len(r.Likely) == 0 {
		return ""
	}
	return r.Likely[0].Summary
}

// maxScore caps a score so one absurd figure cannot hide the rest of the
// ranking's order (it stays first either way).
const maxScore = 100

// Rank evaluates every observed cause and ranks them. Ties keep a fixed
// order by kind.
func Rank(in Inputs) Result {
	var all []Cause
	if c := in.Churn; c != nil && c.Window > 0 {
		perSec := c.Changes / c.Window.Seconds()
		all = append(all, Cause{Kind: EndpointChurn, Score: perSec / ChurnPerSecond,
			Summary: fmt.Sprintf("endpoint churn %.3g changes/s (%.0f in the last %s; field guide 2's churn alert: > %.0f/s over 5 min drives lock contention)",
				perSec, c.Changes, dur(c.Window), ChurnPerSecond),
			Figures: []Figure{{"changesPerSecond", perSec, "per-s"}, {"changes", c.Changes, ""}, {"windowSeconds", c.Window.Seconds(), "s"}}})
	}
	if t := in.Throttling; t != nil {
		share := 0.0
		if t.Periods > 0 {
			share = float64(t.Throttled) / float64(t.Periods)
		}
		over := "over the last " + dur(t.Window)
		if t.Lifetime {
			over = "since its cgroup started"
		}
		all = append(all, Cause{Kind: CPUThrottling, Score: share / ThrottledShare,
			Summary: fmt.Sprintf("kube-proxy CPU-throttled in %.0f%% of periods %s (%d of %d, %s throttled, summed over CPUs; cgroup %s; threshold %.0f%%)",
				share*100, over, t.Throttled, t.Periods, dur(t.ThrottledTime), t.Cgroup, ThrottledShare*100),
			Figures: []Figure{{"throttledShare", share, "ratio"}, {"throttledPeriods", float64(t.Throttled), ""},
				{"periods", float64(t.Periods), ""}, {"throttledSeconds", t.ThrottledTime.Seconds(), "s"}, {"windowSeconds", t.Window.Seconds(), "s"}}})
	}
	var bigRules *RuleSet
	var slowest *RuleSet
	for i := range in.Rules {
		r := &in.Rules[i]
		if r.Rules > 0 && (bigRules == nil || r.Rules > bigRules.Rules) {
			bigRules = r
		}
		if r.Save > 0 && (slowest == nil || r.Save > slowest.Save) {
			slowest = r
		}
	}
	if r := bigRules; r != nil {
		all = append(all, Cause{Kind: RuleCount, Score: float64(r.Rules) / RulesConcerning,
			Summary: fmt.Sprintf("%s %s %s table has %d rules (field guides 1 and 2: > %.0f is concerning)", r.Family, backend(r.Backend), r.Table, r.Rules, RulesConcerning),
			Figures: []Figure{{"rules", float64(r.Rules), "rules"}}})
	}
	if r := slowest; r != nil {
		verdict := "under the 100 ms the field guide calls a problem"
		switch {
		case r.Save > SaveBad:
			verdict = "field guide 2: > 500 ms is bad"
		case r.Save > SaveProblem:
			verdict = "field guide 2: > 100 ms is a problem"
		}
		all = append(all, Cause{Kind: SlowSave, Score: float64(r.Save) / float64(SaveProblem),
			Summary: fmt.Sprintf("%s %s save took %s (%s)", r.Family, backend(r.Backend), dur(r.Save), verdict),
			Figures: []Figure{{"saveSeconds", r.Save.Seconds(), "s"}}})
	}
	if l := in.Lock; l != nil {
		var others []LockHolder
		for _, h := range l.Holders {
			if !h.KubeProxy {
				others = append(others, h)
			}
		}
		if len(others) > 0 {
			sort.SliceStable(others, func(i, j int) bool { return others[i].Longest > others[j].Longest })
			h := others[0]
			// A hold seen at one instant while kube-proxy has a symptom is
			// at the threshold; a measured hold scores by its length.
			score := 1.0
			if h.Longest > 0 {
				score = float64(h.Longest) / float64(LockHoldLong)
			}
			held := "holding it when the symptom was seen"
			if h.Longest > 0 {
				held = fmt.Sprintf("%d holds, longest %s", h.Holds, dur(h.Longest))
			}
			names := make([]string, 0, len(others))
			for _, o := range others {
				names = append(names, fmt.Sprintf("%s (pid %d)", o.Program, o.PID))
			}
			all = append(all, Cause{Kind: XtablesLockHolder, Score: score,
				Summary: fmt.Sprintf("xtables lock held by %s, not kube-proxy: %s; %d waiting", strings.Join(names, ", "), held, l.Waiters),
				Figures: []Figure{{"holders", float64(len(others)), ""}, {"longestHoldSeconds", h.Longest.Seconds(), "s"},
					{"holds", float64(h.Holds), ""}, {"waiters", float64(l.Waiters), ""}}})
		} else if len(l.Holders) > 0 || l.Waiters > 0 {
			all = append(all, Cause{Kind: XtablesLockHolder, Score: 0,
				Summary: fmt.Sprintf("xtables lock held only by kube-proxy; %d waiting", l.Waiters),
				Figures: []Figure{{"holders", 0, ""}, {"waiters", float64(l.Waiters), ""}}})
		} else {
			all = append(all, Cause{Kind: XtablesLockHolder, Score: 0, Summary: "xtables lock free",
				Figures: []Figure{{"holders", 0, ""}, {"waiters", 0, ""}}})
		}
	}
	if s := in.SoftIRQ; s != nil && s.Window > 0 {
		all = append(all, Cause{Kind: SoftIRQ, Score: s.Share / SoftIRQShareHigh,
			Summary: fmt.Sprintf("node softirq %.1f%% of CPU time over the last %s (threshold %.0f%%)", s.Share*100, dur(s.Window), SoftIRQShareHigh*100),
			Figures: []Figure{{"softirqShare", s.Share, "ratio"}, {"windowSeconds", s.Window.Seconds(), "s"}}})
	}
	if c := in.Config; c != nil {
		all = append(all, configCauses(c)...)
	}
	for _, l := range in.Logs {
		all = append(all, logCause(l))
	}
	return ranked(all)
}

// ranked clamps the causes' scores to [0, maxScore] (NaN is 0), sorts them
// by score, highest first (ties keep their order), and splits them into
// likely and ruled out.
func ranked(all []Cause) Result {
	for i := range all {
		if math.IsNaN(all[i].Score) || all[i].Score < 0 {
			all[i].Score = 0
		}
		all[i].Score = math.Min(all[i].Score, maxScore)
	}
	sort.SliceStable(all, func(i, j int) bool { return all[i].Score > all[j].Score })
	var out Result
	for _, c := range all {
		if c.Likely() {
			out.Likely = append(out.Likely, c)
		} else {
			out.RuledOut = append(out.RuledOut, c)
		}
	}
	return out
}

func configCauses(c *Config) []Cause {
	var out []Cause
	if len(c.ClusterCIDRs) > 0 && len(c.NodePodCIDRs) > 0 {
		var outside []string
		for _, pod := range c.NodePodCIDRs {
			in := false
			for _, cl := range c.ClusterCIDRs {
				if cl.Addr().Is4() == pod.Addr().Is4() && cl.Bits() <= pod.Bits() && cl.Contains(pod.Addr()) {
					in = true
				}
			}
			if !in {
				outside = append(outside, pod.String())
			}
		}
		cl := make([]string, 0, len(c.ClusterCIDRs))
		for _, p := range c.ClusterCIDRs {
			cl = append(cl, p.String())
		}
		if len(outside) > 0 {
			out = append(out, Cause{Kind: ClusterCIDRMismatch, Score: 1,
				Summary: fmt.Sprintf("kube-proxy clusterCIDR %s does not contain this node's podCIDR %s (field guide 4: clusterCIDR must match the pod network)",
					strings.Join(cl, ","), strings.Join(outside, ",")),
				Figures: []Figure{{"podCIDRsOutside", float64(len(outside)), ""}}})
		} else {
			out = append(out, Cause{Kind: ClusterCIDRMismatch, Score: 0,
				Summary: fmt.Sprintf("kube-proxy clusterCIDR %s contains the node's podCIDR", strings.Join(cl, ",")),
				Figures: []Figure{{"podCIDRsOutside", 0, ""}}})
		}
	}
	if c.AtLeast128 && c.MinSyncPeriod > 0 {
		ver := c.Version
		if ver == "" {
			ver = "1.28+"
		}
		out = append(out, Cause{Kind: LargeMinSyncPeriod, Score: float64(c.MinSyncPeriod) / float64(MinSyncLarge),
			Summary: fmt.Sprintf("kube-proxy minSyncPeriod %s on %s (field guide 1: on 1.28+ values like the legacy %s only delay convergence)",
				dur(c.MinSyncPeriod), ver, dur(MinSyncLarge)),
			Figures: []Figure{{"minSyncPeriodSeconds", c.MinSyncPeriod.Seconds(), "s"}}})
	}
	return out
}

func backend(b string) string {
	if b == "" {
		return "(backend unknown)"
	}
	return b
}

// dur rounds a duration for a summary.
func dur(d time.Duration) string {
	switch {
	case d >= time.Minute:
		return d.Round(time.Second).String()
	case d >= time.Second:
		return d.Round(100 * time.Millisecond).String()
	default:
		return d.Round(time.Millisecond).String()
	}
}

// LockSource gives what was seen of the xtables lock over the last window:
// implemented by a hold history; without one the detectors fill LockWindow
// from the current /proc/locks snapshot.
type LockSource interface {
	LockWindow(ctx context.Context, window time.Duration) (*LockWindow, error)
}

// Evidence keys of a finding that carries causes.
const (
	// EvidenceTop is the top likely cause's one-line summary (a string;
	// absent when no cause is likely).
	EvidenceTop = "topCause"
	// EvidenceLikely is the ranked []Cause at or past their thresholds.
	EvidenceLikely = "likelyCauses"
	// EvidenceRuledOut is the []Cause checked and under their thresholds.
	EvidenceRuledOut = "ruledOutCauses"
	// EvidenceNotObserved lists why a cause could not be judged
	// ([]string).
	EvidenceNotObserved = "causesNotObserved"
)

// Attach puts the result into a finding's evidence (ev must not be nil).
func (r Result) Attach(ev map[string]any, notObserved []string) {
	if top := r.Top(); top != "" {
		ev[EvidenceTop] = top
	}
	ev[EvidenceLikely] = nonNil(r.Likely)
	if len(r.RuledOut) > 0 {
		ev[EvidenceRuledOut] = r.RuledOut
	}
	if len(notObserved) > 0 {
		ev[EvidenceNotObserved] = notObserved
	}
}

func nonNil(c []Cause) []Cause {
	if c == nil {
		return []Cause{}
	}
	return c
}
