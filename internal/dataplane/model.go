// Package dataplane is one typed model of the service data plane of a node,
// per IP family: for each Service port (namespace/name:port) the entries
// kube-proxy programs for it (ClusterIP, external IP, load-balancer IP,
// NodePort) and, per entry, the backends traffic to it is sent to, or the
// reject/drop verdict when there is none.
//
// The same model is built from two sides:
//
//   - programmed state, what the kernel has now: from an iptables-save
//     snapshot (FromIPTables), from IPVS virtual and real servers
//     (FromIPVS), or from kube-proxy's nftables table;
//   - desired state, what kube-proxy should have programmed from the
//     cluster view, with kube-proxy's own semantics (Desire).
//
// Compare turns the two into per-entry differences; deciding what is
// drift (grace periods, churn) is the detector's job. Everything here is a
// pure function over already-read data: nothing runs a command, takes a
// lock or reads the clock.
package dataplane

import (
	"net/netip"
	"slices"
	"sort"
	"strconv"
	"strings"
)

// Family is an IP family, spelled as kube-proxy's ip_family label.
type Family string

// Families.
const (
	IPv4 Family = "IPv4"
	IPv6 Family = "IPv6"
)

// FamilyOf returns the family of an address.
func FamilyOf(a netip.Addr) Family {
	if a.Unmap().Is4() {
		return IPv4
	}
	return IPv6
}

// PortName is kube-proxy's ServicePortName without the protocol: a port
// name is unique within its Service.
type PortName struct {
	Namespace string
	Name      string
	// Port is the Service port's name ("" for a single unnamed port).
	Port string
}

// String is kube-proxy's spelling: "ns/name:port", or "ns/name" for an
// unnamed port. It is what kube-proxy writes in its rule comments.
func (p PortName) String() string {
	if p.Port == "" {
		return p.Namespace + "/" + p.Name
	}
	return p.Namespace + "/" + p.Name + ":" + p.Port
}

// ParsePortName reads "ns/name[:port]" as kube-proxy writes it. ok is false
// for anything else.
func ParsePortName(s string) (PortName, bool) {
	ns, rest, ok := strings.Cut(s, "/")
	if !ok || ns == "" || rest == "" || strings.ContainsAny(ns, ":/ ") {
		return PortName{}, false
	}
	name, port, _ := strings.Cut(rest, ":")
	if name == "" || strings.ContainsAny(name, "/ ") || strings.ContainsAny(port, ":/ ") {
		return PortName{}, false
	}
	return PortName{Namespace: ns, Name: name, Port: port}, true
}

// Kind is how an entry exposes a Service port.
type Kind string

// Entry kinds.
const (
	ClusterIP    Kind = "ClusterIP"
	ExternalIP   Kind = "ExternalIP"
	LoadBalancer Kind = "LoadBalancer"
	NodePort     Kind = "NodePort"
)

// Verdict is what an entry does with traffic.
type Verdict string

// Verdicts.
const (
	// Forward: load-balanced to Backends.
	Forward Verdict = "forward"
	// Reject: the Service port has no usable endpoints (kube-proxy's
	// "has no endpoints" REJECT rule or no-endpoint-services element).
	Reject Verdict = "reject"
	// Drop: traffic policy Local and no local endpoint ("has no local
	// endpoints").
	Drop Verdict = "drop"
)

// EntryKey identifies an entry within a family: address (invalid for a
// NodePort, which matches every local address), protocol and port.
type EntryKey struct {
	Addr     netip.Addr
	Protocol string // "TCP", "UDP", "SCTP"
	Port     uint16
}

// String is "TCP/10.96.0.1:443" or "TCP/nodePort:30080".
func (k EntryKey) String() string {
	if !k.Addr.IsValid() {
		return k.Protocol + "/nodePort:" + strconv.Itoa(int(k.Port))
	}
	return k.Protocol + "/" + netip.AddrPortFrom(k.Addr, k.Port).String()
}

// Entry is one way into a Service port.
type Entry struct {
	Kind    Kind
	Key     EntryKey
	Verdict Verdict
	// Backends are the endpoints traffic to this entry goes to, sorted.
	// For a desired entry with Subset set, the set kube-proxy may choose
	// from.
	Backends []netip.AddrPort
}

// ServicePort is one Service port of one family with its entries.
type ServicePort struct {
	Name     PortName
	Protocol string
	Entries  []Entry
}

// Entry returns the entry with key k, or nil.
func (sp *ServicePort) Entry(k EntryKey) *Entry {
	for i := range sp.Entries {
		if sp.Entries[i].Key == k {
			return &sp.Entries[i]
		}
	}
	return nil
}

// State is the data plane of one family as one source sees it.
type State struct {
	Family Family
	// Source names where it was read: "iptables-legacy", "iptables-nft",
	// "nftables", "ipvs", or "cluster" for desired state.
	Source string
	Ports  map[PortName]*ServicePort
	// Unattributed are entries that could not be tied to a Service port
	// (an IPVS virtual server, a rule without kube-proxy's comment), by key.
	Unattributed map[EntryKey]Entry
	// Notes are parts of the input the converter did not understand; they
	// never make an entry up.
	Notes []string
}

// NewState returns an empty state.
func NewState(f Family, source string) *State {
	return newState(f, source, 0)
}

func newState(f Family, source string, ports int) *State {
	return &State{Family: f, Source: source, Ports: make(map[PortName]*ServicePort, ports), Unattributed: map[EntryKey]Entry{}}
}

// port returns the ServicePort for n, adding it.
func (s *State) port(n PortName, proto string) *ServicePort {
	sp := s.Ports[n]
	if sp == nil {
		sp = &ServicePort{Name: n, Protocol: proto}
		s.Ports[n] = sp
	}
	if sp.Protocol == "" {
		sp.Protocol = proto
	}
	return sp
}

// add adds or merges an entry: a key seen twice (kube-proxy's localhost
// NodePort rule next to the plain one, a REJECT next to a forward during a
// partial sync) keeps Forward over Drop over Reject and the union of
// backends.
func (sp *ServicePort) add(e Entry) {
	if old := sp.Entry(e.Key); old != nil {
		if rankVerdict(e.Verdict) > rankVerdict(old.Verdict) {
			old.Verdict, old.Kind = e.Verdict, e.Kind
		}
		old.Backends = unionSorted(old.Backends, e.Backends)
		return
	}
	if !sortedUnique(e.Backends) {
		e.Backends = unionSorted(nil, e.Backends)
	}
	sp.Entries = append(sp.Entries, e)
}

func rankVerdict(v Verdict) int {
	switch v {
	case Forward:
		return 3
	case Drop:
		return 2
	case Reject:
		return 1
	}
	return 0
}

// Sort orders every port's entries by key, for stable output.
func (s *State) Sort() {
	for _, sp := range s.Ports {
		sort.Slice(sp.Entries, func(i, j int) bool { return lessKey(sp.Entries[i].Key, sp.Entries[j].Key) })
	}
}

func lessKey(a, b EntryKey) bool {
	if c := a.Addr.Compare(b.Addr); c != 0 {
		return c < 0
	}
	if a.Protocol != b.Protocol {
		return a.Protocol < b.Protocol
	}
	return a.Port < b.Port
}

// sortedUnique reports whether s is strictly increasing. Such a slice is
// kept as it is (shared, never modified afterwards).
func sortedUnique(s []netip.AddrPort) bool {
	for i := 1; i < len(s); i++ {
		if s[i-1].Compare(s[i]) >= 0 {
			return false
		}
	}
	return true
}

// unionSorted returns the sorted, deduplicated union of a and b in a new
// slice (nil when both are empty).
// sortedSet sorts a in place and removes duplicates (nil when empty).
func sortedSet(a []netip.AddrPort) []netip.AddrPort {
	if len(a) == 0 {
		return nil
	}
	slices.SortFunc(a, netip.AddrPort.Compare)
	return slices.Compact(a)
}

func unionSorted(a, b []netip.AddrPort) []netip.AddrPort {
	if len(a)+len(b) == 0 {
		return nil
	}
	out := make([]netip.AddrPort, 0, len(a)+len(b))
	out = append(out, a...)
	out = append(out, b...)
	slices.SortFunc(out, netip.AddrPort.Compare)
	return slices.Compact(out)
}
