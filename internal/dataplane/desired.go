package dataplane

import (
	"net/netip"
	"time"

	"github.com/remediate-dev/remediate/internal/cluster"
)

// DesiredPort is what kube-proxy should have programmed for one Service
// port in one family, and how old the inputs are.
type DesiredPort struct {
	ServicePort
	// Subset is true when kube-proxy may use topology hints for this port:
	// a Forward entry's programmed backends are then any non-empty subset
	// of Backends, not necessarily all of them.
	Subset bool
	// Created is the Service's creationTimestamp.
	Created time.Time
	// Changed is the newest API change time of the Service and of its
	// EndpointSlices (see cluster.Service.Changed); zero when unknown.
	Changed time.Time
	// Endpoints counts the port's endpoints of this family as kube-proxy
	// reads them (addresses[0], deduplicated), any condition.
	Endpoints int
}

// Desired is the desired state of one family.
type Desired struct {
	Family Family
	Ports  map[PortName]*DesiredPort
}

// Desire computes, from the cluster view, the entries kube-proxy v1.34
// programs on node nodeName for family f, following its source:
//
//   - Services of another proxy (service.kubernetes.io/service-proxy-name),
//     without a ClusterIP of the family (headless), or of type ExternalName
//     are skipped (pkg/proxy/util ShouldSkipService; the label is also
//     kube-proxy's informer selector);
//   - only addresses[0] of each endpoint counts, of the family's addresses,
//     and an endpoint port must match the Service port's name and protocol
//     (pkg/proxy/endpointslicecache.go);
//   - endpoints are categorized as pkg/proxy/topology.go CategorizeEndpoints
//     does: Cluster endpoints are the ready ones, else the serving
//     terminating ones; Local endpoints are the local ready ones, else the
//     local serving terminating ones; with topology hints on every ready
//     endpoint the Cluster set may be a subset (Subset);
//   - per entry (pkg/proxy/iptables/proxier.go syncProxyRules): the
//     ClusterIP forwards to the Local endpoints with internal traffic
//     policy Local, else to the Cluster ones; external IPs, load-balancer
//     IPs and the NodePort forward to the Local endpoints with external
//     traffic policy Local, else to the Cluster ones; a port without any
//     usable endpoint rejects, one with endpoints but none local under a
//     Local policy drops.
func Desire(v cluster.View, f Family, nodeName string) *Desired {
	svcs := v.Services()
	d := &Desired{Family: f, Ports: make(map[PortName]*DesiredPort, len(svcs))}
	st, _ := v.(cluster.SliceTimes)
	var scratch []endpoint
	for i := range svcs {
		for _, dp := range desireService(v, st, &svcs[i], f, nodeName, &scratch) {
			d.Ports[dp.Name] = dp
		}
	}
	return d
}

// desireService is Desire of one Service: its ports' entries (none for a
// Service kube-proxy does not program in this family).
func desireService(v cluster.View, st cluster.SliceTimes, s *cluster.Service, f Family, nodeName string, scratch *[]endpoint) []*DesiredPort {
	if s.ProxyName != "" || s.Type == "ExternalName" {
		return nil
	}
	vip, ok := addrOfFamily(s.ClusterIPs, f)
	if !ok {
		return nil
	}
	eps := v.Endpoints(s.Namespace, s.Name)
	changed := s.Changed
	if st != nil {
		if t := st.EndpointsChanged(s.Namespace, s.Name); t.After(changed) {
			changed = t
		}
	}
	out := make([]*DesiredPort, 0, len(s.Ports))
	for _, p := range s.Ports {
		dp := desirePort(*s, p, vip, eps, f, nodeName, scratch)
		dp.Created = s.Created
		if changed.After(dp.Changed) {
			dp.Changed = changed
		}
		out = append(out, dp)
	}
	return out
}

// versionedView is a view that counts Service versions.
type versionedView interface {
	cluster.View
	cluster.ServiceVersions
}

// serviceName names a Service in a perService cache.
type serviceName struct{ namespace, name string }

// perService is what DesireCached keeps of each Service of a view that
// counts Service versions (cluster.ServiceVersions): the ports derived
// from it at its version.
type perService map[serviceName]keptService

type keptService struct {
	version uint64
	ports   []*DesiredPort
}

// desireIncremental is Desire over a view that counts Service versions,
// reusing from prev the ports of every Service whose version has not moved
// (their *DesiredPort values are shared: read-only). It returns the
// desired state and the per-Service cache to keep for the next call, nil
// when the view changed during the call (the entries read may then be
// older than their versions: nothing is kept, prev stays valid).
func desireIncremental(v versionedView, f Family, nodeName string, prev perService) (*Desired, perService, int) {
	g1 := v.Generation()
	svcs := v.Services()
	d := &Desired{Family: f, Ports: make(map[PortName]*DesiredPort, len(svcs))}
	next := make(perService, len(svcs))
	st, _ := v.(cluster.SliceTimes)
	var scratch []endpoint
	computed := 0
	for i := range svcs {
		s := &svcs[i]
		k := serviceName{s.Namespace, s.Name}
		// The version before the Service's objects: a change after this
		// read moves it, and the Service is derived again next time.
		ver := v.ServiceVersion(s.Namespace, s.Name)
		ports := []*DesiredPort(nil)
		if kept, ok := prev[k]; ok && ver != 0 && kept.version == ver {
			ports = kept.ports
		} else {
			ports = desireService(v, st, s, f, nodeName, &scratch)
			computed++
		}
		if ver != 0 {
			next[k] = keptService{version: ver, ports: ports}
		}
		for _, dp := range ports {
			d.Ports[dp.Name] = dp
		}
	}
	if v.Generation() != g1 {
		return d, nil, computed
	}
	return d, next, computed
}

func addrOfFamily(addrs []string, f Family) (netip.Addr, bool) {
	for _, a := range addrs {
		if ip, err := netip.ParseAddr(a); err == nil && FamilyOf(ip) == f {
			return ip.Unmap(), true
		}
	}
	return netip.Addr{}, false
}

func addrsOfFamily(addrs []string, f Family) []netip.Addr {
	var out []netip.Addr
	for _, a := range addrs {
		if ip, err := netip.ParseAddr(a); err == nil && FamilyOf(ip) == f {
			out = append(out, ip.Unmap())
		}
	}
	return out
}

type endpoint struct {
	ap    netip.AddrPort
	local bool
	e     *cluster.Endpoint
}

// desirePort computes one port's entries; scratch is reused across calls
// (nothing of it is kept: entries hold address values only).
func desirePort(s cluster.Service, p cluster.ServicePort, vip netip.Addr, all []cluster.Endpoint, f Family, nodeName string, scratch *[]endpoint) *DesiredPort {
	dp := &DesiredPort{ServicePort: ServicePort{Name: PortName{Namespace: s.Namespace, Name: s.Name, Port: p.Name}, Protocol: p.Protocol}}
	eps := (*scratch)[:0]
	defer func() { clear(eps); *scratch = eps[:0] }()
	var seen map[netip.AddrPort]int
	if len(all) > 32 {
		seen = make(map[netip.AddrPort]int, len(all))
	}
	find := func(ap netip.AddrPort) (int, bool) {
		if seen != nil {
			i, ok := seen[ap]
			return i, ok
		}
		for i := range eps {
			if eps[i].ap == ap {
				return i, true
			}
		}
		return 0, false
	}
	for i := range all {
		e := &all[i]
		if e.Secondary || e.PortName != p.Name || (e.Protocol != "" && e.Protocol != p.Protocol) || e.Port <= 0 || e.Port > 65535 {
			continue
		}
		a, err := netip.ParseAddr(e.Address)
		if err != nil || FamilyOf(a) != f {
			continue
		}
		ap := netip.AddrPortFrom(a.Unmap(), uint16(e.Port))
		local := nodeName != "" && e.NodeName == nodeName
		if i, dup := find(ap); dup {
			// kube-proxy keeps the first, or a local duplicate.
			if local {
				eps[i] = endpoint{ap, local, e}
			}
			continue
		}
		if seen != nil {
			seen[ap] = len(eps)
		}
		eps = append(eps, endpoint{ap, local, e})
		if e.SliceChanged.After(dp.Changed) {
			dp.Changed = e.SliceChanged
		}
	}
	dp.Endpoints = len(eps)
	externalIPs := addrsOfFamily(s.ExternalIPs, f)
	lbIPs := addrsOfFamily(s.LoadBalancerIPs, f)
	externallyAccessible := p.NodePort != 0 || len(externalIPs) > 0 || len(lbIPs) > 0
	usesCluster := !s.InternalPolicyLocal || externallyAccessible
	usesLocal := s.InternalPolicyLocal || (s.ExternalPolicyLocal && externallyAccessible)

	var clusterEPs, localEPs []netip.AddrPort
	hasAny := false
	if usesCluster {
		allHinted, anyReady := true, false
		for _, e := range eps {
			if e.e.Ready {
				anyReady = true
				if !e.e.Hinted {
					allHinted = false
				}
			}
		}
		dp.Subset = anyReady && allHinted
		clusterEPs = make([]netip.AddrPort, 0, len(eps))
		for _, e := range eps {
			if cluster.UsableForCluster(*e.e, anyReady) {
				clusterEPs = append(clusterEPs, e.ap)
			}
		}
		hasAny = len(clusterEPs) > 0
	}
	if usesLocal {
		var localReady, localServingTerm []netip.AddrPort
		for _, e := range eps {
			switch {
			case e.e.Ready:
				hasAny = true
				if e.local {
					localReady = append(localReady, e.ap)
				}
			case e.e.Serving && e.e.Terminating:
				hasAny = true
				if e.local {
					localServingTerm = append(localServingTerm, e.ap)
				}
			}
		}
		localEPs = localReady
		if len(localEPs) == 0 {
			localEPs = localServingTerm
		}
	}

	// Both are this call's own slices: sorted and deduplicated in place.
	clusterEPs, localEPs = sortedSet(clusterEPs), sortedSet(localEPs)
	entry := func(kind Kind, addr netip.Addr, port uint16, policyLocal bool) {
		e := Entry{Kind: kind, Key: EntryKey{Addr: addr, Protocol: p.Protocol, Port: port}}
		switch {
		case !hasAny:
			e.Verdict = Reject
		case policyLocal && len(localEPs) == 0:
			e.Verdict = Drop
		case policyLocal:
			e.Verdict, e.Backends = Forward, localEPs
		default:
			e.Verdict, e.Backends = Forward, clusterEPs
		}
		dp.add(e)
	}
	entry(ClusterIP, vip, uint16(p.Port), s.InternalPolicyLocal)
	for _, a := range externalIPs {
		entry(ExternalIP, a, uint16(p.Port), s.ExternalPolicyLocal)
	}
	for _, a := range lbIPs {
		entry(LoadBalancer, a, uint16(p.Port), s.ExternalPolicyLocal)
	}
	if p.NodePort != 0 {
		entry(NodePort, netip.Addr{}, uint16(p.NodePort), s.ExternalPolicyLocal)
	}
	return dp
}
