package detect

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/remediate-dev/remediate/internal/finding"
	"github.com/remediate-dev/remediate/internal/iptables"
	"github.com/remediate-dev/remediate/internal/kmod"
	"github.com/remediate-dev/remediate/internal/kubeproxy"
	"github.com/remediate-dev/remediate/internal/node"
	"github.com/remediate-dev/remediate/policy"
)

// KubeProxyKernelModulesParams configure KubeProxyKernelModules.
type KubeProxyKernelModulesParams struct {
	// ProxyMode is kube-proxy's mode, as for IPTablesRules; the check runs
	// in iptables mode only ("auto" asks kube-proxy).
	ProxyMode string `yaml:"proxyMode"`
	// Families to check: IPv4, and IPv6 on dual-stack and IPv6 nodes
	// (kube-proxy does without IPv6 when the node has no IPv6 iptables).
	Families []string `yaml:"families"`
	// Backend whose table modules are required: auto (kube-proxy's
	// iptables, read from its root; else the host's), legacy or nft.
	Backend string `yaml:"backend"`
	// ReuseFor is how long a reading (the module sources and, with
	// backend auto, kube-proxy's iptables) that found every module
	// present is reused before it is read again; a reading with a missing
	// module, an unknown one (on a kernel with module support) or an
	// unknown backend is read again at the next cycle, and a new process
	// (--once) always reads. 0 reads every cycle.
	ReuseFor policy.Duration `yaml:"reuseFor"`
}

// DefaultKernelModulesReuse is ReuseFor's default: modules are loaded
// rarely (kube-proxy's first rules load them, an operator's modprobe),
// while reading the xtables registries spins on the kernel's x_tables
// mutex (~4 ms a cycle under a large table's save).
const DefaultKernelModulesReuse = 5 * time.Minute

// SetDefaults implements registry.Defaulter.
func (p *KubeProxyKernelModulesParams) SetDefaults() {
	*p = KubeProxyKernelModulesParams{ProxyMode: "iptables", Families: []string{"IPv4"}, Backend: "auto", ReuseFor: policy.D(DefaultKernelModulesReuse)}
}

// Validate implements policy.Validator.
func (p *KubeProxyKernelModulesParams) Validate() []policy.FieldError {
	var errs []policy.FieldError
	errs = append(errs, validateProxyMode(p.ProxyMode)...)
	errs = append(errs, validateFamilies(p.Families)...)
	errs = append(errs, validateOneOf("backend", p.Backend, "auto", "legacy", "nft")...)
	if p.ReuseFor.Duration < 0 {
		errs = append(errs, policy.FieldError{Field: "reuseFor", Msg: "must be >= 0"})
	}
	return errs
}

func init() {
	Define("KubeProxyKernelModules",
		"iptables mode: the kernel modules kube-proxy's rules need (xt matches and targets, the backend's tables), from /proc/modules, the xtables registries and the host's module lists; built-in or unreadable is never reported as missing",
		newKubeProxyKernelModules, Targets(finding.KindIPTablesRules))
}

type kubeProxyKernelModules struct {
	p        KubeProxyKernelModulesParams
	n        *node.Node
	installs *iptables.InstallReader

	mu   sync.Mutex
	last *kmodReading
	// reads counts the readings taken (for tests).
	reads int
	judgement
}

func newKubeProxyKernelModules(p *KubeProxyKernelModulesParams, n *node.Node) (Detector, error) {
	return &kubeProxyKernelModules{p: *p, n: n, installs: iptables.NewInstallReader(iptables.DefaultInstallMemo, n.Clock)}, nil
}

// kmodReading is one reading of the module sources and what was judged
// from it.
type kmodReading struct {
	at       time.Time
	findings []finding.Finding
	judged   string
	// attention: a module missing, or unknown on a kernel that can load
	// modules, or the backend unknown: read again next cycle.
	attention bool
}

// rereadModules decides whether this cycle reads the module sources again
// (true) or reuses prev, and says why: always without a previous reading
// or reuse, when prev had a missing or unknown module (a fix or a new
// problem is seen at the next cycle), when the clock went back, and once
// prev is reuseFor old.
func rereadModules(prev *kmodReading, now time.Time, reuseFor time.Duration) (bool, string) {
	switch {
	case prev == nil:
		return true, "first reading"
	case reuseFor <= 0:
		return true, "read every cycle (reuseFor 0)"
	case prev.attention:
		return true, "the last reading had a missing or unknown module"
	case now.Before(prev.at):
		return true, "the clock went back"
	case now.Sub(prev.at) >= reuseFor:
		return true, fmt.Sprintf("the last reading is %s old (reuseFor %s)", now.Sub(prev.at).Round(time.Second), reuseFor)
	}
	return false, ""
}

// kernelModule is a module kube-proxy's iptables mode needs, with the
// feature that needs it and the xtables extensions that show it.
type kernelModule struct {
	name string
	why  string
	prov kmod.Provides
}

// requiredModules lists what kube-proxy v1.34's iptables-mode rules use
// (pkg/proxy/iptables/proxier.go) for one family and backend.
func requiredModules(f kmod.Family, be iptables.Backend, nfacct bool) []kernelModule {
	v6 := f == kmod.IPv6
	pick := func(a, b string) string {
		if v6 {
			return b
		}
		return a
	}
	ms := []kernelModule{
		{"nf_conntrack", "connection tracking", kmod.Provides{}},
		{"nf_nat", "NAT (DNAT to endpoints, masquerade)", kmod.Provides{Family: f, Targets: []string{"DNAT"}}},
		{"xt_conntrack", "-m conntrack (--ctstate)", kmod.Provides{Family: f, Matches: []string{"conntrack"}}},
		{"xt_comment", "-m comment", kmod.Provides{Family: f, Matches: []string{"comment"}}},
		{"xt_mark", "-m mark and -j MARK (the masquerade mark)", kmod.Provides{Family: f, Matches: []string{"mark"}, Targets: []string{"MARK"}}},
		{"xt_statistic", "-m statistic (load balancing across endpoints)", kmod.Provides{Family: f, Matches: []string{"statistic"}}},
		{"xt_addrtype", "-m addrtype (NodePorts)", kmod.Provides{Family: f, Matches: []string{"addrtype"}}},
		{"xt_tcpudp", "-p tcp/udp --dport", kmod.Provides{Family: f, Matches: []string{"tcp", "udp"}}},
		{"xt_nat", "-j DNAT", kmod.Provides{Family: f, Targets: []string{"DNAT"}}},
		{"xt_MASQUERADE", "-j MASQUERADE (return traffic)", kmod.Provides{Family: f, Targets: []string{"MASQUERADE"}}},
		{pick("ipt_REJECT", "ip6t_REJECT"), "-j REJECT (Services without endpoints)", kmod.Provides{Family: f, Targets: []string{"REJECT"}}},
	}
	if nfacct {
		ms = append(ms, kernelModule{"xt_nfacct", "-m nfacct (kube-proxy's packet counters, used because nfnetlink_acct is present)", kmod.Provides{Family: f, Matches: []string{"nfacct"}}})
	}
	switch be {
	case iptables.Legacy:
		ms = append(ms,
			kernelModule{pick("ip_tables", "ip6_tables"), "the legacy iptables tables", kmod.Provides{}},
			kernelModule{pick("iptable_nat", "ip6table_nat"), "the legacy nat table", kmod.Provides{Family: f, Tables: []string{"nat"}}},
			kernelModule{pick("iptable_filter", "ip6table_filter"), "the legacy filter table", kmod.Provides{Family: f, Tables: []string{"filter"}}})
	case iptables.NFT:
		ms = append(ms,
			kernelModule{"nf_tables", "the nft backend", kmod.Provides{}},
			kernelModule{"nft_compat", "xtables matches and targets in the nft backend", kmod.Provides{}},
			kernelModule{"nft_chain_nat", "nat chains in the nft backend", kmod.Provides{}})
	}
	return ms
}

func (d *kubeProxyKernelModules) Detect(ctx context.Context) ([]finding.Finding, error) {
	mode := resolveProxyMode(ctx, d.n, d.p.ProxyMode)
	if mode.mode != string(kubeproxy.ModeIPTables) && !(mode.mode == "" && mode.check) {
		return nil, finding.Skip("kube-proxy runs in %s mode (%s): the module check is for iptables mode", orUnknown(mode.mode), mode.note)
	}
	now := d.n.Clock.Now()
	d.mu.Lock()
	prev := d.last
	d.mu.Unlock()
	read, why := rereadModules(prev, now, d.p.ReuseFor.Duration)
	r := prev
	if read {
		r = d.read(ctx, now)
		d.mu.Lock()
		d.last, d.reads = r, d.reads+1
		d.mu.Unlock()
	}
	at := r.at.UTC().Format(time.RFC3339)
	if read {
		d.set("%s; modules read at %s (%s)", r.judged, at, why)
	} else {
		d.set("%s; modules read at %s, reused until %s", r.judged, at, r.at.Add(d.p.ReuseFor.Duration).UTC().Format(time.RFC3339))
	}
	return append([]finding.Finding(nil), r.findings...), nil
}

// read reads the module sources and kube-proxy's backend and judges them.
func (d *kubeProxyKernelModules) read(ctx context.Context, now time.Time) *kmodReading {
	be, beSource := d.backend(ctx)
	// Without the host's root (no CAP_SYS_PTRACE: the chart's default),
	// /proc/modules, the xtables registries and /proc/config.gz still
	// tell loaded, registered, built in and built without; only
	// "installed on disk" needs the host's module lists.
	root := hostRoot(d.n)
	if _, off := d.n.Unavailable[node.SubsystemHostRoot]; off {
		root = ""
	}
	snap := kmod.Read(d.n.ProcRoot, root)
	// kube-proxy v1.33+ counts dropped packets with -m nfacct when the
	// kernel's nfacct netlink (nfnetlink_acct) answers it: then the
	// xt_nfacct match must exist too, or every restore fails
	// (kubernetes/kubernetes#142068: "Couldn't load match `nfacct'").
	nfacct := snap.State("nfnetlink_acct", kmod.Provides{}).Present()
	conntrackSysctl := false
	if _, err := os.Stat(filepath.Join(d.n.ProcRoot, "sys", "net", "netfilter", "nf_conntrack_max")); err == nil {
		conntrackSysctl = true
	}
	var out []finding.Finding
	var judged []string
	attention := false
	for _, fs := range d.p.Families {
		f := kmod.IPv4
		if fs == string(iptables.IPv6) {
			f = kmod.IPv6
		}
		states := map[string]string{}
		counts := map[kmod.State]int{}
		var missing, unknown []string
		for _, m := range requiredModules(f, be, nfacct) {
			st := snap.State(m.name, m.prov)
			switch {
			case st.Present():
			case m.name == "nf_conntrack" && conntrackSysctl:
				st = kmod.Registered // its sysctls exist
			case (m.name == "ip_tables" && snap.Matches[kmod.IPv4] != nil) || (m.name == "ip6_tables" && snap.Matches[kmod.IPv6] != nil):
				st = kmod.Registered // it serves /proc/net/ip*_tables_*
			}
			states[m.name] = string(st)
			counts[st]++
			switch st {
			case kmod.Missing:
				missing = append(missing, m.name+" ("+m.why+")")
			case kmod.Unknown:
				unknown = append(unknown, m.name)
			}
		}
		if len(missing) > 0 {
			ev := map[string]any{
				"family": fs, "backend": string(be), "backendSource": beSource, "modules": states,
				"missing": missing, "sources": snap.Sources, "kernelRelease": snap.Release, "moduleSupport": snap.HasModules,
			}
			if len(unknown) > 0 {
				ev["unknown"] = unknown
			}
			if len(snap.Errors) > 0 {
				ev["unreadable"] = snap.Errors
			}
			ev["readAt"] = now.UTC().Format(time.RFC3339)
			out = append(out, finding.Finding{
				Detector: "KubeProxyKernelModules",
				Target:   "iptables/" + fs + "/kernel-modules",
				Severity: finding.Critical,
				Message: fmt.Sprintf("%s: kernel modules kube-proxy's iptables rules need are neither loaded, built in nor installed: %s; its iptables-restore fails on the rules that use them",
					fs, strings.Join(missing, ", ")),
				Evidence: ev,
			})
		}
		judged = append(judged, fmt.Sprintf("%s (%s backend, %s): %s", fs, orUnknown(string(be)), beSource, stateCounts(counts)))
		// Without module support (no /proc/modules) an unknown module
		// stays unknown until a reboot: nothing can load it.
		if len(missing) > 0 || (len(unknown) > 0 && snap.HasModules) || be == "" {
			attention = true
		}
	}
	return &kmodReading{at: now, findings: out, judged: strings.Join(judged, "; "), attention: attention}
}

func stateCounts(c map[kmod.State]int) string {
	var parts []string
	for st, n := range c {
		parts = append(parts, fmt.Sprintf("%d %s", n, st))
	}
	sort.Strings(parts)
	return strings.Join(parts, ", ")
}

// backend returns the backend whose table modules are required.
func (d *kubeProxyKernelModules) backend(ctx context.Context) (iptables.Backend, string) {
	if d.p.Backend != "auto" {
		return iptables.Backend(d.p.Backend), "from the policy"
	}
	if why, off := d.n.Unavailable[node.SubsystemHostRoot]; off {
		return "", "backend unknown (" + why + "): only backend-neutral modules checked"
	}
	if kp, err := kubeProxyIPTables(ctx, d.n, d.installs); err == nil && kp.known() && kp.In.Backend != "" {
		return kp.In.Backend, "kube-proxy's iptables (" + kp.In.Root + ")"
	}
	if host := readPartyIPTables(d.installs, "host", 0, hostRoot(d.n)); host.known() && host.In.Backend != "" {
		return host.In.Backend, "the host's iptables (" + host.In.Root + ")"
	}
	return "", "backend unknown: only backend-neutral modules checked"
}
