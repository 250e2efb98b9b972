package detect

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"strings"
	"sync"
	"time"

	"github.com/remediate-dev/remediate/internal/conntrack"
	"github.com/remediate-dev/remediate/internal/conntrack/stale"
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
	known map[stale.VIP]stale.Known
	// localAddrs lists the node's addresses (NodePort destinations).
	localAddrs func() ([]netip.Addr, error)
	// reconRuns are the run counts of kube-proxy's own conntrack
	// reconciler per IP family at the previous cycle (nil before one).
	reconRuns map[kubeproxy.Family]uint64
	// base is the index's part derived from the view, kept per view
	// generation: on a quiet cluster no cycle reads the view.
	base stale.BaseCache
}

func newConntrackStaleServiceEntries(p *ConntrackStaleServiceEntriesParams, n *node.Node) (Detector, error) {
	return &conntrackStale{p: *p, n: n, known: map[stale.VIP]stale.Known{}, localAddrs: interfaceAddrs}, nil
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

// ctScanNote describes one scan for the evidence.
type ctScanNote struct {
	Family    string `json:"family"`
	Protocol  string `json:"protocol"`
	Scanned   int    `json:"scanned"`
	Truncated bool   `json:"truncated,omitempty"`
	Filtered  bool   `json:"kernelFiltered"`
}

// ctFindings turns the index's stale backends into findings, most entries
// first.
func ctFindings(ix *stale.Index, now time.Time, grace time.Duration, minEntries, maxFindings int, scans []ctScanNote) []finding.Finding {
	counts := ix.Counts()
	var out []finding.Finding
	for _, b := range ix.Backends(minEntries) {
		if len(out) >= maxFindings {
			break
		}
		proto := stale.ProtoName(b.Proto())
		vips := b.ServiceAddrs()
		services := b.ServiceNames()
		reasons := b.Reasons()
		ev := map[string]any{
			"entries":         b.Entries(),
			"services":        services,
			"serviceAddrs":    vips,
			"reasons":         reasons,
			"changedAgo":      now.Sub(b.Oldest()).Round(time.Second).String(),
			"grace":           grace.String(),
			"scans":           scans,
			"reportOnlyProto": b.Proto() != conntrack.ProtoUDP,
			// Cycle totals: entries to Service addresses, stale ones held
			// back by the grace, and ones whose backend serves another
			// Service (never named).
			"cycleServiceEntries":     counts.ServiceEntries,
			"cycleWithinGrace":        counts.WithinGrace,
			"cycleBackendServesOther": counts.BackendServesOther,
		}
		ref := conntrack.BackendRef{Protocol: proto, Backend: conntrack.Backend{IP: b.Addr().Addr(), Port: b.Addr().Port()}}
		ref.PutEvidence(ev)
		sev := finding.Critical
		hint := "; FlushConntrack deletes them"
		if b.Proto() != conntrack.ProtoUDP {
			sev, hint = finding.Warning, "; TCP: report only (FlushConntrack deletes UDP entries only)"
		}
		out = append(out, finding.Finding{
			Detector: ConntrackStaleServiceEntriesName,
			Target:   ref.Target(),
			Severity: sev,
			Message: fmt.Sprintf("%d %s conntrack entries to %s still answer from %s (%s), changed %s ago (grace %s)%s",
				b.Entries(), proto, strings.Join(services, ", "), b.Addr(), strings.Join(reasons, "; "),
				now.Sub(b.Oldest()).Round(time.Second), grace, hint),
			Evidence: ev,
			Subject:  finding.Subject{Conntrack: &finding.Conntrack{Entries: b.Entries()}, Refs: []finding.Ref{ref}},
		})
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
	ix := stale.NewIndex(d.base.Get(n.Cluster, n.Name, fams, local), d.known, now, d.p.Grace.Duration)
	protos := []uint8{conntrack.ProtoUDP}
	if d.p.IncludeTCP {
		protos = append(protos, conntrack.ProtoTCP)
	}
	var scans []ctScanNote
	for _, f := range fams {
		for _, proto := range protos {
			res, err := sc.ScanProtocol(ctx, f == dataplane.IPv6, proto, d.p.MaxScan, func(fl *conntrack.Flow) error {
				ix.Observe(fl)
				return nil
			})
			if err != nil {
				return nil, fmt.Errorf("scan the conntrack table (%s %s): %w", f, stale.ProtoName(proto), err)
			}
			scans = append(scans, ctScanNote{Family: string(f), Protocol: stale.ProtoName(proto), Scanned: res.Scanned, Truncated: res.Truncated, Filtered: res.KernelFiltered})
		}
	}
	d.known = stale.Remember(d.known, ix, now, d.p.MaxRemembered)
	out := ctFindings(ix, now, d.p.Grace.Duration, d.p.MinEntries, d.p.MaxFindings, scans)
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
		ref, ok := finding.RefOf[conntrack.BackendRef](out[i].Subject)
		if !ok {
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
