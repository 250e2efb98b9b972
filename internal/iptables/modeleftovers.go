package iptables

import (
	"sort"
	"strings"
)

// Mode-switch leftovers (kubernetes/kubernetes#102314): what kube-proxy's
// iptables mode wrote and its IPVS mode neither writes nor removes.

// IsIPTablesModeChain reports whether table/chain is one only kube-proxy's
// iptables mode writes. kube-proxy's IPVS proxier (v1.34
// pkg/proxy/ipvs/proxier.go, iptablesChains) owns nat KUBE-SERVICES,
// KUBE-POSTROUTING, KUBE-NODE-PORT, KUBE-LOAD-BALANCER, KUBE-MARK-MASQ and
// filter KUBE-FORWARD, KUBE-NODE-PORT, KUBE-PROXY-FIREWALL,
// KUBE-SOURCE-RANGES-FIREWALL, KUBE-IPVS-FILTER, KUBE-IPVS-OUT-FILTER;
// kube-proxy's canaries (KUBE-PROXY-CANARY) and the kubelet's chains
// (KUBE-FIREWALL, KUBE-MARK-DROP, KUBE-KUBELET-CANARY, KUBE-IPTABLES-HINT)
// are in every mode. None of those is iptables mode's; neither is any
// KUBE-* chain not named here (unknown: never reported).
func IsIPTablesModeChain(table, chain string) bool {
	switch table {
	case "nat":
		if chain == "KUBE-NODEPORTS" || chain == "KUBE-EXT-SERVICES" {
			return true
		}
		for _, p := range []string{"KUBE-SVC-", "KUBE-SEP-", "KUBE-EXT-", "KUBE-FW-", "KUBE-SVL-", "KUBE-XLB-"} {
			if strings.HasPrefix(chain, p) && len(chain) > len(p) {
				return true
			}
		}
	case "filter":
		// filter KUBE-SERVICES holds iptables mode's REJECT rules for
		// Services without endpoints; IPVS mode's KUBE-SERVICES is nat's.
		return chain == "KUBE-SERVICES" || chain == "KUBE-EXTERNAL-SERVICES" || chain == "KUBE-NODEPORTS"
	}
	return false
}

// ModeLeftover is what one save holds of kube-proxy's iptables
// mode while it runs in IPVS mode.
type ModeLeftover struct {
	// Chains are "table/chain" of iptables mode's chains that hold rules
	// or are jumped to, sorted.
	Chains []string
	// Rules counts the rules in those chains and the jumps into them.
	Rules int
	// Rejects are the REJECT/DROP rules of filter KUBE-SERVICES and
	// KUBE-EXTERNAL-SERVICES, as "chain dst proto dport" (Service IPs
	// iptables mode refused for lack of endpoints).
	Rejects []string
	// Hooked names the built-in chains' jumps into the chains holding
	// Rejects ("filter OUTPUT -> KUBE-SERVICES"): those rejects still
	// see traffic.
	Hooked []string
}

// ClassifyIPTablesModeLeftovers is the decision in IPVS mode for one
// save: nil when it holds nothing of iptables mode.
func ClassifyIPTablesModeLeftovers(rs *Ruleset) *ModeLeftover {
	if rs == nil {
		return nil
	}
	out := &ModeLeftover{}
	chains := map[string]bool{}
	rejectChains := map[string]bool{}
	for _, t := range rs.Tables {
		for _, c := range t.Chains {
			if IsIPTablesModeChain(t.Name, c.Name) {
				if len(c.Rules) > 0 {
					chains[t.Name+"/"+c.Name] = true
				}
				out.Rules += len(c.Rules)
				if t.Name == "filter" && (c.Name == "KUBE-SERVICES" || c.Name == "KUBE-EXTERNAL-SERVICES") {
					for _, r := range c.Rules {
						if r.Target == "REJECT" || r.Target == "DROP" {
							out.Rejects = append(out.Rejects, rejectSummary(c.Name, r))
							rejectChains[c.Name] = true
						}
					}
				}
				continue
			}
			for _, r := range c.Rules {
				if r.Target != "" && IsIPTablesModeChain(t.Name, r.Target) {
					out.Rules++
					chains[t.Name+"/"+r.Target] = true
				}
			}
		}
	}
	if f := rs.Table("filter"); f != nil {
		for _, c := range f.Chains {
			if !c.Builtin() {
				continue
			}
			for name := range rejectChains {
				if c.JumpsTo(name) {
					out.Hooked = append(out.Hooked, "filter "+c.Name+" -> "+name)
				}
			}
		}
	}
	if out.Rules == 0 {
		return nil
	}
	for c := range chains {
		out.Chains = append(out.Chains, c)
	}
	sort.Strings(out.Chains)
	sort.Strings(out.Hooked)
	return out
}

func rejectSummary(chain string, r Rule) string {
	parts := []string{chain}
	for i := 0; i+1 < len(r.Args); i++ {
		switch r.Args[i] {
		case "-d", "--destination", "-p", "--protocol", "--dport", "--destination-port":
			parts = append(parts, r.Args[i]+" "+r.Args[i+1])
			i++
		}
	}
	return strings.Join(parts, " ") + " -j " + r.Target
}
