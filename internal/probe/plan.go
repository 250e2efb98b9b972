package probe

import (
	"fmt"
	"net/netip"
	"sort"
	"strconv"
	"strings"

	"github.com/remediate-dev/remediate/internal/cluster"
)

// This file plans what the Service path probe connects to: which Service
// ports, in which families, through which ClusterIP, compared with which
// endpoints (kube-proxy's own choice for ClusterIP traffic from this node),
// and why a configured Service is not probed. Pure: the cluster view in,
// the paths out; what a failing path means is the detector's judgement.

// Spec is one Service to probe; Port is a port name, a number, or ""
// (the first TCP port).
type Spec struct {
	Namespace, Name, Port string
}

// String is "namespace/name[/port]", as configured.
func (s Spec) String() string {
	if s.Port == "" {
		return s.Namespace + "/" + s.Name
	}
	return s.Namespace + "/" + s.Name + "/" + s.Port
}

// ParseCanary reads "namespace/name[/port]".
func ParseCanary(c string) (Spec, error) {
	parts := strings.Split(c, "/")
	if len(parts) < 2 || len(parts) > 3 {
		return Spec{}, fmt.Errorf("%q: want namespace/name or namespace/name/port", c)
	}
	for _, p := range parts[:2] {
		if !isDNSLabel(p) {
			return Spec{}, fmt.Errorf("%q: %q is not a namespace or Service name", c, p)
		}
	}
	s := Spec{Namespace: parts[0], Name: parts[1]}
	if len(parts) == 3 {
		s.Port = parts[2]
		if n, err := strconv.Atoi(s.Port); err == nil {
			if n < 1 || n > 65535 {
				return Spec{}, fmt.Errorf("%q: port %d out of range", c, n)
			}
		} else if !isDNSLabel(s.Port) {
			return Spec{}, fmt.Errorf("%q: %q is neither a port number nor a port name", c, s.Port)
		}
	}
	return s, nil
}

// isDNSLabel: lower-case alphanumerics and '-', 1..63, not starting or
// ending with '-'.
func isDNSLabel(s string) bool {
	if len(s) == 0 || len(s) > 63 || s[0] == '-' || s[len(s)-1] == '-' {
		return false
	}
	for _, r := range s {
		if !(r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r == '-') {
			return false
		}
	}
	return true
}

// Path is one Service port of one family to probe.
type Path struct {
	// Ref names the path (and its finding's target).
	Ref Ref
	// PortName is the Service port's name ("" when unnamed).
	PortName string
	// VIP is the ClusterIP and Service port connected to.
	VIP netip.AddrPort
	// Backends are the endpoints kube-proxy sends this node's ClusterIP
	// traffic to (ready, or serving-terminating as its fallback; local
	// ones only with internalTrafficPolicy Local), sorted.
	Backends []netip.AddrPort
}

// Plan resolves the specs against the view: the paths to
// probe, in spec order (family order within a Service), and why the
// others are not probed. Pure.
func Plan(v cluster.View, specs []Spec, families []string, nodeName string) ([]Path, []string) {
	svcs := v.Services()
	find := func(ns, name string) (cluster.Service, bool) {
		i := sort.Search(len(svcs), func(i int) bool {
			return svcs[i].Namespace > ns || svcs[i].Namespace == ns && svcs[i].Name >= name
		})
		if i < len(svcs) && svcs[i].Namespace == ns && svcs[i].Name == name {
			return svcs[i], true
		}
		for _, s := range svcs { // a view not sorted (fakes): linear
			if s.Namespace == ns && s.Name == name {
				return s, true
			}
		}
		return cluster.Service{}, false
	}
	wantFam := map[string]bool{}
	for _, f := range families {
		wantFam[f] = true
	}
	var paths []Path
	var not []string
	for _, spec := range specs {
		s, ok := find(spec.Namespace, spec.Name)
		switch {
		case !ok:
			not = append(not, spec.String()+": not in the cluster view")
			continue
		case s.Type == "ExternalName":
			not = append(not, spec.String()+": ExternalName (kube-proxy does not proxy it)")
			continue
		case s.ProxyName != "":
			not = append(not, spec.String()+": belongs to service proxy "+s.ProxyName)
			continue
		case len(s.ClusterIPs) == 0:
			not = append(not, spec.String()+": headless (no ClusterIP)")
			continue
		}
		var sp *cluster.ServicePort
		for i := range s.Ports {
			p := &s.Ports[i]
			switch {
			case spec.Port == "" && (p.Protocol == "TCP" || p.Protocol == ""):
			case spec.Port != "" && (spec.Port == p.Name || spec.Port == strconv.Itoa(int(p.Port))):
			default:
				continue
			}
			sp = p
			break
		}
		if sp == nil {
			not = append(not, spec.String()+": no such TCP port")
			continue
		}
		if sp.Protocol != "TCP" && sp.Protocol != "" {
			not = append(not, fmt.Sprintf("%s: port %d is %s (only TCP is probed)", spec, sp.Port, sp.Protocol))
			continue
		}
		eps := v.Endpoints(s.Namespace, s.Name)
		// ClusterIPs of a family the policy leaves out; said when they
		// are all the Service has (an IPv6 single-stack cluster with
		// families [IPv4] would otherwise skip with no reason).
		var otherFam []string
		wanted := 0
		for _, ip := range s.ClusterIPs {
			a, err := netip.ParseAddr(ip)
			if err != nil {
				not = append(not, fmt.Sprintf("%s: ClusterIP %q is not an IP address", spec, ip))
				continue
			}
			a = a.Unmap()
			fam := "IPv4"
			if a.Is6() {
				fam = "IPv6"
			}
			if !wantFam[fam] {
				otherFam = append(otherFam, fmt.Sprintf("%s is %s", a, fam))
				continue
			}
			wanted++
			path := Path{Ref: Ref{Family: fam, Namespace: s.Namespace, Name: s.Name, Port: sp.Port},
				PortName: sp.Name, VIP: netip.AddrPortFrom(a, uint16(sp.Port))}
			path.Backends = usableBackends(eps, sp.Name, fam, s.InternalPolicyLocal, nodeName)
			if len(path.Backends) == 0 {
				why := "no ready endpoint (kube-proxy rejects its traffic by design)"
				if s.InternalPolicyLocal {
					why = "internalTrafficPolicy Local and no ready endpoint on this node (kube-proxy drops by design)"
				}
				not = append(not, fmt.Sprintf("%s %s %s: %s", spec, fam, path.VIP, why))
				continue
			}
			paths = append(paths, path)
		}
		if wanted == 0 && len(otherFam) > 0 {
			not = append(not, fmt.Sprintf("%s: its ClusterIP %s, not in families %v", spec, strings.Join(otherFam, ", "), families))
		}
	}
	return paths, not
}

// usableBackends applies kube-proxy's choice of endpoints for ClusterIP
// traffic from this node (cluster.UsableForCluster; internalTrafficPolicy
// Local keeps the node's own).
func usableBackends(eps []cluster.Endpoint, portName, fam string, local bool, nodeName string) []netip.AddrPort {
	var cand []cluster.Endpoint
	for _, e := range eps {
		if e.PortName != portName || (e.Protocol != "" && e.Protocol != "TCP") || e.Port < 1 || e.Port > 65535 {
			continue
		}
		if local && e.NodeName != nodeName {
			continue
		}
		a, err := netip.ParseAddr(e.Address)
		if err != nil || a.Unmap().Is4() != (fam == "IPv4") {
			continue
		}
		cand = append(cand, e)
	}
	anyReady := false
	for _, e := range cand {
		anyReady = anyReady || (e.Ready && !e.Secondary)
	}
	var out []netip.AddrPort
	for _, e := range cand {
		if cluster.UsableForCluster(e, anyReady) {
			out = append(out, netip.AddrPortFrom(netip.MustParseAddr(e.Address).Unmap(), uint16(e.Port)))
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Compare(out[j]) < 0 })
	return out
}
