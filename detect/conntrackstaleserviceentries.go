package detect

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/remediate-dev/remediate/internal/cluster"
	"github.com/remediate-dev/remediate/internal/conntrack"
	"github.com/remediate-dev/remediate/internal/dataplane"
	"github.com/remediate-dev/remediate/internal/finding"
	"github.com/remediate-dev/remediate/internal/kubeproxy"
	"github.com/remediate-dev/remediate/internal/node"
	"github.com/remediate-dev/remediate/policy"
)

// ConntrackStaleServiceEntriesName is the registered type name.
const ConntrackStaleServiceEntriesName = "ConntrackStaleServiceEntries"

// ConntrackStaleServiceEntriesParams configure ConntrackStaleServiceEntries.
type ConntrackStaleServiceEntriesParams struct {
	// Families to scan: IPv4, IPv6 (default both).
	Families []string `yaml:"families"`
	// IncludeTCP also scans TCP entries (default false: UDP only). TCP
	// findings are report-only: FlushConntrack refuses them.
	IncludeTCP bool `yaml:"includeTCP"`
	// Grace: an entry is reported only once the newest API change of its
	// Service and EndpointSlices (their own timestamps), or the first cycle
	// that no longer saw a deleted Service, is older than this, so that
	// kube-proxy's own conntrack cleanup had its chance. Default 90s (3 x
	// kube-proxy's default syncPeriod).
	Grace policy.Duration `yaml:"grace"`
	// MaxScan bounds the entries read per family and protocol per cycle
	// (default 1,000,000); a truncated scan is said in the evidence.
	MaxScan int `yaml:"maxScan"`
	// MinEntries is how many stale entries of one backend make a finding
	// (default 1).
	MinEntries int `yaml:"minEntries"`
	// MaxFindings bounds the findings of one run (default 50, the backends
	// with the most stale entries first).
	MaxFindings int `yaml:"maxFindings"`
	// MaxRemembered bounds the Service addresses remembered to recognise
	// entries of deleted Services (default 100,000).
	MaxRemembered int `yaml:"maxRemembered"`
}

// SetDefaults sets the defaults (registry.Defaulter).
func (p *ConntrackStaleServiceEntriesParams) SetDefaults() {
	*p = ConntrackStaleServiceEntriesParams{Families: []string{"IPv4", "IPv6"}, Grace: policy.D(90 * time.Second),
		MaxScan: 1_000_000, MinEntries: 1, MaxFindings: 50, MaxRemembered: 100_000}
}

// Validate implements policy.Validator.
func (p *ConntrackStaleServiceEntriesParams) Validate() []policy.FieldError {
	errs := validateFamilies(p.Families)
	if p.Grace.Duration < 0 {
		errs = append(errs, policy.FieldError{Field: "grace", Msg: "must not be negative"})
	}
	if p.MaxScan < 1 || p.MaxScan > 10_000_000 {
		errs = append(errs, policy.FieldError{Field: "maxScan", Msg: "must be in [1, 10000000]"})
	}
	if p.MinEntries < 1 {
		errs = append(errs, policy.FieldError{Field: "minEntries", Msg: "must be at least 1"})
	}
	if p.MaxFindings < 1 || p.MaxFindings > 1000 {
		errs = append(errs, policy.FieldError{Field: "maxFindings", Msg: "must be in [1, 1000]"})
	}
	if p.MaxRemembered < 0 {
		errs = append(errs, policy.FieldError{Field: "maxRemembered", Msg: "must not be negative"})
	}
	return errs
}

func init() {
	Define(ConntrackStaleServiceEntriesName,
		"UDP (TCP opt-in) conntrack entries to a Service ClusterIP, external IP, load-balancer IP or NodePort whose reply source is no longer a serving endpoint (Service scaled to zero, deleted, backend replaced), older than a grace: kube-proxy's own cleanup missed them",
		newConntrackStaleServiceEntries, Targets(finding.KindConntrackBackend), UsesClusterView())
}

type conntrackStale struct {
	p ConntrackStaleServiceEntriesParams
	n *node.Node

	mu sync.Mutex
	// known remembers the Service addresses seen, to recognise the entries
	// of Services deleted since (only the daemon, over cycles, can).
	known map[ctVIP]ctKnown
	// localAddrs lists the node's addresses (NodePort destinations).
	localAddrs func() ([]netip.Addr, error)
	// reconRuns are the run counts of kube-proxy's own conntrack
	// reconciler per IP family at the previous cycle (nil before one).
	reconRuns map[kubeproxy.Family]uint64
	// base is the index's part derived from the view, kept per view
	// generation: on a quiet cluster no cycle reads the view.
	base ctBaseCache
}

func newConntrackStaleServiceEntries(p *ConntrackStaleServiceEntriesParams, n *node.Node) (Detector, error) {
	return &conntrackStale{p: *p, n: n, known: map[ctVIP]ctKnown{}, localAddrs: interfaceAddrs}, nil
}

// interfaceAddrs lists the addresses of the daemon's network namespace (the
// node's: the daemon runs with hostNetwork).
func interfaceAddrs() ([]netip.Addr, error) {
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		return nil, fmt.Errorf("list local addresses: %w", err)
	}
	out := make([]netip.Addr, 0, len(addrs))
	for _, a := range addrs {
		if pfx, ok := a.(*net.IPNet); ok {
			if la, ok := netip.AddrFromSlice(pfx.IP); ok {
				out = append(out, la.Unmap())
			}
		}
	}
	return out, nil
}

// ctVIP is one Service address:port of one protocol.
type ctVIP struct {
	Addr  netip.Addr
	Port  uint16
	Proto uint8
}

func (v ctVIP) String() string {
	return fmt.Sprintf("%s/%s", ctProtoName(v.Proto), netip.AddrPortFrom(v.Addr, v.Port))
}

// ctKnown is a remembered Service address.
type ctKnown struct {
	Service string
	// MissingSince is the first cycle that no longer saw the Service
	// (zero while it exists).
	MissingSince time.Time
}

// ctPort is what the index knows of one Service address.
type ctPort struct {
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

// ctIndex classifies conntrack entries against the cluster view.
type ctIndex struct {
	now   time.Time
	grace time.Duration
	// vips, nodePorts, local and live are shared with later cycles
	// (ctBaseCache): read only.
	vips map[ctVIP]*ctPort
	// gone are the remembered Service addresses no longer in the view.
	gone map[ctVIP]*ctPort
	// nodePorts are keyed by the unspecified address of their family;
	// they match entries to one of the node's own addresses (local).
	nodePorts map[ctVIP]*ctPort
	local     map[netip.Addr]bool
	// live are the endpoints serving any Service: flushing by reply source
	// would hit their entries of other Services too, so they are never
	// reported.
	live map[netip.AddrPort]bool

	stale       map[ctStaleKey]*ctStaleBackend
	inGrace     int
	sharedLive  int
	serviceFlow int
}

type ctStaleKey struct {
	Proto   uint8
	Backend netip.AddrPort
}

type ctStaleBackend struct {
	key      ctStaleKey
	entries  int
	services map[string]bool
	vips     map[ctVIP]bool
	reasons  map[string]bool
	oldest   time.Time // oldest change among the Services concerned
}

// ctMaxListed bounds the Services and addresses remembered per stale
// backend (memory).
const ctMaxListed = 32

func ctProtoName(p uint8) string {
	switch p {
	case conntrack.ProtoUDP:
		return "UDP"
	case conntrack.ProtoTCP:
		return "TCP"
	}
	return fmt.Sprint(p)
}

func ctProtoNum(s string) (uint8, bool) {
	switch s {
	case "UDP":
		return conntrack.ProtoUDP, true
	case "TCP":
		return conntrack.ProtoTCP, true
	}
	return 0, false
}

// buildCTIndex indexes the Service addresses kube-proxy programs
// (dataplane.Desire: ClusterIPs, external IPs, load-balancer IPs, and the
// NodePorts on the node's own addresses local) and the remembered deleted
// ones, with the endpoints serving each.
func buildCTIndex(v cluster.View, nodeName string, fams []dataplane.Family, known map[ctVIP]ctKnown, local []netip.Addr, now time.Time, grace time.Duration) *ctIndex {
	return indexFrom(buildCTBase(v, nodeName, fams, local), known, now, grace)
}

// ctBase is the part of the index derived from the cluster view and the
// node's addresses alone: kept while neither changed (ctBaseCache), read
// only once built.
type ctBase struct {
	vips      map[ctVIP]*ctPort
	nodePorts map[ctVIP]*ctPort
	local     map[netip.Addr]bool
	live      map[netip.AddrPort]bool
}

// indexFrom is the index of one cycle: the shared base plus the Service
// addresses remembered from earlier cycles that the view no longer has
// (gone).
func indexFrom(b *ctBase, known map[ctVIP]ctKnown, now time.Time, grace time.Duration) *ctIndex {
	ix := &ctIndex{now: now, grace: grace, vips: b.vips, nodePorts: b.nodePorts, local: b.local, live: b.live,
		stale: map[ctStaleKey]*ctStaleBackend{}}
	for vip, k := range known {
		if _, ok := ix.vips[vip]; ok || k.MissingSince.IsZero() {
			continue
		}
		if ix.gone == nil {
			ix.gone = map[ctVIP]*ctPort{}
		}
		ix.gone[vip] = &ctPort{service: k.Service, kind: dataplane.ClusterIP, changed: k.MissingSince, deleted: true, backends: map[netip.AddrPort]bool{}}
	}
	return ix
}

// buildCTBase reads the view once: each Service's endpoints are merged
// once (View.Endpoints builds them) and shared by the live set and the
// per-port serving sets; the desired state is dataplane.DesireCached,
// shared with DataplaneDrift's comparison of the same view generation.
func buildCTBase(v cluster.View, nodeName string, fams []dataplane.Family, local []netip.Addr) *ctBase {
	b := &ctBase{vips: map[ctVIP]*ctPort{}, nodePorts: map[ctVIP]*ctPort{}, local: map[netip.Addr]bool{}, live: map[netip.AddrPort]bool{}}
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
			proto, ok := ctProtoNum(dp.Protocol)
			if !ok {
				continue
			}
			changed := dp.Changed
			if dp.Created.After(changed) {
				changed = dp.Created
			}
			backends := ctServing(eps[[2]string{name.Namespace, name.Name}], name, dp.Protocol, f)
			for _, e := range dp.Entries {
				for _, be := range e.Backends { // what kube-proxy forwards to
					backends[be] = true
				}
				sp := &ctPort{service: name.String(), kind: e.Kind, changed: changed, backends: backends}
				if e.Kind == dataplane.NodePort || !e.Key.Addr.IsValid() {
					// Keyed by port and protocol; the family is the
					// address's (an IPv4 node address and an IPv6 one).
					fam := netip.IPv4Unspecified()
					if f == dataplane.IPv6 {
						fam = netip.IPv6Unspecified()
					}
					b.nodePorts[ctVIP{fam, e.Key.Port, proto}] = sp
					continue
				}
				b.vips[ctVIP{e.Key.Addr.Unmap(), e.Key.Port, proto}] = sp
			}
		}
	}
	return b
}

// ctBaseKey is what a kept ctBase was built from: the view and its
// generation, the node, the families and the node's addresses.
type ctBaseKey struct {
	view  cluster.View
	gen   uint64
	node  string
	fams  string
	local string
}

// ctBaseCache keeps the last base. A view that does not count its
// generations (cluster.Generational) is read every cycle.
type ctBaseCache struct {
	key  ctBaseKey
	base *ctBase
	// builds counts the bases built (not reused), for tests.
	builds int
}

func (c *ctBaseCache) get(v cluster.View, nodeName string, fams []dataplane.Family, local []netip.Addr) *ctBase {
	g, ok := v.(cluster.Generational)
	if !ok {
		c.builds++
		return buildCTBase(v, nodeName, fams, local)
	}
	var fs, ls strings.Builder
	for _, f := range fams {
		fs.WriteString(string(f) + ",")
	}
	for _, a := range local {
		ls.WriteString(a.String() + ",")
	}
	k := ctBaseKey{view: v, gen: g.Generation(), node: nodeName, fams: fs.String(), local: ls.String()}
	if c.base != nil && c.key == k {
		return c.base
	}
	c.builds++
	c.key, c.base = k, buildCTBase(v, nodeName, fams, local)
	return c.base
}

// ctServing returns the endpoints of one Service port that serve: ready,
// or serving while terminating (kube-proxy's fallback), of the family.
func ctServing(eps []cluster.Endpoint, name dataplane.PortName, proto string, f dataplane.Family) map[netip.AddrPort]bool {
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

// observe classifies one entry. Hot path: no allocation unless the entry
// is stale.
func (ix *ctIndex) observe(fl *conntrack.Flow) {
	vip := ctVIP{fl.OrigDst.Addr().Unmap(), fl.OrigDst.Port(), fl.Proto}
	sp := ix.vips[vip]
	if sp == nil {
		sp = ix.gone[vip]
	}
	if sp == nil && ix.local[vip.Addr] {
		fam := netip.IPv4Unspecified()
		if vip.Addr.Is6() {
			fam = netip.IPv6Unspecified()
		}
		sp = ix.nodePorts[ctVIP{fam, vip.Port, vip.Proto}]
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
	k := ctStaleKey{fl.Proto, reply}
	b := ix.stale[k]
	if b == nil {
		b = &ctStaleBackend{key: k, services: map[string]bool{}, vips: map[ctVIP]bool{}, reasons: map[string]bool{}, oldest: sp.changed}
		ix.stale[k] = b
	}
	b.entries++
	if len(b.services) < ctMaxListed {
		b.services[sp.service] = true
	}
	if len(b.vips) < ctMaxListed {
		b.vips[vip] = true
	}
	b.reasons[reason] = true
	if sp.changed.Before(b.oldest) {
		b.oldest = sp.changed
	}
}

// ctScanNote describes one scan for the evidence.
type ctScanNote struct {
	Family    string `json:"family"`
	Protocol  string `json:"protocol"`
	Scanned   int    `json:"scanned"`
	Truncated bool   `json:"truncated,omitempty"`
	Filtered  bool   `json:"kernelFiltered"`
}

// findings turns the stale backends into findings, most entries first.
func (ix *ctIndex) findings(minEntries, maxFindings int, scans []ctScanNote) []finding.Finding {
	list := make([]*ctStaleBackend, 0, len(ix.stale))
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
	var out []finding.Finding
	for _, b := range list {
		if len(out) >= maxFindings {
			break
		}
		proto := ctProtoName(b.key.Proto)
		vips := make([]string, 0, len(b.vips))
		for v := range b.vips {
			vips = append(vips, v.String())
		}
		sort.Strings(vips)
		services := ipvsSortedKeys(b.services)
		reasons := ipvsSortedKeys(b.reasons)
		ev := map[string]any{
			"entries":         b.entries,
			"services":        services,
			"serviceAddrs":    vips,
			"reasons":         reasons,
			"changedAgo":      ix.now.Sub(b.oldest).Round(time.Second).String(),
			"grace":           ix.grace.String(),
			"scans":           scans,
			"reportOnlyProto": b.key.Proto != conntrack.ProtoUDP,
			// Cycle totals: entries to Service addresses, stale ones held
			// back by the grace, and ones whose backend serves another
			// Service (never named).
			"cycleServiceEntries":     ix.serviceFlow,
			"cycleWithinGrace":        ix.inGrace,
			"cycleBackendServesOther": ix.sharedLive,
		}
		ref := conntrack.BackendRef{Protocol: proto, Backend: conntrack.Backend{IP: b.key.Backend.Addr(), Port: b.key.Backend.Port()}}
		ref.PutEvidence(ev)
		sev := finding.Critical
		hint := "; FlushConntrack deletes them"
		if b.key.Proto != conntrack.ProtoUDP {
			sev, hint = finding.Warning, "; TCP: report only (FlushConntrack deletes UDP entries only)"
		}
		out = append(out, finding.Finding{
			Detector: ConntrackStaleServiceEntriesName,
			Target:   ref.Target(),
			Severity: sev,
			Message: fmt.Sprintf("%d %s conntrack entries to %s still answer from %s (%s), changed %s ago (grace %s)%s",
				b.entries, proto, strings.Join(services, ", "), b.key.Backend, strings.Join(reasons, "; "),
				ix.now.Sub(b.oldest).Round(time.Second), ix.grace, hint),
			Evidence: ev,
			Subject:  finding.Subject{Conntrack: &finding.Conntrack{Entries: b.entries}},
		})
	}
	return out
}

// remember updates the remembered Service addresses from the view (pure:
// returns the new map). A Service address no longer in the view is kept
// with the first time it was missed; at most max are kept, the ones
// missing longest dropped first.
func rememberCTVIPs(known map[ctVIP]ctKnown, ix *ctIndex, now time.Time, max int) map[ctVIP]ctKnown {
	out := make(map[ctVIP]ctKnown, len(known))
	for vip, sp := range ix.vips {
		if !sp.deleted {
			out[vip] = ctKnown{Service: sp.service}
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
			vip ctVIP
			k   ctKnown
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

// Detect scans the conntrack table once per family and protocol (streamed,
// kernel-filtered by protocol) and reports, per backend, the entries whose
// original destination is a Service address and whose reply source no
// longer serves it. Entries of deleted Services are recognised from the
// Service addresses remembered over earlier cycles (not in --once).
func (d *conntrackStale) Detect(ctx context.Context) ([]finding.Finding, error) {
	n := d.n
	if n.Conntrack == nil {
		return nil, finding.Skip("%s", n.Why("conntrack"))
	}
	sc, ok := n.Conntrack.(conntrack.Scanner)
	if !ok {
		return nil, finding.Skip("the conntrack adapter cannot stream the table")
	}
	if err := clusterViewGate(n, "no serving endpoints to compare with"); err != nil {
		return nil, err
	}
	fams := make([]dataplane.Family, 0, len(d.p.Families))
	for _, f := range d.p.Families {
		fams = append(fams, dataplane.Family(f))
	}
	now := n.Clock.Now()
	d.mu.Lock()
	defer d.mu.Unlock()
	// Without the node's addresses NodePort entries are not matched (the
	// Service addresses still are).
	local, _ := d.localAddrs()
	ix := indexFrom(d.base.get(n.Cluster, n.Name, fams, local), d.known, now, d.p.Grace.Duration)
	protos := []uint8{conntrack.ProtoUDP}
	if d.p.IncludeTCP {
		protos = append(protos, conntrack.ProtoTCP)
	}
	var scans []ctScanNote
	for _, f := range fams {
		for _, proto := range protos {
			res, err := sc.ScanProtocol(ctx, f == dataplane.IPv6, proto, d.p.MaxScan, func(fl *conntrack.Flow) error {
				ix.observe(fl)
				return nil
			})
			if err != nil {
				return nil, fmt.Errorf("scan the conntrack table (%s %s): %w", f, ctProtoName(proto), err)
			}
			scans = append(scans, ctScanNote{Family: string(f), Protocol: ctProtoName(proto), Scanned: res.Scanned, Truncated: res.Truncated, Filtered: res.KernelFiltered})
		}
	}
	d.known = rememberCTVIPs(d.known, ix, now, d.p.MaxRemembered)
	out := ix.findings(d.p.MinEntries, d.p.MaxFindings, scans)
	d.reconciler(ctx, out)
	return out, nil
}

// reconciler reads kube-proxy's own conntrack reconciler (1.32+: after its
// syncs it deletes the UDP entries of endpoints gone,
// kubeproxy_conntrack_reconciler_sync_duration_seconds counting its runs,
// kubeproxy_conntrack_reconciler_deleted_entries_total its deletions),
// puts it in each finding's evidence, and says in the message when it has
// run since the last cycle (or, first cycle and --once, at all) and still
// left the entries: then the entries are kube-proxy's regression to
// report, not only a race it lost. Every cycle it records the run counts
// (one cached scrape); a kube-proxy that cannot be read costs half the
// time left at most and only leaves the evidence saying so.
func (d *conntrackStale) reconciler(ctx context.Context, out []finding.Finding) {
	if d.n.KubeProxy == nil {
		for i := range out {
			out[i].Evidence["kubeProxyConntrackReconciler"] = "not read: " + d.n.Why(subsystemKubeProxy)
		}
		return
	}
	hctx, cancel := halfOfDeadline(ctx)
	defer cancel()
	sc, err := d.n.KubeProxy.Metrics(hctx)
	if err != nil {
		for i := range out {
			out[i].Evidence["kubeProxyConntrackReconciler"] = fmt.Sprintf("not read: %v", err)
		}
		return
	}
	prev := d.reconRuns
	d.reconRuns = map[kubeproxy.Family]uint64{}
	for f, fm := range sc.Metrics.Families {
		if h := fm.ConntrackReconcilerSyncs; h != nil {
			d.reconRuns[f] = h.Count
		}
	}
	for i := range out {
		ref, err := conntrack.DecodeBackendRef(out[i].Evidence)
		if err != nil {
			continue
		}
		fam := kubeproxy.Family("IPv4")
		if ref.Backend.IP.Is6() && !ref.Backend.IP.Is4In6() {
			fam = "IPv6"
		}
		fm := sc.Metrics.Families[fam]
		if fm == nil || fm.ConntrackReconcilerSyncs == nil {
			if u := sc.Metrics.Families[kubeproxy.Unlabelled]; u != nil && u.ConntrackReconcilerSyncs != nil {
				fm, fam = u, kubeproxy.Unlabelled
			}
		}
		if fm == nil || fm.ConntrackReconcilerSyncs == nil {
			out[i].Evidence["kubeProxyConntrackReconciler"] = "not exported (kube-proxy before 1.32 has no conntrack reconciler, or it has not run for " + string(fam) + ")"
			continue
		}
		runs := fm.ConntrackReconcilerSyncs.Count
		ev := map[string]any{"ipFamily": string(fam), "runs": runs, "runSecondsTotal": fm.ConntrackReconcilerSyncs.Sum}
		if fm.ConntrackReconcilerDeleted != nil {
			ev["deletedEntries"] = *fm.ConntrackReconcilerDeleted
		}
		since, known := uint64(0), false
		if p, ok := prev[fam]; ok && runs >= p {
			since, known = runs-p, true
			ev["runsSinceLastCycle"] = since
		}
		out[i].Evidence["kubeProxyConntrackReconciler"] = ev
		switch {
		case known && since > 0:
			out[i].Message += fmt.Sprintf("; kube-proxy's own conntrack reconciler ran %d times since the last cycle and left them (a kube-proxy bug to report)", since)
		case !known && runs > 0:
			out[i].Message += fmt.Sprintf("; kube-proxy's own conntrack reconciler has run (%d runs since kube-proxy started) and these entries remain past the grace (a kube-proxy bug to report)", runs)
		}
	}
}
