package cnichains

import (
	"fmt"
	"sort"
	"time"

	"github.com/remediate-dev/remediate/internal/iptables"
)

// Observation is what one save shows of one agent's top-level rules: its
// chains that are hook targets (the agent's declared hooks, or any jump
// from a built-in chain to a chain of the agent's prefixes) with their
// rule counts, and the hooks present. Per-endpoint and per-policy chains
// (cali-tw-*, KUBE-POD-FW-*) come and go with pods and are not looked at.
type Observation struct {
	// Chains maps "table/chain" to its rule count.
	Chains map[string]int
	// Hooks are the hooks present, by Hook.Key.
	Hooks map[string]Hook
}

// Empty reports whether the save shows none of the agent's top-level
// chains nor hooks.
func (o Observation) Empty() bool { return len(o.Chains) == 0 && len(o.Hooks) == 0 }

// Observe reads the agent's top-level chains and hooks from a parsed save.
func Observe(rs *iptables.Ruleset, a Agent) Observation {
	o := Observation{Chains: map[string]int{}, Hooks: map[string]Hook{}}
	if rs == nil {
		return o
	}
	for _, t := range rs.Tables {
		for _, c := range t.Chains {
			if !c.Builtin() {
				continue
			}
			for _, r := range c.Rules {
				if r.Target == "" || !a.Owns(r.Target) || t.Chain(r.Target) == nil {
					continue
				}
				h := Hook{Table: t.Name, From: c.Name, To: r.Target}
				o.Hooks[h.Key()] = h
			}
		}
	}
	for _, h := range a.Hooks {
		if c := rs.Table(h.Table).Chain(h.To); c != nil {
			o.Chains[h.Table+"/"+h.To] = len(c.Rules)
		}
	}
	for _, h := range o.Hooks {
		o.Chains[h.Table+"/"+h.To] = len(rs.Table(h.Table).Chain(h.To).Rules)
	}
	return o
}

// Defect kinds.
const (
	// HookMissing: a built-in chain no longer jumps to the agent's chain
	// (the chain exists, or the hook was seen before).
	HookMissing = "hook-missing"
	// ChainMissing: a chain of the agent seen before is gone.
	ChainMissing = "chain-missing"
	// ChainEmptied: a chain of the agent that had rules has none.
	ChainEmptied = "chain-emptied"
)

// Defect is one thing missing from an agent's rules in one save.
type Defect struct {
	Kind  string `json:"kind"`
	Table string `json:"table"`
	// Chain is the agent's chain; From the built-in chain of a missing
	// hook.
	Chain string `json:"chain"`
	From  string `json:"from,omitempty"`
	// Remembered is true when the defect is known from the memory only
	// (the save alone shows nothing wrong: the chain and its hook are
	// both gone); LastSeen is then when it was last seen.
	Remembered bool      `json:"remembered,omitempty"`
	LastSeen   time.Time `json:"lastSeen,omitempty"`
	// Rules is the chain's rule count when last seen with rules (chain
	// defects).
	Rules int `json:"rules,omitempty"`
}

// String says the defect in one clause.
func (d Defect) String() string {
	switch d.Kind {
	case HookMissing:
		return fmt.Sprintf("%s %s does not jump to %s", d.Table, d.From, d.Chain)
	case ChainMissing:
		return fmt.Sprintf("%s chain %s is gone (had %d rules, last seen %s)", d.Table, d.Chain, d.Rules, d.LastSeen.UTC().Format(time.RFC3339))
	case ChainEmptied:
		return fmt.Sprintf("%s chain %s is empty (had %d rules)", d.Table, d.Chain, d.Rules)
	}
	return d.Kind + " " + d.Table + " " + d.Chain
}

// Seen is the memory of one agent in one family and backend.
type Seen struct {
	// Chains maps "table/chain" to when it was last seen healthy.
	Chains map[string]SeenChain `json:"chains,omitempty"`
	// Hooks maps Hook.Key to when it was last seen.
	Hooks map[string]SeenHook `json:"hooks,omitempty"`
}

// SeenChain is a remembered chain: its rule count when last seen with
// rules, and when.
type SeenChain struct {
	Rules    int       `json:"rules"`
	LastSeen time.Time `json:"lastSeen"`
}

// SeenHook is a remembered hook.
type SeenHook struct {
	Hook     Hook      `json:"hook"`
	LastSeen time.Time `json:"lastSeen"`
}

// Check compares an observation of the agent with its declared hooks and
// with what was seen before. A declared hook is expected when its target
// chain exists now; a remembered hook or chain is expected always (until
// Remember forgets it). The result is sorted.
func Check(o Observation, a Agent, mem Seen) []Defect {
	var out []Defect
	missing := map[string]bool{}
	for _, h := range a.Hooks {
		if _, ok := o.Chains[h.Table+"/"+h.To]; !ok {
			continue
		}
		if _, ok := o.Hooks[h.Key()]; !ok {
			missing[h.Key()] = true
			out = append(out, Defect{Kind: HookMissing, Table: h.Table, From: h.From, Chain: h.To})
		}
	}
	for k, sh := range mem.Hooks {
		if _, ok := o.Hooks[k]; ok || missing[k] {
			continue
		}
		_, chainThere := o.Chains[sh.Hook.Table+"/"+sh.Hook.To]
		out = append(out, Defect{Kind: HookMissing, Table: sh.Hook.Table, From: sh.Hook.From, Chain: sh.Hook.To,
			Remembered: !chainThere, LastSeen: sh.LastSeen})
	}
	for k, sc := range mem.Chains {
		table, chain := splitKey(k)
		n, ok := o.Chains[k]
		switch {
		case !ok:
			out = append(out, Defect{Kind: ChainMissing, Table: table, Chain: chain, Remembered: true, LastSeen: sc.LastSeen, Rules: sc.Rules})
		case n == 0 && sc.Rules > 0:
			out = append(out, Defect{Kind: ChainEmptied, Table: table, Chain: chain, LastSeen: sc.LastSeen, Rules: sc.Rules})
		}
	}
	sort.Slice(out, func(i, j int) bool {
		x, y := out[i], out[j]
		if x.Table != y.Table {
			return x.Table < y.Table
		}
		if x.Chain != y.Chain {
			return x.Chain < y.Chain
		}
		if x.Kind != y.Kind {
			return x.Kind < y.Kind
		}
		return x.From < y.From
	})
	return out
}

// MaxRemembered bounds the chains and hooks remembered per agent, family
// and backend (an agent has at most ten hooks; the bound keeps a hostile
// rule set from growing the state file).
const MaxRemembered = 64

// Remember folds an observation into the memory at now and forgets what
// was not seen for forgetAfter (0: never). A chain is refreshed when seen
// with rules (or when it never had any), so that a flushed chain stays
// remembered with its old count. It returns the new memory and the keys
// it forgot.
func Remember(mem Seen, o Observation, now time.Time, forgetAfter time.Duration) (Seen, []string) {
	out := Seen{Chains: map[string]SeenChain{}, Hooks: map[string]SeenHook{}}
	for k, v := range mem.Chains {
		out.Chains[k] = v
	}
	for k, v := range mem.Hooks {
		out.Hooks[k] = v
	}
	for _, k := range sortedKeys(o.Chains) {
		n := o.Chains[k]
		old, had := out.Chains[k]
		if !had && len(out.Chains) >= MaxRemembered {
			continue
		}
		if n > 0 || !had || old.Rules == 0 {
			out.Chains[k] = SeenChain{Rules: n, LastSeen: now}
		}
	}
	for _, k := range sortedKeys(o.Hooks) {
		if _, had := out.Hooks[k]; !had && len(out.Hooks) >= MaxRemembered {
			continue
		}
		out.Hooks[k] = SeenHook{Hook: o.Hooks[k], LastSeen: now}
	}
	var forgot []string
	if forgetAfter > 0 {
		for k, v := range out.Chains {
			if now.Sub(v.LastSeen) > forgetAfter {
				delete(out.Chains, k)
				forgot = append(forgot, k)
			}
		}
		for k, v := range out.Hooks {
			if now.Sub(v.LastSeen) > forgetAfter {
				delete(out.Hooks, k)
				forgot = append(forgot, k)
			}
		}
	}
	sort.Strings(forgot)
	return out, forgot
}

func splitKey(k string) (table, chain string) {
	for i := 0; i < len(k); i++ {
		if k[i] == '/' {
			return k[:i], k[i+1:]
		}
	}
	return "", k
}

func sortedKeys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}
