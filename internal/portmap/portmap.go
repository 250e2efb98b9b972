// Package portmap reads the hostPort DNAT rules the CNI portmap plugin
// writes when a pod's sandbox is created: its iptables chains
// (nat PREROUTING/OUTPUT -> CNI-HOSTPORT-DNAT -> CNI-DN-<hash> -> DNAT),
// from a parsed save of either backend, and its nftables backend's table
// (table ip/ip6 cni_hostport), from a parsed nft listing. It parses only
// what the iptables and nftables packages already parsed; it runs
// nothing.
package portmap

import (
	"net"
	"strconv"
	"strings"

	"github.com/remediate-dev/remediate/internal/iptables"
	"github.com/remediate-dev/remediate/internal/nftables"
)

// DNAT is one hostPort DNAT found in the node's rules.
type DNAT struct {
	Family   iptables.Family
	Protocol string // tcp, udp, sctp (lower case)
	HostPort int32
	// HostIP is the destination the rule is bound to, "" for any.
	HostIP   string
	DestIP   string
	DestPort int32
	// Source says where it was found: "iptables-legacy", "iptables-nft",
	// "nftables".
	Source string
}

// portmap's iptables chain and nftables table.
const (
	// DNATChain is the nat chain every portmap DNAT is reached through.
	DNATChain = "CNI-HOSTPORT-DNAT"
	// NFTTable is the table of portmap's nftables backend (ip and ip6).
	NFTTable = "cni_hostport"
)

// FromIPTables returns the hostPort DNATs of portmap in one
// iptables rule set: the DNAT rules of the chains CNI-HOSTPORT-DNAT jumps
// to, when the nat table's PREROUTING or OUTPUT jumps to
// CNI-HOSTPORT-DNAT (unreachable rules forward nothing). present says
// whether CNI-HOSTPORT-DNAT exists at all.
func FromIPTables(rs *iptables.Ruleset, fam iptables.Family, source string) (dnats []DNAT, present bool) {
	if rs == nil {
		return nil, false
	}
	nat := rs.Table("nat")
	top := nat.Chain(DNATChain)
	if top == nil {
		return nil, false
	}
	reached := false
	for _, from := range []string{"PREROUTING", "OUTPUT"} {
		if c := nat.Chain(from); c != nil {
			for _, r := range c.Rules {
				if r.Target == DNATChain {
					reached = true
				}
			}
		}
	}
	if !reached {
		return nil, true
	}
	done := map[string]bool{}
	for _, jr := range top.Rules {
		if jr.Target == "" || done[jr.Target] {
			continue
		}
		done[jr.Target] = true
		c := nat.Chain(jr.Target)
		if c == nil {
			continue
		}
		for _, r := range c.Rules {
			if d, ok := parseDNATRule(r.Args, r.Target); ok {
				d.Family, d.Source = fam, source
				dnats = append(dnats, d)
			}
		}
	}
	return dnats, true
}

// parseDNATRule reads a portmap DNAT rule's arguments ("-p tcp -m tcp
// --dport 8080 -j DNAT --to-destination 10.244.0.5:80", with "-d
// HOSTIP/32" for a hostIP). A rule with a negation, a port range or
// without protocol, port or destination is not one.
func parseDNATRule(args []string, target string) (DNAT, bool) {
	var d DNAT
	if target != "DNAT" {
		return d, false
	}
	for i := 0; i < len(args); i++ {
		a := args[i]
		if a == "!" {
			return d, false
		}
		if i+1 >= len(args) {
			continue
		}
		v := args[i+1]
		switch a {
		case "-p", "--protocol":
			d.Protocol = strings.ToLower(v)
			i++
		case "--dport", "--destination-port":
			n, err := strconv.ParseUint(v, 10, 16)
			if err != nil || n == 0 {
				return d, false
			}
			d.HostPort = int32(n)
			i++
		case "-d", "--destination":
			ip, ok := hostAddr(v)
			if !ok {
				return d, false
			}
			d.HostIP = ip
			i++
		case "--to-destination":
			ip, port, ok := splitDest(v)
			if !ok {
				return d, false
			}
			d.DestIP, d.DestPort = ip, port
			i++
		}
	}
	return d, d.Protocol != "" && d.HostPort != 0 && d.DestIP != "" && d.DestPort != 0
}

// hostAddr is a single address ("1.2.3.4", "1.2.3.4/32", "fd00::1/128").
func hostAddr(v string) (string, bool) {
	if a, bits, ok := strings.Cut(v, "/"); ok {
		if bits != "32" && bits != "128" {
			return "", false
		}
		v = a
	}
	ip := net.ParseIP(v)
	if ip == nil {
		return "", false
	}
	return ip.String(), true
}

// splitDest reads "10.244.0.5:80" or "[fd00::5]:80" (one address, one port).
func splitDest(v string) (string, int32, bool) {
	h, p, err := net.SplitHostPort(v)
	if err != nil {
		return "", 0, false
	}
	ip := net.ParseIP(h)
	n, err := strconv.ParseUint(p, 10, 16)
	if ip == nil || err != nil || n == 0 {
		return "", 0, false
	}
	return ip.String(), int32(n), true
}

// FromNFT returns the hostPort DNATs of portmap's nftables table
// (`table ip cni_hostport`: "tcp dport 8080 dnat to 10.0.0.2:80", with
// "ip daddr HOSTIP" for a hostIP) in any of its chains.
func FromNFT(t *nftables.Table, fam iptables.Family) []DNAT {
	if t == nil {
		return nil
	}
	var out []DNAT
	for _, c := range t.Chains {
		for _, r := range c.Rules {
			if r == nil || r.NAT == nil || r.NAT.Kind != "dnat" {
				continue
			}
			ip := net.ParseIP(r.NAT.Addr)
			port, err := strconv.ParseUint(r.NAT.Port, 10, 16)
			if ip == nil || err != nil || port == 0 {
				continue
			}
			d := DNAT{Family: fam, DestIP: ip.String(), DestPort: int32(port), Source: "nftables"}
			ok := true
			for _, m := range r.Matches {
				if m.Op != "==" {
					ok = false
					break
				}
				proto, field, _ := strings.Cut(m.Left, " ")
				switch {
				case field == "dport" && (proto == "tcp" || proto == "udp" || proto == "sctp"):
					n, err := strconv.ParseUint(m.Right, 10, 16)
					if err != nil || n == 0 {
						ok = false
					}
					d.Protocol, d.HostPort = proto, int32(n)
				case field == "daddr" && (proto == "ip" || proto == "ip6"):
					a, good := hostAddr(m.Right)
					if !good {
						ok = false
					}
					d.HostIP = a
				}
			}
			if ok && d.Protocol != "" && d.HostPort != 0 {
				out = append(out, d)
			}
		}
	}
	return out
}

// Has says whether dnats hold the DNAT of one mapping: that family,
// protocol and hostPort to podIP:containerPort, bound to hostIP ("" any)
// or to any address.
func Has(dnats []DNAT, fam iptables.Family, protocol string, hostPort int32, hostIP, podIP string, containerPort int32) bool {
	for _, d := range dnats {
		if d.Family == fam && strings.EqualFold(d.Protocol, protocol) && d.HostPort == hostPort &&
			d.DestPort == containerPort && sameIP(d.DestIP, podIP) && (d.HostIP == "" || sameIP(d.HostIP, hostIP)) {
			return true
		}
	}
	return false
}

// NFTFamily maps an iptables family to portmap's nftables table family.
func NFTFamily(f iptables.Family) nftables.Family {
	if f == iptables.IPv6 {
		return nftables.FamilyIP6
	}
	return nftables.FamilyIP
}

// sameIP compares two textual addresses.
func sameIP(a, b string) bool {
	x, y := net.ParseIP(a), net.ParseIP(b)
	return x != nil && y != nil && x.Equal(y)
}
