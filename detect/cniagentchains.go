package detect

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/remediate-dev/remediate/internal/cnichains"
	"github.com/remediate-dev/remediate/internal/finding"
	"github.com/remediate-dev/remediate/internal/iptables"
	"github.com/remediate-dev/remediate/internal/node"
	"github.com/remediate-dev/remediate/internal/procs"
	"github.com/remediate-dev/remediate/policy"
)

// CNIAgentChainsParams select the agents and saves CNIAgentChains checks.
type CNIAgentChainsParams struct {
	// Agents are the CNI agents checked when their process runs on the
	// node: flannel (flanneld), calico (calico-node), aws-vpc-cni
	// (aws-k8s-agent), kube-router, cilium (cilium-agent). Default: all.
	Agents []string `yaml:"agents"`
	// Families to check: IPv4, IPv6.
	Families []string `yaml:"families"`
	// Backends to check: legacy, nft (a save command not installed is
	// skipped).
	Backends []string `yaml:"backends"`
	// SaveTimeout bounds each save (shared with the other iptables
	// detectors of the cycle: one save per family and backend).
	SaveTimeout policy.Duration `yaml:"saveTimeout"`
	// ForgetAfter is how long a remembered chain or hook that is not seen
	// again stays expected (an agent whose configuration dropped a chain
	// stops being reported after it). 0 never forgets.
	ForgetAfter policy.Duration `yaml:"forgetAfter"`
}

// SetDefaults sets the defaults of CNIAgentChains (registry.Defaulter).
func (p *CNIAgentChainsParams) SetDefaults() {
	*p = CNIAgentChainsParams{
		Agents:      cnichains.Names(),
		Families:    []string{"IPv4", "IPv6"},
		Backends:    []string{"legacy", "nft"},
		SaveTimeout: policy.D(8 * time.Second),
		ForgetAfter: policy.D(6 * time.Hour),
	}
}

// Validate implements policy.Validator.
func (p *CNIAgentChainsParams) Validate() []policy.FieldError {
	var errs []policy.FieldError
	if len(p.Agents) == 0 {
		errs = append(errs, policy.FieldError{Field: "agents", Msg: "must name at least one agent (" + strings.Join(cnichains.Names(), ", ") + ")"})
	}
	for i, a := range p.Agents {
		if _, ok := cnichains.Lookup(a); !ok {
			errs = append(errs, policy.FieldError{Field: fmt.Sprintf("agents[%d]", i), Msg: fmt.Sprintf("unknown agent %q (known: %s)", a, strings.Join(cnichains.Names(), ", "))})
		}
	}
	errs = append(errs, validateFamilies(p.Families)...)
	errs = append(errs, validateBackends(p.Backends)...)
	errs = append(errs, validateSaveTimeout(p.SaveTimeout)...)
	if p.ForgetAfter.Duration < 0 {
		errs = append(errs, policy.FieldError{Field: "forgetAfter", Msg: "must be >= 0 (0 = never)"})
	}
	return errs
}

func init() {
	Define("CNIAgentChains",
		"a CNI agent runs on the node (a process of its name) but its own iptables chains or their jumps from the built-in chains are gone (iptables -F/-X, a firewalld reload): Flannel, Calico, the AWS VPC CNI, kube-router, Cilium in iptables mode; from the cycle's shared saves, with the chains seen before remembered in the state directory",
		newCNIAgentChains, Targets(finding.KindCNIAgentProcess))
}

type cniAgentChains struct {
	p      CNIAgentChainsParams
	n      *node.Node
	agents []cnichains.Agent

	mu      sync.Mutex
	mem     cnichains.Memory
	loaded  bool
	savedAt time.Time // when the memory was last written
	judgement
}

func newCNIAgentChains(p *CNIAgentChainsParams, n *node.Node) (Detector, error) {
	d := &cniAgentChains{p: *p, n: n}
	for _, name := range p.Agents {
		a, ok := cnichains.Lookup(name)
		if !ok {
			return nil, fmt.Errorf("unknown CNI agent %q", name)
		}
		d.agents = append(d.agents, a)
	}
	return d, nil
}

// runningAgent is an agent and the process found for it.
type runningAgent struct {
	a cnichains.Agent
	p procs.Process
}

// running finds each agent's process in the daemon's network namespace
// (an agent of the node runs with hostNetwork; a process of that name in a
// pod's namespace writes no rule of the node's; the namespace is told by
// /proc/<pid>/net/dev's inode, which needs no ptrace). The oldest wins.
func (d *cniAgentChains) running(ctx context.Context) ([]runningAgent, []string, error) {
	self := d.n.Procs.SelfNetKey()
	var out []runningAgent
	var elsewhere []string
	for _, a := range d.agents {
		ps, err := d.n.Procs.Find(ctx, a.Processes)
		if err != nil {
			return nil, nil, fmt.Errorf("finding the %s agent's process: %w", a.Name, err)
		}
		var best *procs.Process
		for i := range ps {
			p := ps[i]
			if self != 0 && p.NetKey != 0 && p.NetKey != self {
				elsewhere = append(elsewhere, fmt.Sprintf("%s pid %d (netns net/dev inode %d)", p.Name(), p.Pid, p.NetKey))
				continue
			}
			if best == nil || p.CreateTimeMs < best.CreateTimeMs || (p.CreateTimeMs == best.CreateTimeMs && p.Pid < best.Pid) {
				best = &p
			}
		}
		if best != nil {
			out = append(out, runningAgent{a: a, p: *best})
		}
	}
	return out, elsewhere, nil
}

func (d *cniAgentChains) memory() cnichains.Memory {
	d.mu.Lock()
	defer d.mu.Unlock()
	if !d.loaded && d.n.CNIChains != nil {
		m, err := d.n.CNIChains.Load()
		if err != nil && d.n.Log != nil {
			d.n.Log.Warn("CNI agent chains memory unreadable; starting empty", zap.Error(err))
		}
		d.mem = m
	}
	d.loaded = true
	return d.mem
}

// saveEvery bounds how often an unchanged memory (only its lastSeen times
// moved) is written: a restart loses at most that much of lastSeen, far
// under forgetAfter. A chain or hook appearing or forgotten is written at
// once.
const saveEvery = time.Minute

func (d *cniAgentChains) store(m cnichains.Memory, now time.Time) error {
	d.mu.Lock()
	changed := !sameKeys(d.mem, m)
	d.mem = m
	due := changed || now.Sub(d.savedAt) >= saveEvery
	if due {
		d.savedAt = now
	}
	d.mu.Unlock()
	if d.n.CNIChains == nil || !due {
		return nil
	}
	return d.n.CNIChains.Save(m)
}

// sameKeys reports whether two memories remember the same chains and
// hooks (whatever their times and counts).
func sameKeys(a, b cnichains.Memory) bool {
	keys := func(m cnichains.Memory) map[string]bool {
		out := map[string]bool{}
		for ag, bySave := range m.Agents {
			for k, s := range bySave {
				for c := range s.Chains {
					out[ag+" "+k+" "+c] = true
				}
				for h := range s.Hooks {
					out[ag+" "+k+" "+h] = true
				}
			}
		}
		return out
	}
	ka, kb := keys(a), keys(b)
	if len(ka) != len(kb) {
		return false
	}
	for k := range ka {
		if !kb[k] {
			return false
		}
	}
	return true
}

func (d *cniAgentChains) Detect(ctx context.Context) ([]finding.Finding, error) {
	if d.n.Procs == nil {
		return nil, finding.Skip("%s", d.n.Why("procs"))
	}
	if d.n.IPTables == nil {
		return nil, finding.Skip("%s", d.n.Why("iptables"))
	}
	run, elsewhere, err := d.running(ctx)
	if err != nil {
		return nil, err
	}
	if len(run) == 0 {
		var names []string
		for _, a := range d.agents {
			names = append(names, a.Name+" ("+strings.Join(a.Processes, ", ")+")")
		}
		why := ""
		if len(elsewhere) > 0 {
			why = "; in other network namespaces only: " + strings.Join(elsewhere, ", ")
		}
		return nil, finding.Skip("no process of a known CNI agent runs in this node's network namespace: %s%s", strings.Join(names, ", "), why)
	}

	// The saves of the cycle: the shared adapter runs one per family and
	// backend whichever iptables detector asks first (no lock taken).
	type saved struct {
		key  string
		snap *iptables.Snapshot
		err  error
	}
	var saves []saved
	var mu sync.Mutex
	var wg sync.WaitGroup
	for _, fs := range d.p.Families {
		for _, bs := range d.p.Backends {
			wg.Add(1)
			go func(f iptables.Family, b iptables.Backend) {
				defer wg.Done()
				sctx, cancel := context.WithTimeout(ctx, d.p.SaveTimeout.Duration)
				defer cancel()
				snap, err := d.n.IPTables.Save(sctx, f, b)
				mu.Lock()
				saves = append(saves, saved{key: string(f) + "/" + string(b), snap: snap, err: err})
				mu.Unlock()
			}(iptables.Family(fs), iptables.Backend(bs))
		}
	}
	wg.Wait()
	sort.Slice(saves, func(i, j int) bool { return saves[i].key < saves[j].key })
	var unavailable, failed []string
	ok := 0
	for _, s := range saves {
		switch {
		case errors.Is(s.err, iptables.ErrUnavailable):
			unavailable = append(unavailable, s.key)
		case s.err != nil:
			failed = append(failed, s.key+": "+s.err.Error())
		default:
			ok++
		}
	}
	if ok == 0 {
		if len(failed) > 0 {
			return nil, fmt.Errorf("saving iptables rules: %s", strings.Join(failed, "; "))
		}
		return nil, finding.Skip("no iptables save command available (%s)", strings.Join(unavailable, ", "))
	}

	now := d.n.Clock.Now()
	mem := d.memory()
	next := cnichains.Memory{Version: 1, Agents: map[string]map[string]cnichains.Seen{}}
	for a, m := range mem.Agents {
		next.Agents[a] = map[string]cnichains.Seen{}
		for k, v := range m {
			next.Agents[a][k] = v
		}
	}
	var out []finding.Finding
	var healthy, notUsed []string
	for _, ra := range run {
		var defects []map[string]any
		var says []string
		seenAny := false
		for _, s := range saves {
			if s.err != nil {
				continue
			}
			var rs *iptables.Ruleset
			if s.snap != nil {
				rs = s.snap.Rules
			}
			obs := cnichains.Observe(rs, ra.a)
			prev := mem.Get(ra.a.Name, s.key)
			for _, df := range cnichains.Check(obs, ra.a, prev) {
				ev := map[string]any{"saved": s.key, "kind": df.Kind, "table": df.Table, "chain": df.Chain}
				if df.From != "" {
					ev["from"] = df.From
				}
				if df.Remembered {
					ev["remembered"] = true
				}
				if !df.LastSeen.IsZero() {
					ev["lastSeen"] = df.LastSeen.UTC().Format(time.RFC3339)
				}
				if df.Rules > 0 {
					ev["rulesBefore"] = df.Rules
				}
				defects = append(defects, ev)
				says = append(says, df.String()+" ("+s.key+")")
			}
			if !obs.Empty() || len(prev.Chains)+len(prev.Hooks) > 0 {
				seenAny = true
			}
			upd, forgot := cnichains.Remember(prev, obs, now, d.p.ForgetAfter.Duration)
			if len(forgot) > 0 && d.n.Log != nil {
				d.n.Log.Info("CNI agent chains not seen for forgetAfter are no longer expected",
					zap.String("agent", ra.a.Name), zap.String("saved", s.key), zap.Strings("forgot", forgot), zap.Duration("forgetAfter", d.p.ForgetAfter.Duration))
			}
			next.Set(ra.a.Name, s.key, upd)
		}
		switch {
		case len(defects) > 0:
			const maxSay = 8
			msg := says
			if len(msg) > maxSay {
				msg = append(msg[:maxSay:maxSay], fmt.Sprintf("and %d more", len(says)-maxSay))
			}
			ev := map[string]any{
				"agent":        ra.a.Name,
				"process":      ra.p.Name(),
				"pid":          ra.p.Pid,
				"createTimeMs": ra.p.CreateTimeMs,
				"defects":      defects,
			}
			if len(unavailable) > 0 {
				ev["unavailableSaves"] = unavailable
			}
			if len(failed) > 0 {
				ev["failedSaves"] = failed
			}
			out = append(out, finding.Finding{
				Detector: "CNIAgentChains",
				Target:   ra.p.Target(),
				Severity: finding.Critical,
				Message: fmt.Sprintf("CNI agent %s (%s pid %d) runs but its iptables rules are gone: %s; pod traffic it masquerades, forwards or filters is affected until the agent rewrites them (it does on restart)",
					ra.a.Name, ra.p.Name(), ra.p.Pid, strings.Join(msg, "; ")),
				Evidence: ev,
			})
		case seenAny:
			healthy = append(healthy, ra.a.Name)
		default:
			notUsed = append(notUsed, ra.a.Name)
		}
	}
	if err := d.store(next, now); err != nil {
		// The check stands; what is lost is the memory of this cycle.
		if d.n.Log != nil {
			d.n.Log.Warn("CNI agent chains memory not saved", zap.Error(err))
		}
	}
	var parts []string
	if len(healthy) > 0 {
		parts = append(parts, "chains and hooks of "+strings.Join(healthy, ", ")+" in place")
	}
	if len(notUsed) > 0 {
		parts = append(parts, "no iptables chain of "+strings.Join(notUsed, ", ")+" seen yet (nftables or eBPF mode, or flushed before remediate first saw them)")
	}
	d.set("%s; %d saves%s", strings.Join(parts, "; "), ok, notInstalled(unavailable))
	if len(failed) > 0 && len(out) == 0 {
		return nil, fmt.Errorf("saving iptables rules: %s", strings.Join(failed, "; "))
	}
	return out, nil
}
