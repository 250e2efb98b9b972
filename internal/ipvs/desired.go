package ipvs

import (
	"bufio"
	"net/netip"
	"path/filepath"
	"sort"
	"strings"

	"github.com/remediate-dev/remediate/internal/boundedfile"
	"github.com/remediate-dev/remediate/internal/cluster"
)

// Frontend kinds: how a Service port is exposed as an IPVS virtual server.
const (
	KindClusterIP    = "ClusterIP"
	KindExternalIP   = "ExternalIP"
	KindLoadBalancer = "LoadBalancer"
	KindNodePort     = "NodePort"
)

// ServicePort is one port of one Service with its endpoints, as kube-proxy
// in IPVS mode would program it.
type ServicePort struct {
	Namespace string
	Name      string
	Port      cluster.ServicePort
	// Endpoints are the Service's endpoints for this port (any condition).
	Endpoints []cluster.Endpoint
	// Expected are the endpoints kube-proxy programs as real servers: the
	// ready ones, or, when none is ready, the serving terminating ones
	// (kube-proxy keeps sending to those rather than dropping traffic).
	Expected map[netip.AddrPort]cluster.Endpoint
}

// ServiceName is "namespace/name".
func (sp *ServicePort) ServiceName() string { return sp.Namespace + "/" + sp.Name }

// Frontend is one virtual server the view says should exist.
type Frontend struct {
	VS   VirtualServer
	Kind string
	SP   *ServicePort
}

// Desired is the set of virtual servers and real servers the cluster view
// calls for. Build it with NewDesired; it is read-only afterwards.
type Desired struct {
	frontends map[frontendKey]Frontend
	// nodePorts maps protocol and NodePort to the service ports with it.
	nodePorts map[nodePortKey][]*ServicePort
	// addrs are the ClusterIP, external and load-balancer addresses.
	addrs map[netip.Addr]bool
	ports []*ServicePort
}

// frontendKey and nodePortKey are map keys that cost no allocation to
// build (Lookup runs once per virtual server and connection entry).
type frontendKey struct {
	addr  netip.Addr
	proto string
	port  uint16
}

type nodePortKey struct {
	proto string
	port  uint16
}

func keyOf(vs VirtualServer) frontendKey {
	return frontendKey{vs.Address.Unmap(), vs.Protocol, vs.Port}
}

// NewDesired computes the desired IPVS state from the view's Services and
// endpoints. nodeIPs, when given, are the addresses NodePort virtual servers
// are expected on; without them a NodePort virtual server is recognised by
// protocol and port alone.
func NewDesired(v cluster.View, nodeIPs []netip.Addr) *Desired {
	d := &Desired{frontends: map[frontendKey]Frontend{}, nodePorts: map[nodePortKey][]*ServicePort{}, addrs: map[netip.Addr]bool{}}
	for _, s := range v.Services() {
		eps := v.Endpoints(s.Namespace, s.Name)
		for _, p := range s.Ports {
			sp := &ServicePort{Namespace: s.Namespace, Name: s.Name, Port: p}
			for _, e := range eps {
				if e.PortName != p.Name || (e.Protocol != "" && e.Protocol != p.Protocol) {
					continue
				}
				sp.Endpoints = append(sp.Endpoints, e)
			}
			sp.Expected = expectedEndpoints(sp.Endpoints)
			d.ports = append(d.ports, sp)
			add := func(addr, kind string) {
				a, err := netip.ParseAddr(addr)
				if err != nil {
					return
				}
				a = a.Unmap()
				d.addrs[a] = true
				vs := VirtualServer{Address: a, Protocol: p.Protocol, Port: uint16(p.Port)}
				if _, dup := d.frontends[keyOf(vs)]; !dup {
					d.frontends[keyOf(vs)] = Frontend{VS: vs, Kind: kind, SP: sp}
				}
			}
			for _, ip := range s.ClusterIPs {
				add(ip, KindClusterIP)
			}
			for _, ip := range s.ExternalIPs {
				add(ip, KindExternalIP)
			}
			for _, ip := range s.LoadBalancerIPs {
				add(ip, KindLoadBalancer)
			}
			if p.NodePort > 0 {
				k := nodePortKey{p.Protocol, uint16(p.NodePort)}
				d.nodePorts[k] = append(d.nodePorts[k], sp)
				for _, ip := range nodeIPs {
					vs := VirtualServer{Address: ip.Unmap(), Protocol: p.Protocol, Port: uint16(p.NodePort)}
					if _, dup := d.frontends[keyOf(vs)]; !dup {
						d.frontends[keyOf(vs)] = Frontend{VS: vs, Kind: KindNodePort, SP: sp}
					}
				}
			}
		}
	}
	return d
}

func expectedEndpoints(eps []cluster.Endpoint) map[netip.AddrPort]cluster.Endpoint {
	out := map[netip.AddrPort]cluster.Endpoint{}
	anyReady := false
	for _, e := range eps {
		if e.Ready && !e.Secondary {
			anyReady = true
			break
		}
	}
	for _, e := range eps {
		if cluster.UsableForCluster(e, anyReady) {
			if ap, ok := endpointAddrPort(e); ok {
				out[ap] = e
			}
		}
	}
	return out
}

func endpointAddrPort(e cluster.Endpoint) (netip.AddrPort, bool) {
	a, err := netip.ParseAddr(e.Address)
	if err != nil || e.Port <= 0 || e.Port > 65535 {
		return netip.AddrPort{}, false
	}
	return netip.AddrPortFrom(a.Unmap(), uint16(e.Port)), true
}

// Lookup returns the Service port a virtual server belongs to: an exact
// ClusterIP, external, load-balancer or (with node IPs) NodePort frontend,
// else, for an address that is none of the Services' addresses, a NodePort
// with the same protocol and port. ok is false when the view says the
// virtual server should not exist. A NodePort shared by several Services
// (impossible in a consistent cluster) is reported as not found by the
// fallback only if no Service has it.
func (d *Desired) Lookup(vs VirtualServer) (Frontend, bool) {
	if vs.FWMark != 0 {
		return Frontend{}, false
	}
	vs.Address = vs.Address.Unmap()
	if f, ok := d.frontends[keyOf(vs)]; ok {
		return f, true
	}
	if d.addrs[vs.Address] {
		return Frontend{}, false
	}
	if sps := d.nodePorts[nodePortKey{vs.Protocol, vs.Port}]; len(sps) > 0 {
		return Frontend{VS: vs, Kind: KindNodePort, SP: sps[0]}, true
	}
	return Frontend{}, false
}

// Frontends returns every virtual server the view calls for, sorted by key.
func (d *Desired) Frontends() []Frontend {
	out := make([]Frontend, 0, len(d.frontends))
	for _, f := range d.frontends {
		out = append(out, f)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].VS.Key() < out[j].VS.Key() })
	return out
}

// Empty reports whether the view has no Service at all. Every cluster has
// default/kubernetes, so an empty view is broken (RBAC, wrong cluster), and
// nothing may be judged stale against it.
func (d *Desired) Empty() bool { return len(d.ports) == 0 && len(d.addrs) == 0 }

// IsServiceAddress reports whether a is a ClusterIP, external or
// load-balancer address of some Service.
func (d *Desired) IsServiceAddress(a netip.Addr) bool { return d.addrs[a.Unmap()] }

// Backend classifications (see Classify).
const (
	// BackendExpected: kube-proxy programs it now.
	BackendExpected = "expected"
	// BackendNotEndpoint: no endpoint of the Service port has this
	// address:port (the pod is gone).
	BackendNotEndpoint = "not-an-endpoint"
	// BackendNotServing: the endpoint exists but is neither ready nor
	// serving.
	BackendNotServing = "endpoint-not-serving"
	// BackendTerminatingWhileReady: the endpoint is terminating but still
	// serving, and ready endpoints exist, so kube-proxy no longer uses it.
	BackendTerminatingWhileReady = "terminating-while-ready-endpoints-exist"
)

// Classify says how a backend address:port stands for sp.
func (sp *ServicePort) Classify(ap netip.AddrPort) string {
	ap = netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port())
	if _, ok := sp.Expected[ap]; ok {
		return BackendExpected
	}
	for _, e := range sp.Endpoints {
		if eap, ok := endpointAddrPort(e); ok && eap == ap {
			if e.Serving || e.Ready {
				return BackendTerminatingWhileReady
			}
			return BackendNotServing
		}
	}
	return BackendNotEndpoint
}

// Dead reports whether a classification means the backend cannot answer
// (gone or not serving), as opposed to merely no longer chosen.
func Dead(class string) bool { return class == BackendNotEndpoint || class == BackendNotServing }

// KubeIPVSInterfacePresent reports whether the kube-ipvs0 interface that
// kube-proxy creates in IPVS mode is listed in <procRoot>/net/dev.
func KubeIPVSInterfacePresent(procRoot string) (bool, error) {
	if procRoot == "" {
		procRoot = "/proc"
	}
	f, err := boundedfile.OpenBounded(filepath.Join(procRoot, "net", "dev"), 16<<20)
	if err != nil {
		return false, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		name, _, ok := strings.Cut(sc.Text(), ":")
		if ok && strings.TrimSpace(name) == "kube-ipvs0" {
			return true, nil
		}
	}
	return false, sc.Err()
}

// Draining reports whether kube-proxy is gracefully terminating rs: weight
// 0 with connections left, which kube-proxy does for TCP and SCTP only (UDP
// real servers are removed at once).
func Draining(vs VirtualServer, rs RealServer) bool {
	return vs.Protocol != UDP && rs.Weight == 0 && rs.ActiveConns+rs.InactiveConns > 0
}

// Managed reports whether addr is in kube-proxy's scope: one of cidrs or
// nodeIPs, or a Service address in the view.
func Managed(addr netip.Addr, cidrs []netip.Prefix, nodeIPs []netip.Addr, d *Desired) bool {
	addr = addr.Unmap()
	for _, p := range cidrs {
		if p.Contains(addr) {
			return true
		}
	}
	for _, ip := range nodeIPs {
		if ip == addr {
			return true
		}
	}
	return d.IsServiceAddress(addr)
}
