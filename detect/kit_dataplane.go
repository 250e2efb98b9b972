package detect

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/remediate-dev/remediate/internal/dataplane"
	"github.com/remediate-dev/remediate/internal/finding"
	"github.com/remediate-dev/remediate/internal/iptables"
	"github.com/remediate-dev/remediate/internal/kubeproxy"
	"github.com/remediate-dev/remediate/internal/nftables"
	"github.com/remediate-dev/remediate/internal/node"
	"github.com/remediate-dev/remediate/policy"
)

// The per-cycle dataplane observation: what kube-proxy programmed (its
// iptables rules, its nftables table or the IPVS table) compared with what
// the cluster view says it should program (internal/dataplane), made once
// per cycle and parameters for DataplaneDrift, KubeProxyNotHearingAPI and
// KubeProxyFrozen.

// DataplaneDriftParams configure DataplaneDrift and KubeProxyNotHearingAPI,
// which share one comparison per cycle.
type DataplaneDriftParams struct {
	// Families to compare: IPv4, IPv6. A family kube-proxy has not
	// programmed (no nat KUBE-SERVICES chain) is skipped.
	Families []string `yaml:"families"`
	// ProxyMode: auto (ask kube-proxy's /proxyMode; when it does not
	// answer, read it from the node: KUBE-SVC chains, its nftables table,
	// kube-ipvs0), iptables, nftables or ipvs.
	ProxyMode string `yaml:"proxyMode"`
	// Backend is the iptables backend kube-proxy writes: auto (the one
	// holding nat KUBE-SERVICES rules; the one with more KUBE-* rules if
	// both do), legacy or nft.
	Backend string `yaml:"backend"`
	// GraceSyncPeriods: a difference is reported only once the newest
	// change of the Service and its EndpointSlices (their own API
	// timestamps) is older than this many kube-proxy syncPeriods (the one
	// kube-proxy's /configz reports, else the policy's). Default 3.
	GraceSyncPeriods float64 `yaml:"graceSyncPeriods"`
	// MaxPortsPerFinding bounds the Service ports named in one
	// KubeProxyNotHearingAPI finding's evidence (default 10).
	MaxPortsPerFinding int `yaml:"maxPortsPerFinding"`
	// SaveTimeout bounds each iptables save (shared with IPTablesRules
	// when both run in the same cycle).
	SaveTimeout policy.Duration `yaml:"saveTimeout"`
}

// Validate implements policy.Validator.
func (p *DataplaneDriftParams) Validate() []policy.FieldError {
	errs := validateFamilies(p.Families)
	errs = append(errs, validateOneOf("proxyMode", p.ProxyMode, "auto", "iptables", "nftables", "ipvs")...)
	errs = append(errs, validateOneOf("backend", p.Backend, "auto", "legacy", "nft")...)
	if p.GraceSyncPeriods < 1 || p.GraceSyncPeriods > 100 {
		errs = append(errs, policy.FieldError{Field: "graceSyncPeriods", Msg: "must be between 1 and 100 (times syncPeriod)"})
	}
	if p.MaxPortsPerFinding < 1 {
		errs = append(errs, policy.FieldError{Field: "maxPortsPerFinding", Msg: "must be >= 1"})
	}
	return append(errs, validateSaveTimeout(p.SaveTimeout)...)
}

// SetDefaults sets the defaults of DataplaneDrift and
// KubeProxyNotHearingAPI (registry.Defaulter).
func (p *DataplaneDriftParams) SetDefaults() {
	*p = DataplaneDriftParams{Families: []string{"IPv4", "IPv6"}, ProxyMode: "auto", Backend: "auto",
		GraceSyncPeriods: 3, MaxPortsPerFinding: 10, SaveTimeout: policy.D(8 * time.Second)}
}

// driftObservation is one comparison of programmed and desired state.
type driftObservation struct {
	at   time.Time
	mode string
	// modeSource is where mode came from: "the policy", "kube-proxy
	// /proxyMode", or the node's marks ("node: table ip kube-proxy").
	modeSource string
	// kubeProxyErr is why kube-proxy's /proxyMode did not answer (nil when
	// it did or was not asked): its metrics server is then not asked
	// again in this observation (/configz, /metrics).
	kubeProxyErr error
	syncPeriod   time.Duration
	// syncPeriodSource is "kube-proxy /configz" or "policy".
	syncPeriodSource string
	// configz is the period kube-proxy reported, when it differs from the
	// policy's (0 otherwise).
	policySyncPeriod, configzSyncPeriod time.Duration
	families                            []familyDrift
	notes                               []string
}

// done returns the observation, or a Skip when no family could be compared.
func (obs *driftObservation) done() (*driftObservation, error) {
	if len(obs.families) == 0 {
		return nil, finding.Skip("no family to compare: %s", strings.Join(obs.notes, "; "))
	}
	return obs, nil
}

type familyDrift struct {
	family  dataplane.Family
	source  string
	diffs   []dataplane.Diff
	desired *dataplane.Desired
}

// sharedObservation lets DataplaneDrift and KubeProxyNotHearingAPI of one
// cycle share one comparison (one save, one pass over the view).
var sharedObservation = struct {
	sync.Mutex
	m map[observationKey]*observationSlot
}{m: map[observationKey]*observationSlot{}}

type observationKey struct {
	n      *node.Node
	params string
}

type observationSlot struct {
	mu  sync.Mutex
	obs *driftObservation
	err error
}

// observationMaxAge is how long a comparison is shared: well under any
// detection interval.
const observationMaxAge = time.Second

// observeDataplane returns the comparison of n's dataplane with the
// cluster view under p: the one the detectors of this cycle share
// (sharedObservation), made anew (observeNow) when it is older than
// observationMaxAge or failed.
func observeDataplane(ctx context.Context, n *node.Node, p DataplaneDriftParams) (*driftObservation, error) {
	k := observationKey{n, fmt.Sprintf("%v/%s/%s/%s", p.Families, p.ProxyMode, p.Backend, p.SaveTimeout)}
	sharedObservation.Lock()
	slot := sharedObservation.m[k]
	if slot == nil {
		if len(sharedObservation.m) > 64 { // reloads leave old nodes behind
			sharedObservation.m = map[observationKey]*observationSlot{}
		}
		slot = &observationSlot{}
		sharedObservation.m[k] = slot
	}
	sharedObservation.Unlock()
	slot.mu.Lock()
	defer slot.mu.Unlock()
	now := n.Clock.Now()
	if slot.obs != nil && slot.err == nil && now.Sub(slot.obs.at) >= 0 && now.Sub(slot.obs.at) < observationMaxAge {
		return slot.obs, nil
	}
	obs, err := observeNow(ctx, n, p)
	slot.obs, slot.err = obs, err
	return obs, err
}

func observeNow(ctx context.Context, n *node.Node, p DataplaneDriftParams) (*driftObservation, error) {
	if err := clusterViewGate(n, "no desired state to compare with"); err != nil {
		return nil, err
	}
	obs := &driftObservation{at: n.Clock.Now()}
	obs.mode, obs.modeSource = p.ProxyMode, "the policy"
	if obs.mode == "auto" {
		// kube-proxy's /proxyMode, asked with a bounded share of the
		// detector's time; a frozen kube-proxy's mode is read from the
		// node instead (its chains, table or kube-ipvs0), so the drift is
		// judged exactly when it matters most.
		ans, err := resolveKubeProxyMode(ctx, n, p.SaveTimeout.Duration)
		if err != nil {
			return nil, err
		}
		obs.mode, obs.modeSource, obs.kubeProxyErr = string(ans.mode), ans.source, ans.askErr
	}
	obs.syncPeriod, obs.syncPeriodSource = discoverSyncPeriod(ctx, n, obs)
	switch obs.mode {
	case "iptables":
	case "ipvs":
		return observeIPVS(ctx, n, p, obs)
	case "nftables":
		return observeNFTables(ctx, n, p, obs)
	default:
		return nil, finding.Skip("kube-proxy runs in %q mode", obs.mode)
	}
	if n.IPTables == nil {
		return nil, finding.Skip("%s", n.Why("iptables"))
	}
	for _, fs := range p.Families {
		fam := iptables.Family(fs)
		snap, err := saveForDrift(ctx, n, fam, p)
		if err != nil {
			if reason, ok := finding.IsSkip(err); ok {
				obs.notes = append(obs.notes, fs+": "+reason)
				continue
			}
			return nil, err
		}
		if snap.Rules.Table("nat").Chain("KUBE-SERVICES") == nil {
			obs.notes = append(obs.notes, fmt.Sprintf("%s: no nat KUBE-SERVICES chain in %s: kube-proxy does not program this family", fs, iptables.SaveCommand(fam, snap.Backend)))
			continue
		}
		// Cached: an unchanged save (the same *Ruleset) and an unchanged
		// view generation give the same states and diffs as last cycle.
		got := dataplane.FromIPTablesCached(snap.Rules, dataplane.Family(fs), "iptables-"+string(snap.Backend))
		want := dataplane.DesireCached(n.Cluster, dataplane.Family(fs), n.Name)
		obs.families = append(obs.families, familyDrift{family: dataplane.Family(fs), source: got.Source,
			diffs: dataplane.CompareCached(got, want, false), desired: want})
	}
	return obs.done()
}

// observeNFTables compares kube-proxy's nftables table of each family
// (listed read-only, shared with the nftables detectors of the cycle).
func observeNFTables(ctx context.Context, n *node.Node, p DataplaneDriftParams, obs *driftObservation) (*driftObservation, error) {
	if n.NFTables == nil {
		return nil, finding.Skip("%s", n.Why("nftables"))
	}
	for _, fs := range p.Families {
		fam := nftables.FamilyIP
		if fs == "IPv6" {
			fam = nftables.FamilyIP6
		}
		snap, err := n.NFTables.ListTable(ctx, fam, nftables.KubeProxyTableName)
		switch {
		case errors.Is(err, nftables.ErrNoTable):
			obs.notes = append(obs.notes, fmt.Sprintf("%s: no table %s %s: kube-proxy does not program this family", fs, fam, nftables.KubeProxyTableName))
			continue
		case errors.Is(err, nftables.ErrUnavailable):
			return nil, finding.Skip("%v", err)
		case nftBlind(err):
			return nil, blindSkip(&blindError{err: err})
		case err != nil:
			return nil, fmt.Errorf("listing kube-proxy's nftables table for the drift comparison: %w", err)
		}
		got := dataplane.FromNFTables(snap.Ruleset.Table(fam, nftables.KubeProxyTableName), dataplane.Family(fs))
		want := dataplane.DesireCached(n.Cluster, dataplane.Family(fs), n.Name)
		obs.families = append(obs.families, familyDrift{family: dataplane.Family(fs), source: got.Source,
			diffs: dataplane.Compare(got, want, false), desired: want})
	}
	return obs.done()
}

// observeIPVS compares the IPVS virtual and real servers with the desired
// state (one netlink dump of the services, one per virtual server for its
// destinations, each bounded by ctx).
func observeIPVS(ctx context.Context, n *node.Node, p DataplaneDriftParams, obs *driftObservation) (*driftObservation, error) {
	if n.IPVS == nil {
		return nil, finding.Skip("%s", n.Why("ipvs"))
	}
	vss, err := n.IPVS.VirtualServers(ctx)
	if err != nil {
		return nil, ipvsErr("listing IPVS virtual servers", err)
	}
	svcs := make([]dataplane.IPVSService, 0, len(vss))
	for _, vs := range vss {
		rss, err := n.IPVS.RealServers(ctx, vs)
		if err != nil {
			return nil, ipvsErr("listing IPVS real servers of "+vs.Key(), err)
		}
		svcs = append(svcs, dataplane.IPVSService{VS: vs, Reals: rss})
	}
	for _, fs := range p.Families {
		want := dataplane.DesireCached(n.Cluster, dataplane.Family(fs), n.Name)
		got := dataplane.FromIPVS(svcs, want)
		if len(got.Ports) == 0 && len(got.Unattributed) == 0 {
			obs.notes = append(obs.notes, fs+": no IPVS virtual server of this family")
			continue
		}
		obs.families = append(obs.families, familyDrift{family: dataplane.Family(fs), source: "ipvs",
			diffs: dataplane.Compare(got, want, true), desired: want})
	}
	return obs.done()
}

// discoverSyncPeriod returns kube-proxy's syncPeriod from /configz when it
// answers, else the policy's.
func discoverSyncPeriod(ctx context.Context, n *node.Node, obs *driftObservation) (time.Duration, string) {
	if n.KubeProxy == nil {
		return kubeproxy.DefaultSyncPeriod, "default"
	}
	obs.policySyncPeriod = n.KubeProxy.SyncPeriod()
	if cr, ok := n.KubeProxy.(kubeproxy.ConfigReader); ok {
		obs.policySyncPeriod = cr.ConfiguredSyncPeriod()
		if obs.kubeProxyErr != nil {
			// /configz is served next to /proxyMode, which just did not
			// answer: do not wait for it a second time.
			return obs.policySyncPeriod, "policy (kube-proxy did not answer /proxyMode)"
		}
		qctx, cancel := kubeProxyQueryCtx(ctx)
		cz, err := cr.Configz(qctx)
		cancel()
		if err == nil {
			obs.configzSyncPeriod = cz.SyncPeriod
			return cz.SyncPeriod, "kube-proxy /configz"
		}
	}
	return obs.policySyncPeriod, "policy"
}

// saveForDrift returns the save of the backend kube-proxy writes.
func saveForDrift(ctx context.Context, n *node.Node, fam iptables.Family, p DataplaneDriftParams) (*iptables.Snapshot, error) {
	backends := []iptables.Backend{iptables.Legacy, iptables.NFT}
	if p.Backend != "auto" {
		backends = []iptables.Backend{iptables.Backend(p.Backend)}
	}
	var best *iptables.Snapshot
	var unavailable []string
	for _, b := range backends {
		sctx, cancel := context.WithTimeout(ctx, p.SaveTimeout.Duration)
		snap, err := n.IPTables.Save(sctx, fam, b)
		cancel()
		switch {
		case errors.Is(err, iptables.ErrUnavailable):
			unavailable = append(unavailable, iptables.SaveCommand(fam, b))
			continue
		case err != nil:
			return nil, fmt.Errorf("saving %s rules for the drift comparison: %w", iptables.SaveCommand(fam, b), err)
		}
		if best == nil || kubeServiceRules(snap) > kubeServiceRules(best) {
			best = snap
		}
	}
	if best == nil {
		return nil, finding.Skip("no iptables save command available (%s)", strings.Join(unavailable, ", "))
	}
	return best, nil
}

func kubeServiceRules(s *iptables.Snapshot) int {
	if c := s.Rules.Table("nat").Chain("KUBE-SERVICES"); c != nil {
		return len(c.Rules) + 1
	}
	return 0
}

// portDrift is the differences of one Service port, old enough to report.
type portDrift struct {
	family dataplane.Family
	name   dataplane.PortName
	diffs  []dataplane.Diff
	port   *dataplane.DesiredPort // nil: not in the cluster view
	// changed is the newest API change of the Service and its slices, or
	// for a port not in the view, when this detector first saw it
	// programmed.
	changed time.Time
	source  string
}

// oldDrift groups an observation's differences by Service port and keeps
// those whose change is older than grace. Ports in the view are aged by
// their API objects' own timestamps (sound in --once); a programmed port
// absent from the view has no object left to date it and is aged by
// firstSeen (this detector's memory: never reported by --once).
func oldDrift(obs *driftObservation, grace time.Duration, now time.Time, firstSeen map[string]time.Time) []portDrift {
	var out []portDrift
	seen := map[string]bool{}
	for _, fd := range obs.families {
		by := map[dataplane.PortName][]dataplane.Diff{}
		var names []dataplane.PortName
		for _, d := range fd.diffs {
			if _, ok := by[d.Port]; !ok {
				names = append(names, d.Port)
			}
			by[d.Port] = append(by[d.Port], d)
		}
		for _, name := range names {
			pd := portDrift{family: fd.family, name: name, diffs: by[name], port: fd.desired.Ports[name], source: fd.source}
			if pd.port != nil {
				pd.changed = pd.port.Changed
			}
			if pd.changed.IsZero() && firstSeen != nil {
				key := string(fd.family) + "/" + name.String()
				seen[key] = true
				if _, ok := firstSeen[key]; !ok {
					firstSeen[key] = now
				}
				pd.changed = firstSeen[key]
			}
			if pd.changed.IsZero() || now.Sub(pd.changed) <= grace {
				continue
			}
			out = append(out, pd)
		}
	}
	for k := range firstSeen {
		if !seen[k] {
			delete(firstSeen, k)
		}
	}
	return out
}
