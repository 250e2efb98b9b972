package dataplane

import (
	"net/netip"
	"strconv"
	"strings"

	"github.com/remediate-dev/remediate/internal/nftables"
)

// FromNFTables reads kube-proxy's nftables-mode table of one family (`table
// ip kube-proxy` or `table ip6 kube-proxy`, parsed by internal/nftables)
// into the model, as kube-proxy v1.34 writes it (pkg/proxy/nftables):
//
//   - service-ips elements "IP . proto . port : goto service-*|local-*"
//     are ClusterIP entries, "... : goto external-*|firewall-*" external-IP
//     or load-balancer entries (the table does not say which);
//   - service-nodeports elements "proto . port : goto external-*" are
//     NodePort entries;
//   - service-*/local-* chains reach endpoint-* chains whose `dnat to` is
//     the backend; an external-* chain forwards outside traffic through its
//     last unconditional goto (the policy chain) and, without one, none;
//   - no-endpoint-services / no-endpoint-nodeports elements ("goto
//     reject-chain" or "drop", comment "ns/name:port") are reject and drop
//     entries.
//
// A table that is nil gives an empty state.
func FromNFTables(t *nftables.Table, f Family) *State {
	st := NewState(f, "nftables")
	if t == nil {
		return st
	}
	k, err := nftables.ParseKubeProxy(t)
	if err != nil {
		st.Notes = append(st.Notes, err.Error())
		return st
	}
	st = newState(f, "nftables", len(k.ServiceIPs))
	memo := map[string][]netip.AddrPort{}
	var resolve func(chain string, depth int) ([]netip.AddrPort, bool)
	resolve = func(chain string, depth int) ([]netip.AddrPort, bool) {
		if bes, ok := memo[chain]; ok {
			return bes, bes != nil
		}
		cn, ok := nftables.ParseChainName(chain)
		if !ok || depth > 4 {
			return nil, false
		}
		var out []netip.AddrPort
		fwd := true
		switch cn.Kind {
		case nftables.ExternalChainKind:
			fwd = false
			if c := t.Chain(chain); c != nil {
				for _, r := range c.Rules {
					if r.Conditional || r.Verdict == nil || (r.Verdict.Kind != nftables.Goto && r.Verdict.Kind != nftables.Jump) {
						continue
					}
					if tn, ok := nftables.ParseChainName(r.Verdict.Target); ok && (tn.Kind == nftables.ServiceChainKind || tn.Kind == nftables.LocalChainKind) {
						out, fwd = resolve(r.Verdict.Target, depth+1)
					}
				}
			}
		case nftables.FirewallChainKind:
			fwd = false
			if c := t.Chain(chain); c != nil {
				for _, r := range c.Rules {
					for _, target := range r.Targets() {
						if tn, ok := nftables.ParseChainName(target); ok && tn.Kind == nftables.ExternalChainKind {
							b, fw := resolve(target, depth+1)
							out = append(out, b...)
							fwd = fwd || fw
						}
					}
				}
			}
		case nftables.ServiceChainKind, nftables.LocalChainKind:
			bes, _ := k.Resolve(chain)
			out = make([]netip.AddrPort, 0, len(bes))
			for _, b := range bes {
				a, err := netip.ParseAddr(b.Addr)
				p, perr := strconv.ParseUint(b.Port, 10, 16)
				if err == nil && perr == nil {
					out = append(out, netip.AddrPortFrom(a.Unmap(), uint16(p)))
				}
			}
		default:
			return nil, false
		}
		out = unionSorted(nil, out)
		if fwd && out == nil {
			out = []netip.AddrPort{}
		}
		if !fwd {
			out = nil
		}
		memo[chain] = out
		return out, fwd
	}
	nameOf := func(target string) (PortName, bool) {
		cn, ok := nftables.ParseChainName(target)
		if !ok || cn.Truncated {
			return PortName{}, false
		}
		return PortName{Namespace: cn.Service.Namespace, Name: cn.Service.Name, Port: cn.Service.Port}, true
	}
	key := func(ip, proto, port string) (EntryKey, bool) {
		p, err := strconv.ParseUint(port, 10, 16)
		if err != nil {
			return EntryKey{}, false
		}
		k := EntryKey{Protocol: strings.ToUpper(proto), Port: uint16(p)}
		if ip != "" {
			a, err := netip.ParseAddr(ip)
			if err != nil {
				return EntryKey{}, false
			}
			k.Addr = a.Unmap()
		}
		return k, true
	}
	forward := func(kind Kind, k EntryKey, v nftables.Verdict) {
		name, ok := nameOf(v.Target)
		if !ok {
			st.Notes = append(st.Notes, "unattributed "+k.String()+": "+v.String())
			return
		}
		tn, _ := nftables.ParseChainName(v.Target)
		if kind == ExternalIP && (tn.Kind == nftables.ServiceChainKind || tn.Kind == nftables.LocalChainKind) {
			kind = ClusterIP
		}
		bes, fwd := resolve(v.Target, 0)
		e := Entry{Kind: kind, Key: k, Verdict: Forward, Backends: bes}
		if !fwd {
			e.Verdict = Drop
		}
		st.port(name, k.Protocol).add(e)
	}
	clusterIPs := map[string]bool{}
	for _, ip := range k.ClusterIPs {
		clusterIPs[ip] = true
	}
	for _, e := range k.ServiceIPs {
		if kk, ok := key(e.IP, e.Protocol, e.Port); ok {
			forward(ExternalIP, kk, e.Verdict)
		}
	}
	for _, e := range k.NodePorts {
		if kk, ok := key("", e.Protocol, e.Port); ok {
			forward(NodePort, kk, e.Verdict)
		}
	}
	refuse := func(kind Kind, k EntryKey, v nftables.Verdict, comment string) {
		name, ok := ParsePortName(comment)
		if !ok {
			st.Notes = append(st.Notes, "no-endpoint element without a service port comment: "+k.String())
			return
		}
		verdict := Reject
		if v.Kind == nftables.Drop {
			verdict = Drop
		}
		st.port(name, k.Protocol).add(Entry{Kind: kind, Key: k, Verdict: verdict})
	}
	for _, e := range k.NoEndpointServices {
		if kk, ok := key(e.IP, e.Protocol, e.Port); ok {
			kind := ExternalIP
			if clusterIPs[e.IP] {
				kind = ClusterIP
			}
			refuse(kind, kk, e.Verdict, e.Comment)
		}
	}
	for _, e := range k.NoEndpointNodePorts {
		if kk, ok := key("", e.Protocol, e.Port); ok {
			refuse(NodePort, kk, e.Verdict, e.Comment)
		}
	}
	st.Sort()
	return st
}
