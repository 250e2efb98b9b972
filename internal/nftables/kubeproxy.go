package nftables

import (
	"fmt"
	"sort"
	"strings"
)

// kube-proxy's nftables mode (pkg/proxy/nftables, v1.29+) keeps everything
// in one table per IP family, `table ip kube-proxy` and `table ip6
// kube-proxy`. What it programs, and how this file reads it:
//
//   - Base chains are named "<type>-<hook>[-suffix]": nat-prerouting and
//     nat-output (type nat, priority dstnat -100) both `jump services`;
//     nat-postrouting (srcnat 100) masquerades; filter-* chains (filter
//     type, priorities that changed between releases) reject traffic to
//     services without endpoints and apply LoadBalancerSourceRanges.
//   - Chain services: `ip daddr . meta l4proto . th dport vmap
//     @service-ips` and, for local destinations, `jump nodeports`
//     (`meta l4proto . th dport vmap @service-nodeports`).
//   - Map service-ips (`ipv4_addr . inet_proto . inet_service : verdict`):
//     ClusterIP, external IP and load-balancer IP, protocol and port →
//     `goto service-<HASH>-<ns>/<name>/<proto>/<port>` (ClusterIPs) or
//     `goto external-<HASH>-...` (external and load-balancer IPs).
//   - Map service-nodeports (`inet_proto . inet_service : verdict`):
//     protocol and NodePort → `goto external-...`.
//   - Map no-endpoint-services / no-endpoint-nodeports: the same keys →
//     `goto reject-chain` (or `drop`) for service ports without usable
//     endpoints; the element comment is the service port name
//     ("default/web:http").
//   - Map firewall-ips: IP, protocol, port → `goto firewall-...` for
//     LoadBalancerSourceRanges.
//   - Sets cluster-ips (every ClusterIP, for the "unallocated ClusterIP"
//     reject) and nodeport-ips (the node's addresses accepting NodePorts).
//   - Chain service-<HASH>-<ns>/<name>/<proto>/<port> (cluster traffic
//     policy) and local-<HASH>-... (local policy): masquerade marks, then
//     `numgen random mod N vmap { 0 : goto endpoint-..., ... }` over the
//     endpoints (N = number of endpoints).
//   - Chain external-<HASH>-...: marks, then `goto service-...` or `goto
//     local-...`.
//   - Chain endpoint-<HASH>-<ns>/<name>/<proto>/<port>__<ip>/<port>: a
//     hairpin masquerade mark, then `meta l4proto tcp dnat to IP:PORT`
//     (IPv6 endpoints have the colons of their address replaced by dots in
//     the chain name; the DNAT statement is the authoritative backend).
//
// Chain names longer than 240 characters are truncated by kube-proxy with
// "..." (the hash keeps them unique); ChainName reports that.

// KubeProxyTableName is kube-proxy's table name in nftables mode.
const KubeProxyTableName = "kube-proxy"

// Names of kube-proxy's fixed chains, sets and maps.
const (
	KubeProxyServicesChain     = "services"
	KubeProxyNodePortsChain    = "nodeports"
	KubeProxyNATPrerouting     = "nat-prerouting"
	KubeProxyNATOutput         = "nat-output"
	KubeProxyNATPostrouting    = "nat-postrouting"
	KubeProxyServiceIPsMap     = "service-ips"
	KubeProxyServiceNodePorts  = "service-nodeports"
	KubeProxyNoEndpointSvcMap  = "no-endpoint-services"
	KubeProxyNoEndpointNPMap   = "no-endpoint-nodeports"
	KubeProxyFirewallIPsMap    = "firewall-ips"
	KubeProxyClusterIPsSet     = "cluster-ips"
	KubeProxyNodePortIPsSet    = "nodeport-ips"
	KubeProxyRejectChain       = "reject-chain"
	KubeProxyMarkMasqChain     = "mark-for-masquerade"
	kubeProxyChainNameMaxBytes = 240
)

// ChainKind is the kind of a per-service or per-endpoint kube-proxy chain,
// from its name prefix.
type ChainKind string

// Chain kinds.
const (
	// ServiceChainKind: "service-..." (cluster traffic policy), jumps to
	// endpoint chains.
	ServiceChainKind ChainKind = "service"
	// LocalChainKind: "local-..." (local traffic policy), jumps to the
	// node-local endpoint chains.
	LocalChainKind ChainKind = "local"
	// ExternalChainKind: "external-..." (external IPs, load balancers,
	// NodePorts), goes to a service or local chain.
	ExternalChainKind ChainKind = "external"
	// FirewallChainKind: "firewall-..." (LoadBalancerSourceRanges).
	FirewallChainKind ChainKind = "firewall"
	// EndpointChainKind: "endpoint-..." DNATs to one backend.
	EndpointChainKind ChainKind = "endpoint"
)

var chainKinds = []ChainKind{ServiceChainKind, LocalChainKind, ExternalChainKind, FirewallChainKind, EndpointChainKind}

// ServicePortName names a Service port the way kube-proxy does.
type ServicePortName struct {
	Namespace string `json:"namespace"`
	Name      string `json:"name"`
	// Protocol is lower case: tcp, udp, sctp.
	Protocol string `json:"protocol"`
	// Port is the port's name ("" for an unnamed port).
	Port string `json:"port"`
}

// String is "namespace/name:port" (kube-proxy's ServicePortName.String),
// with the protocol: "default/web:http/tcp".
func (s ServicePortName) String() string {
	return s.Namespace + "/" + s.Name + ":" + s.Port + "/" + s.Protocol
}

// ChainName is a per-service or per-endpoint chain name taken apart:
// "<kind>-<HASH>-<ns>/<name>/<proto>/<port>[__<ip>/<port>]".
type ChainName struct {
	Kind ChainKind `json:"kind"`
	// Hash is kube-proxy's 8-character base32 hash of the rest.
	Hash    string          `json:"hash"`
	Service ServicePortName `json:"service"`
	// Endpoint is the endpoint part of an endpoint chain name as written
	// ("10.180.0.1/80"; IPv6 with dots for colons), empty otherwise.
	Endpoint string `json:"endpoint,omitempty"`
	// Truncated is true when kube-proxy cut the name ("..." at the end):
	// the trailing parts may be incomplete.
	Truncated bool `json:"truncated,omitempty"`
}

// ParseChainName takes a kube-proxy per-service or per-endpoint chain name
// apart. ok is false for other chains (services, nat-prerouting, ...).
func ParseChainName(name string) (ChainName, bool) {
	var cn ChainName
	rest := ""
	for _, k := range chainKinds {
		if strings.HasPrefix(name, string(k)+"-") {
			cn.Kind, rest = k, name[len(k)+1:]
			break
		}
	}
	if cn.Kind == "" {
		return ChainName{}, false
	}
	hash, rest, ok := strings.Cut(rest, "-")
	if !ok || !isHash(hash) {
		return ChainName{}, false
	}
	cn.Hash = hash
	if strings.HasSuffix(rest, "...") && len(name) >= kubeProxyChainNameMaxBytes {
		cn.Truncated = true
		rest = strings.TrimSuffix(rest, "...")
	}
	svc, ep, hasEP := strings.Cut(rest, "__")
	if hasEP != (cn.Kind == EndpointChainKind) && !cn.Truncated {
		return ChainName{}, false
	}
	parts := strings.SplitN(svc, "/", 4)
	if len(parts) < 4 && !cn.Truncated {
		return ChainName{}, false
	}
	for len(parts) < 4 {
		parts = append(parts, "")
	}
	cn.Service = ServicePortName{Namespace: parts[0], Name: parts[1], Protocol: parts[2], Port: parts[3]}
	cn.Endpoint = ep
	return cn, true
}

// ServiceEntry is one element of service-ips, no-endpoint-services or
// firewall-ips: an IP, protocol and port and what kube-proxy does with it.
type ServiceEntry struct {
	IP       string  `json:"ip"`
	Protocol string  `json:"protocol"`
	Port     string  `json:"port"`
	Verdict  Verdict `json:"verdict"`
	Comment  string  `json:"comment,omitempty"`
}

// NodePortEntry is one element of service-nodeports or
// no-endpoint-nodeports.
type NodePortEntry struct {
	Protocol string  `json:"protocol"`
	Port     string  `json:"port"`
	Verdict  Verdict `json:"verdict"`
	Comment  string  `json:"comment,omitempty"`
}

// ServiceChain is a service-, local- or external- chain.
type ServiceChain struct {
	Chain string    `json:"chain"`
	Name  ChainName `json:"name"`
	// Endpoints are the endpoint chains it load-balances over, in the
	// order of its numgen vmap (service and local chains).
	Endpoints []string `json:"endpoints,omitempty"`
	// Next are the service or local chains an external chain goes to.
	Next []string `json:"next,omitempty"`
}

// EndpointChain is an endpoint- chain.
type EndpointChain struct {
	Chain string    `json:"chain"`
	Name  ChainName `json:"name"`
	// DNAT is the chain's dnat statement (nil if it has none: a broken
	// chain).
	DNAT *NAT `json:"dnat,omitempty"`
}

// Backend is where an endpoint chain sends traffic.
type Backend struct {
	// Addr and Port are the DNAT target ("10.244.0.7", "8080").
	Addr string `json:"addr"`
	Port string `json:"port"`
	// Chain is the endpoint chain.
	Chain string `json:"chain"`
}

// KubeProxy is kube-proxy's table of one family, read into what it
// programs. Lists are in the table's order.
type KubeProxy struct {
	Family Family `json:"family"`
	// ServiceIPs is service-ips: ClusterIPs, external IPs and load
	// balancer IPs with endpoints.
	ServiceIPs []ServiceEntry `json:"serviceIPs"`
	// NodePorts is service-nodeports.
	NodePorts []NodePortEntry `json:"nodePorts"`
	// NoEndpointServices is no-endpoint-services: service IPs and ports
	// whose traffic is rejected or dropped for lack of endpoints.
	NoEndpointServices []ServiceEntry `json:"noEndpointServices"`
	// NoEndpointNodePorts is no-endpoint-nodeports.
	NoEndpointNodePorts []NodePortEntry `json:"noEndpointNodePorts"`
	// FirewallIPs is firewall-ips.
	FirewallIPs []ServiceEntry `json:"firewallIPs"`
	// ClusterIPs is the cluster-ips set, NodePortIPs nodeport-ips.
	ClusterIPs  []string `json:"clusterIPs"`
	NodePortIPs []string `json:"nodePortIPs"`
	// Services holds the service-, local- and external- chains by name.
	Services map[string]*ServiceChain `json:"services"`
	// Endpoints holds the endpoint- chains by name.
	Endpoints map[string]*EndpointChain `json:"endpoints"`
	// Missing lists the fixed sets and maps kube-proxy always creates that
	// are absent (a table being rebuilt, or damaged).
	Missing []string `json:"missing,omitempty"`
}

// ProgrammedService is one service IP, protocol and port as kube-proxy
// programmed it, resolved to its backends.
type ProgrammedService struct {
	IP       string `json:"ip"`
	Protocol string `json:"protocol"`
	Port     string `json:"port"`
	// Service is the service port, from the chain name the map points to.
	Service ServicePortName `json:"service"`
	// Chain is the chain service-ips points to.
	Chain string `json:"chain"`
	// Backends are the DNAT targets reached through Chain, in order.
	Backends []Backend `json:"backends"`
	// Unresolved lists chains on the way that are missing from the table
	// or have no DNAT (the service is broken for those).
	Unresolved []string `json:"unresolved,omitempty"`
}

// ParseKubeProxy reads kube-proxy's table. It fails only when t is nil or
// not an ip/ip6 table; anything kube-proxy normally creates that is absent
// is listed in Missing, and elements that do not have kube-proxy's shape
// are skipped.
func ParseKubeProxy(t *Table) (*KubeProxy, error) {
	if t == nil {
		return nil, fmt.Errorf("no kube-proxy table")
	}
	if t.Family != FamilyIP && t.Family != FamilyIP6 {
		return nil, fmt.Errorf("kube-proxy table has family %q, want ip or ip6", t.Family)
	}
	k := &KubeProxy{Family: t.Family, Services: map[string]*ServiceChain{}, Endpoints: map[string]*EndpointChain{}}
	for _, name := range []string{KubeProxyServiceIPsMap, KubeProxyServiceNodePorts, KubeProxyNoEndpointSvcMap,
		KubeProxyNoEndpointNPMap, KubeProxyClusterIPsSet} {
		if t.Set(name) == nil {
			k.Missing = append(k.Missing, name)
		}
	}
	k.ServiceIPs = serviceEntries(t.Set(KubeProxyServiceIPsMap))
	k.NoEndpointServices = serviceEntries(t.Set(KubeProxyNoEndpointSvcMap))
	k.FirewallIPs = serviceEntries(t.Set(KubeProxyFirewallIPsMap))
	k.NodePorts = nodePortEntries(t.Set(KubeProxyServiceNodePorts))
	k.NoEndpointNodePorts = nodePortEntries(t.Set(KubeProxyNoEndpointNPMap))
	k.ClusterIPs = setKeys(t.Set(KubeProxyClusterIPsSet))
	k.NodePortIPs = setKeys(t.Set(KubeProxyNodePortIPsSet))
	for _, c := range t.Chains {
		cn, ok := ParseChainName(c.Name)
		if !ok {
			continue
		}
		switch cn.Kind {
		case EndpointChainKind:
			ep := &EndpointChain{Chain: c.Name, Name: cn}
			for _, r := range c.Rules {
				if r.NAT != nil && r.NAT.Kind == "dnat" {
					n := *r.NAT
					ep.DNAT = &n
				}
			}
			k.Endpoints[c.Name] = ep
		case ServiceChainKind, LocalChainKind, ExternalChainKind:
			sc := &ServiceChain{Chain: c.Name, Name: cn}
			for _, r := range c.Rules {
				for _, target := range r.Targets() {
					tn, ok := ParseChainName(target)
					switch {
					case !ok:
					case tn.Kind == EndpointChainKind:
						sc.Endpoints = append(sc.Endpoints, target)
					case tn.Kind == ServiceChainKind || tn.Kind == LocalChainKind:
						sc.Next = append(sc.Next, target)
					}
				}
			}
			k.Services[c.Name] = sc
		}
	}
	return k, nil
}

// isHash reports whether s looks like kube-proxy's name hash: 8 characters
// of the base32 alphabet (A-Z, 2-7).
func isHash(s string) bool {
	if len(s) != 8 {
		return false
	}
	for _, c := range s {
		if (c < 'A' || c > 'Z') && (c < '2' || c > '7') {
			return false
		}
	}
	return true
}

func serviceEntries(s *Set) []ServiceEntry {
	if s == nil {
		return nil
	}
	var out []ServiceEntry
	for _, e := range s.Elements {
		if len(e.Key) != 3 || e.Verdict == nil {
			continue
		}
		out = append(out, ServiceEntry{IP: e.Key[0], Protocol: e.Key[1], Port: e.Key[2], Verdict: *e.Verdict, Comment: e.Comment})
	}
	return out
}

func nodePortEntries(s *Set) []NodePortEntry {
	if s == nil {
		return nil
	}
	var out []NodePortEntry
	for _, e := range s.Elements {
		if len(e.Key) != 2 || e.Verdict == nil {
			continue
		}
		out = append(out, NodePortEntry{Protocol: e.Key[0], Port: e.Key[1], Verdict: *e.Verdict, Comment: e.Comment})
	}
	return out
}

func setKeys(s *Set) []string {
	if s == nil {
		return nil
	}
	out := make([]string, 0, len(s.Elements))
	for _, e := range s.Elements {
		out = append(out, strings.Join(e.Key, " . "))
	}
	return out
}

// Resolve follows a chain (service-, local- or external-) to its backends.
// unresolved lists chains on the way that are missing or have no DNAT.
func (k *KubeProxy) Resolve(chain string) (backends []Backend, unresolved []string) {
	seen := map[string]bool{}
	var walk func(string, int)
	walk = func(name string, depth int) {
		if seen[name] || depth > 4 {
			return
		}
		seen[name] = true
		if ep, ok := k.Endpoints[name]; ok {
			if ep.DNAT == nil {
				unresolved = append(unresolved, name)
				return
			}
			backends = append(backends, Backend{Addr: ep.DNAT.Addr, Port: ep.DNAT.Port, Chain: name})
			return
		}
		sc, ok := k.Services[name]
		if !ok {
			unresolved = append(unresolved, name)
			return
		}
		for _, n := range sc.Next {
			walk(n, depth+1)
		}
		for _, e := range sc.Endpoints {
			walk(e, depth+1)
		}
	}
	walk(chain, 0)
	return backends, unresolved
}

// Programmed returns every service-ips entry resolved to its backends,
// sorted by IP, protocol and port.
func (k *KubeProxy) Programmed() []ProgrammedService {
	out := make([]ProgrammedService, 0, len(k.ServiceIPs))
	for _, e := range k.ServiceIPs {
		p := ProgrammedService{IP: e.IP, Protocol: e.Protocol, Port: e.Port, Chain: e.Verdict.Target}
		if cn, ok := ParseChainName(e.Verdict.Target); ok {
			p.Service = cn.Service
		}
		if p.Chain != "" {
			p.Backends, p.Unresolved = k.Resolve(p.Chain)
		}
		out = append(out, p)
	}
	sort.SliceStable(out, func(i, j int) bool {
		a, b := out[i], out[j]
		if a.IP != b.IP {
			return a.IP < b.IP
		}
		if a.Protocol != b.Protocol {
			return a.Protocol < b.Protocol
		}
		return a.Port < b.Port
	})
	return out
}
