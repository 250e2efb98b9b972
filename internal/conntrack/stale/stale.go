// Package stale is the model of stale conntrack entries of Services (the
// ConntrackStaleServiceEntries detector judges with it): an index of the
// Service addresses kube-proxy programs (dataplane.Desire: ClusterIPs,
// external IPs, load-balancer IPs and the NodePorts on the node's own
// addresses), with the endpoints serving each, against which each
// conntrack entry is classified as it is streamed (Index.Observe, no
// allocation unless the entry is stale); the Service addresses remembered
// over cycles to recognise the entries of Services deleted since
// (Remember); and the view part of the index kept per view generation
// (BaseCache). What counts as stale: an entry to a Service address whose
// reply source is not a serving endpoint of that Service (or not DNATed
// although the Service now has one), never one whose reply source serves
// any Service (a flush by reply source would cut that Service's entries
// too), and only once the Service's newest change is older than the grace.
// Thresholds, findings and evidence are the detector's.
package stale

import (
	"fmt"
	"net/netip"
	"sort"
	"strings"
	"time"

	"github.com/remediate-dev/remediate/internal/cluster"
	"github.com/remediate-dev/remediate/internal/conntrack"
	"github.com/remediate-dev/remediate/internal/dataplane"
)

// VIP is one Service address:port of one protocol.
type VIP struct {
	Addr  netip.Addr
	Port  uint16
	Proto uint8
}

func (v VIP) String() string {
	return fmt.Sprintf("%s/%s", ProtoName(v.Proto), netip.AddrPortFrom(v.Addr, v.Port))
}

// Known is a remembered Service address.
type Known struct {
	Service string
	// MissingSince is the first cycle that no longer saw the Service
	// (zero while it exists).
	MissingSince time.Time
}

// port is what the index knows of one Service address.
type port struct {
	service string
	kind    dataplane.Kind
	// changed is the newest API change of the Service and its slices, or
	// when a deleted Service was first missed.
	changed time.Time
	deleted bool
	// backends are the serving endpoints of this Service port (empty when
	// scaled to zero).
	backends map[netip.AddrPort]bool
}

// Index classifies conntrack entries against the cluster view.
type Index struct {
	now   time.Time
	grace time.Duration
	// vips, nodePorts, local and live are shared with later cycles
	// (BaseCache): read only.
	vips map[VIP]*port
	// gone are the remembered Service addresses no longer in the view.
	gone map[VIP]*port
	// nodePorts are keyed by the unspecified address of their family;
	// they match entries to one of the node's own addresses (local).
	nodePorts map[VIP]*port
	local     map[netip.Addr]bool
	// live are the endpoints serving any Service: flushing by reply source
	// would hit their entries of other Services too, so they are never
	// reported.
	live map[netip.AddrPort]bool

	stale       map[backendKey]*Backend
	inGrace     int
	sharedLive  int
	serviceFlow int
}

// backendKey is one reply source of one protocol.
type backendKey struct {
	Proto   uint8
	Backend netip.AddrPort
}

// Backend is one reply source (address:port of one protocol) of stale
// entries, with what the index learnt of them.
type Backend struct {
	key      backendKey
	entries  int
	services map[string]bool
	vips     map[VIP]bool
	reasons  map[string]bool
	oldest   time.Time // oldest change among the Services concerned
}

// MaxListed bounds the Services and addresses remembered per stale
// backend (memory).
const MaxListed = 32

// ProtoName is "UDP", "TCP", or the protocol number.
func ProtoName(p uint8) string {
	switch p {
	case conntrack.ProtoUDP:
		return "UDP"
	case conntrack.ProtoTCP:
		return "TCP"
	}
	return fmt.Sprint(p)
}

func protoNum(s string) (uint8, bool) {
	switch s {
	case "UDP":
		return conntrack.ProtoUDP, true
	case "TCP":
		return conntrack.ProtoTCP, true
	}
	return 0, false
}

// buildIndex indexes the Service addresses kube-proxy programs
// (dataplane.Desire: ClusterIPs, external IPs, load-balancer IPs, and the
// NodePorts on the node's own addresses local) and the remembered deleted
// ones, with the endpoints serving each.
func buildIndex(v cluster.View, nodeName string, fams []dataplane.Family, known map[VIP]Known, local []netip.Addr, now time.Time, grace time.Duration) *Index {
	return NewIndex(buildBase(v, nodeName, fams, local), known, now, grace)
}

// Base is the part of the index derived from the cluster view and the
// node's addresses alone: kept while neither changed (BaseCache), read
// only once built.
type Base struct {
	vips      map[VIP]*port
	nodePorts map[VIP]*port
	local     map[netip.Addr]bool
	live      map[netip.AddrPort]bool
}

// NewIndex is the index of one cycle: the shared base plus the Service
// addresses remembered from earlier cycles that the view no longer has
// (gone).
func NewIndex(b *Base, known map[VIP]Known, now time.Time, grace time.Duration) *Index {
	ix := &Index{now: now, grace: grace, vips: b.vips, nodePorts: b.nodePorts, local: b.local, live: b.live,
		stale: map[backendKey]*Backend{}}
	for vip, k := range known {
		if _, ok := ix.vips[vip]; ok || k.MissingSince.IsZero() {
			continue
		}
		if ix.gone == nil {
			ix.gone = map[VIP]*port{}
		}
		ix.gone[vip] = &port{service: k.Service, kind: dataplane.ClusterIP, changed: k.MissingSince, deleted: true, backends: map[netip.AddrPort]bool{}}
	}
	return ix
}

// buildBase reads the view once: each Service's endpoints are merged
// once (View.Endpoints builds them) and shared by the live set and the
// per-port serving sets; the desired state is dataplane.DesireCached,
// shared with DataplaneDrift's comparison of the same view generation.
func buildBase(v cluster.View, nodeName string, fams []dataplane.Family, local []netip.Addr) *Base {
	b := &Base{vips: map[VIP]*port{}, nodePorts: map[VIP]*port{}, local: map[netip.Addr]bool{}, live: map[netip.AddrPort]bool{}}
	for _, a := range local {
		b.local[a.Unmap()] = true
	}
	svcs := v.Services()
	eps := make(map[[2]string][]cluster.Endpoint, len(svcs))
	// Every endpoint that serves (ready, or serving while terminating) of
	// any Service, any address: never a flush target.
	for _, s := range svcs {
		list := v.Endpoints(s.Namespace, s.Name)
		eps[[2]string{s.Namespace, s.Name}] = list
		for _, e := range list {
			if !(e.Ready || e.Serving) || e.Port <= 0 || e.Port > 65535 {
				continue
			}
			if a, err := netip.ParseAddr(e.Address); err == nil {
				b.live[netip.AddrPortFrom(a.Unmap(), uint16(e.Port))] = true
			}
		}
	}
	for _, f := range fams {
		d := dataplane.DesireCached(v, f, nodeName)
		for name, dp := range d.Ports {
			proto, ok := protoNum(dp.Protocol)
			if !ok {
				continue
			}
			changed := dp.Changed
			if dp.Created.After(changed) {
				changed = dp.Created
			}
			backends := serving(eps[[2]string{name.Namespace, name.Name}], name, dp.Protocol, f)
			for _, e := range dp.Entries {
				for _, be := range e.Backends { // what kube-proxy forwards to
					backends[be] = true
				}
				sp := &port{service: name.String(), kind: e.Kind, changed: changed, backends: backends}
				if e.Kind == dataplane.NodePort || !e.Key.Addr.IsValid() {
					// Keyed by port and protocol; the family is the
					// address's (an IPv4 node address and an IPv6 one).
					fam := netip.IPv4Unspecified()
					if f == dataplane.IPv6 {
						fam = netip.IPv6Unspecified()
					}
					b.nodePorts[VIP{fam, e.Key.Port, proto}] = sp
					continue
				}
				b.vips[VIP{e.Key.Addr.Unmap(), e.Key.Port, proto}] = sp
			}
		}
	}
	return b
}

// baseKey is what a kept Base was built from: the view and its
// generation, the node, the families and the node's addresses.
type baseKey struct {
	view  cluster.View
	gen   uint64
	node  string
	fams  string
	local string
}

// BaseCache keeps the last base. A view that does not count its
// generations (cluster.Generational) is read every cycle.
type BaseCache struct {
	key  baseKey
	base *Base
	// builds counts the bases built (not reused), for tests.
	builds int
}

// Get returns the base of the view at its generation for the node, the
// families and the node's addresses local: the kept one when none of them
// changed, else a new one (kept in its place).
func (c *BaseCache) Get(v cluster.View, nodeName string, fams []dataplane.Family, local []netip.Addr) *Base {
	g, ok := v.(cluster.Generational)
	if !ok {
		c.builds++
		return buildBase(v, nodeName, fams, local)
	}
	var fs, ls strings.Builder
	for _, f := range fams {
		fs.WriteString(string(f) + ",")
	}
	for _, a := range local {
		ls.WriteString(a.String() + ",")
	}
	k := baseKey{view: v, gen: g.Generation(), node: nodeName, fams: fs.String(), local: ls.String()}
	if c.base != nil && c.key == k {
		return c.base
	}
	c.builds++
	c.key, c.base = k, buildBase(v, nodeName, fams, local)
	return c.base
}

// serving returns the endpoints of one Service port that serve: ready,
// or serving while terminating (kube-proxy's fallback), of the family.
func serving(eps []cluster.Endpoint, name dataplane.PortName, proto string, f dataplane.Family) map[netip.AddrPort]bool {
	out := map[netip.AddrPort]bool{}
	for _, e := range eps {
		if e.PortName != name.Port || (e.Protocol != "" && e.Protocol != proto) || !(e.Ready || e.Serving) || e.Port <= 0 || e.Port > 65535 {
			continue
		}
		if a, err := netip.ParseAddr(e.Address); err == nil && dataplane.FamilyOf(a.Unmap()) == f {
			out[netip.AddrPortFrom(a.Unmap(), uint16(e.Port))] = true
		}
	}
	return out
}

// Observe classifies one entry. Hot path: no allocation unless the entry
// is stale.
func (ix *Index) Observe(fl *conntrack.Flow) {
	vip := VIP{fl.OrigDst.Addr().Unmap(), fl.OrigDst.Port(), fl.Proto}
	sp := ix.vips[vip]
	if sp == nil {
		sp = ix.gone[vip]
	}
	if sp == nil && ix.local[vip.Addr] {
		fam := netip.IPv4Unspecified()
		if vip.Addr.Is6() {
			fam = netip.IPv6Unspecified()
		}
		sp = ix.nodePorts[VIP{fam, vip.Port, vip.Proto}]
	}
	if sp == nil {
		return
	}
	ix.serviceFlow++
	reply := netip.AddrPortFrom(fl.ReplySrc.Addr().Unmap(), fl.ReplySrc.Port())
	var reason string
	switch {
	case sp.backends[reply]:
		return // a serving backend of this Service
	case reply == netip.AddrPortFrom(vip.Addr, vip.Port):
		// Not DNATed: made while the Service had no endpoint (or no rule);
		// it blackholes the client once endpoints exist.
		if len(sp.backends) == 0 {
			return
		}
		reason = "not DNATed although the Service now has serving endpoints"
	case ix.live[reply]:
		// Serving another Service: a flush by reply source would cut
		// that Service's entries too.
		ix.sharedLive++
		return
	case sp.deleted:
		reason = "Service (or this port) deleted"
	case len(sp.backends) == 0:
		reason = "Service has no serving endpoint"
	default:
		reason = "not a serving endpoint of the Service"
	}
	if ix.now.Sub(sp.changed) < ix.grace || sp.changed.IsZero() {
		ix.inGrace++
		return
	}
	k := backendKey{fl.Proto, reply}
	b := ix.stale[k]
	if b == nil {
		b = &Backend{key: k, services: map[string]bool{}, vips: map[VIP]bool{}, reasons: map[string]bool{}, oldest: sp.changed}
		ix.stale[k] = b
	}
	b.entries++
	if len(b.services) < MaxListed {
		b.services[sp.service] = true
	}
	if len(b.vips) < MaxListed {
		b.vips[vip] = true
	}
	b.reasons[reason] = true
	if sp.changed.Before(b.oldest) {
		b.oldest = sp.changed
	}
}

// Remember updates the remembered Service addresses from the view (pure:
// returns the new map). A Service address no longer in the view is kept
// with the first time it was missed; at most max are kept, the ones
// missing longest dropped first.
func Remember(known map[VIP]Known, ix *Index, now time.Time, max int) map[VIP]Known {
	if rememberedAlready(known, ix, max) {
		return known
	}
	out := make(map[VIP]Known, len(known))
	for vip, sp := range ix.vips {
		if !sp.deleted {
			out[vip] = Known{Service: sp.service}
		}
	}
	for vip, k := range known {
		if _, ok := out[vip]; ok {
			continue
		}
		if k.MissingSince.IsZero() {
			k.MissingSince = now
		}
		out[vip] = k
	}
	if len(out) > max {
		type kv struct {
			vip VIP
			k   Known
		}
		var missing []kv
		for vip, k := range out {
			if !k.MissingSince.IsZero() {
				missing = append(missing, kv{vip, k})
			}
		}
		sort.Slice(missing, func(i, j int) bool { return missing[i].k.MissingSince.Before(missing[j].k.MissingSince) })
		for _, m := range missing {
			if len(out) <= max {
				break
			}
			delete(out, m.vip)
		}
	}
	return out
}

// rememberedAlready reports whether Remember would return known as it is:
// every Service address of the index is known under its Service, none is
// missing, and known holds nothing else (a quiet cluster's every cycle:
// 5,000 Services cost a map of 5,000 entries a cycle to rebuild it).
func rememberedAlready(known map[VIP]Known, ix *Index, max int) bool {
	if len(known) > max {
		return false
	}
	n := 0
	for vip, sp := range ix.vips {
		if sp.deleted {
			continue
		}
		k, ok := known[vip]
		if !ok || k.Service != sp.service || !k.MissingSince.IsZero() {
			return false
		}
		n++
	}
	return n == len(known)
}

// Proto is the entries' protocol (conntrack.ProtoUDP, conntrack.ProtoTCP).
func (b *Backend) Proto() uint8 { return b.key.Proto }

// Addr is the reply source of the entries: the backend that no longer
// serves.
func (b *Backend) Addr() netip.AddrPort { return b.key.Backend }

// Entries counts the stale entries answered by this backend.
func (b *Backend) Entries() int { return b.entries }

// Oldest is the oldest change among the Services concerned.
func (b *Backend) Oldest() time.Time { return b.oldest }

// ServiceNames are the Services concerned ("namespace/name:port"), sorted; at
// most MaxListed.
func (b *Backend) ServiceNames() []string { return sortedKeys(b.services) }

// Reasons say why the entries are stale, sorted.
func (b *Backend) Reasons() []string { return sortedKeys(b.reasons) }

// ServiceAddrs are the Service addresses of the entries ("UDP/10.96.0.10:53"),
// sorted; at most MaxListed.
func (b *Backend) ServiceAddrs() []string {
	out := make([]string, 0, len(b.vips))
	for v := range b.vips {
		out = append(out, v.String())
	}
	sort.Strings(out)
	return out
}

func sortedKeys(m map[string]bool) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// Backends returns the stale backends of at least minEntries entries, most
// entries first (then UDP before TCP, then by address).
func (ix *Index) Backends(minEntries int) []*Backend {
	list := make([]*Backend, 0, len(ix.stale))
	for _, b := range ix.stale {
		if b.entries >= minEntries {
			list = append(list, b)
		}
	}
	sort.Slice(list, func(i, j int) bool {
		if list[i].entries != list[j].entries {
			return list[i].entries > list[j].entries
		}
		if list[i].key.Proto != list[j].key.Proto {
			return list[i].key.Proto > list[j].key.Proto // UDP first
		}
		return list[i].key.Backend.String() < list[j].key.Backend.String()
	})
	return list
}

// Counts are an index's totals over the entries observed.
type Counts struct {
	// ServiceEntries are the entries to a Service address.
	ServiceEntries int
	// WithinGrace are the stale ones held back by the grace.
	WithinGrace int
	// BackendServesOther are the ones whose reply source serves another
	// Service (never reported).
	BackendServesOther int
}

// Counts returns the totals of the entries observed so far.
func (ix *Index) Counts() Counts {
	return Counts{ServiceEntries: ix.serviceFlow, WithinGrace: ix.inGrace, BackendServesOther: ix.sharedLive}
}

// Builds counts the bases built (not reused): a test's measure of the
// cache.
func (c *BaseCache) Builds() int { return c.builds }
