package dataplane

import (
	"net/netip"
	"slices"
	"strconv"
	"strings"

	"github.com/remediate-dev/remediate/internal/iptables"
)

// FromIPTables reads kube-proxy's iptables-mode rules of one family out of
// a parsed save (the same snapshot the IPTablesRules detector takes), as
// kube-proxy v1.34 writes them (pkg/proxy/iptables/proxier.go):
//
//   - nat KUBE-SERVICES "-d VIP -p P --dport N -j KUBE-SVC-*|KUBE-SVL-*"
//     (comment "ns/name:port cluster IP"), "... -j KUBE-EXT-*|KUBE-FW-*"
//     ("external IP", "loadbalancer IP");
//   - nat KUBE-NODEPORTS "-p P --dport N -j KUBE-EXT-*" (comment "ns/name:port");
//   - KUBE-EXT-* ends in an unconditional jump to the policy chain
//     (KUBE-SVC-* for Cluster, KUBE-SVL-* for Local); KUBE-FW-* jumps to
//     KUBE-EXT-* per allowed source range;
//   - KUBE-SVC-*/KUBE-SVL-* jump to KUBE-SEP-* chains whose DNAT
//     --to-destination is the backend;
//   - filter KUBE-SERVICES / KUBE-EXTERNAL-SERVICES REJECT ("has no
//     endpoints") and DROP ("has no local endpoints") entries.
//
// A ruleset without a nat KUBE-SERVICES chain gives an empty state (kube-proxy
// has not programmed this family in iptables mode). Rules it does not
// understand are skipped with a note; nothing is invented.
func FromIPTables(rs *iptables.Ruleset, f Family, source string) *State {
	if rs == nil {
		return NewState(f, source)
	}
	nat := rs.Table("nat")
	chains := 0
	if nat != nil {
		chains = len(nat.Chains)
	}
	st := newState(f, source, len(rulesOf(nat, "KUBE-SERVICES")))
	c := &iptConv{nat: nat, st: st, memo: make(map[string][]netip.AddrPort, chains/4)}
	if c.nat.Chain("KUBE-SERVICES") == nil {
		return st
	}
	for _, r := range rulesOf(c.nat, "KUBE-SERVICES") {
		if r.Target == "KUBE-NODEPORTS" || r.Target == "KUBE-MARK-MASQ" {
			continue
		}
		comment := argValue(r.Args, "--comment")
		name, rest, ok := portNameOf(comment)
		if !ok {
			continue
		}
		kind := ClusterIP
		switch {
		case strings.HasPrefix(rest, "external IP"):
			kind = ExternalIP
		case strings.HasPrefix(rest, "loadbalancer IP"):
			kind = LoadBalancer
		case strings.HasPrefix(rest, "cluster IP"):
		default:
			st.Notes = append(st.Notes, "nat KUBE-SERVICES line "+strconv.Itoa(r.Line)+": unknown comment "+strconv.Quote(comment))
			continue
		}
		key, ok := ruleKey(r, true)
		if !ok {
			st.Notes = append(st.Notes, "nat KUBE-SERVICES line "+strconv.Itoa(r.Line)+": no destination, protocol or port")
			continue
		}
		bes, fwd := c.backends(r.Target, 0)
		e := Entry{Kind: kind, Key: key, Verdict: Forward, Backends: bes}
		if !fwd {
			e.Verdict = Drop
		}
		st.port(name, key.Protocol).add(e)
	}
	for _, r := range rulesOf(c.nat, "KUBE-NODEPORTS") {
		name, _, ok := portNameOf(argValue(r.Args, "--comment"))
		if !ok {
			continue
		}
		if d := argValue(r.Args, "-d"); d != "" {
			// The localhost NodePort variant (-d 127.0.0.0/8): the same
			// NodePort as the plain rule next to it.
			continue
		}
		key, ok := ruleKey(r, false)
		if !ok {
			continue
		}
		bes, fwd := c.backends(r.Target, 0)
		e := Entry{Kind: NodePort, Key: key, Verdict: Forward, Backends: bes}
		if !fwd {
			e.Verdict = Drop
		}
		st.port(name, key.Protocol).add(e)
	}
	filter := rs.Table("filter")
	for _, chain := range []string{"KUBE-SERVICES", "KUBE-EXTERNAL-SERVICES"} {
		for _, r := range rulesOf(filter, chain) {
			var v Verdict
			switch r.Target {
			case "REJECT":
				v = Reject
			case "DROP":
				v = Drop
			default:
				continue
			}
			name, rest, ok := portNameOf(argValue(r.Args, "--comment"))
			if !ok || !strings.HasPrefix(rest, "has no") {
				continue
			}
			hasDst := argValue(r.Args, "-d") != ""
			key, ok := ruleKey(r, hasDst)
			if !ok {
				continue
			}
			kind := ClusterIP
			switch {
			case chain == "KUBE-EXTERNAL-SERVICES" && hasDst:
				kind = ExternalIP // or LoadBalancer: the rule does not say
			case chain == "KUBE-EXTERNAL-SERVICES":
				kind = NodePort
			}
			st.port(name, key.Protocol).add(Entry{Kind: kind, Key: key, Verdict: v})
		}
	}
	st.Sort()
	return st
}

type iptConv struct {
	nat  *iptables.Table
	st   *State
	memo map[string][]netip.AddrPort
}

// backends resolves a KUBE-SVC/SVL/EXT/FW chain to the DNAT destinations
// it reaches. fwd is false when the chain forwards nothing from outside (a
// KUBE-EXT-* chain without its final policy jump).
func (c *iptConv) backends(chain string, depth int) (out []netip.AddrPort, fwd bool) {
	if bes, ok := c.memo[chain]; ok {
		return bes, bes != nil
	}
	ch := c.nat.Chain(chain)
	if ch == nil || depth > 4 {
		return nil, false
	}
	fwd = true
	switch {
	case strings.HasPrefix(chain, "KUBE-SVC-"), strings.HasPrefix(chain, "KUBE-SVL-"):
		out = make([]netip.AddrPort, 0, len(ch.Rules))
		for _, r := range ch.Rules {
			if strings.HasPrefix(r.Target, "KUBE-SEP-") {
				if ap, ok := c.sepDest(r.Target); ok {
					out = append(out, ap)
				}
			}
		}
	case strings.HasPrefix(chain, "KUBE-EXT-"):
		// Only the unconditional jump carries outside traffic; the
		// conditional ones (pod or LOCAL sources, Local policy) short-cut
		// to the cluster chain.
		fwd = false
		for _, r := range ch.Rules {
			if (strings.HasPrefix(r.Target, "KUBE-SVC-") || strings.HasPrefix(r.Target, "KUBE-SVL-")) && len(r.Conditions()) == 0 {
				out, _ = c.backends(r.Target, depth+1)
				out = slices.Clone(out)
				fwd = true
			}
		}
	case strings.HasPrefix(chain, "KUBE-FW-"):
		fwd = false
		for _, r := range ch.Rules {
			if strings.HasPrefix(r.Target, "KUBE-EXT-") {
				b, f := c.backends(r.Target, depth+1)
				out = append(out, b...)
				fwd = fwd || f
			}
		}
	default:
		return nil, false
	}
	if len(out) > 1 {
		slices.SortFunc(out, netip.AddrPort.Compare)
		out = slices.Compact(out)
	}
	if fwd && out == nil {
		out = []netip.AddrPort{}
	}
	if !fwd {
		out = nil
	}
	c.memo[chain] = out
	return out, fwd
}

// sepDest is the DNAT destination of a KUBE-SEP-* chain.
func (c *iptConv) sepDest(chain string) (netip.AddrPort, bool) {
	ch := c.nat.Chain(chain)
	if ch == nil {
		return netip.AddrPort{}, false
	}
	for _, r := range ch.Rules {
		if r.Target != "DNAT" {
			continue
		}
		if ap, err := netip.ParseAddrPort(argValue(r.Args, "--to-destination")); err == nil {
			return netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port()), true
		}
	}
	return netip.AddrPort{}, false
}

// ruleKey reads -d, -p and --dport of a rule. withAddr requires a single
// address destination (a /32 or /128).
func ruleKey(r iptables.Rule, withAddr bool) (EntryKey, bool) {
	proto := strings.ToUpper(argValue(r.Args, "-p"))
	port, err := strconv.ParseUint(argValue(r.Args, "--dport"), 10, 16)
	if proto == "" || err != nil {
		return EntryKey{}, false
	}
	k := EntryKey{Protocol: proto, Port: uint16(port)}
	if withAddr {
		d := argValue(r.Args, "-d")
		p, err := netip.ParsePrefix(d)
		if err != nil {
			a, err2 := netip.ParseAddr(d)
			if err2 != nil {
				return EntryKey{}, false
			}
			p = netip.PrefixFrom(a, a.BitLen())
		}
		if !p.IsSingleIP() {
			return EntryKey{}, false
		}
		k.Addr = p.Addr().Unmap()
	}
	return k, true
}

// portNameOf splits a kube-proxy comment into its leading "ns/name:port"
// and the rest.
func portNameOf(comment string) (PortName, string, bool) {
	first, rest, _ := strings.Cut(comment, " ")
	n, ok := ParsePortName(first)
	return n, rest, ok
}

// argValue returns the value after the first non-negated occurrence of opt.
func argValue(args []string, opt string) string {
	for i := 0; i+1 < len(args); i++ {
		if args[i] == opt && (i == 0 || args[i-1] != "!") {
			return args[i+1]
		}
	}
	return ""
}

// rulesOf returns a chain's rules, none for a missing table or chain.
func rulesOf(t *iptables.Table, chain string) []iptables.Rule {
	if c := t.Chain(chain); c != nil {
		return c.Rules
	}
	return nil
}
