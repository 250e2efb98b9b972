package detect

import (
	"context"
	"errors"
	"fmt"
	"sort"
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

// validateFamilies checks a families parameter: IPv4 and/or IPv6.
func validateFamilies(fams []string) []policy.FieldError {
	var errs []policy.FieldError
	if len(fams) == 0 {
		errs = append(errs, policy.FieldError{Field: "families", Msg: "must list IPv4 and/or IPv6"})
	}
	for i, f := range fams {
		if f != "IPv4" && f != "IPv6" {
			errs = append(errs, policy.FieldError{Field: fmt.Sprintf("families[%d]", i), Msg: fmt.Sprintf("must be IPv4 or IPv6, not %q", f)})
		}
	}
	return errs
}

// Validate implements policy.Validator.
func (p *DataplaneDriftParams) Validate() []policy.FieldError {
	errs := validateFamilies(p.Families)
	switch p.ProxyMode {
	case "auto", "iptables", "nftables", "ipvs":
	default:
		errs = append(errs, policy.FieldError{Field: "proxyMode", Msg: fmt.Sprintf("must be auto, iptables, nftables or ipvs, not %q", p.ProxyMode)})
	}
	switch p.Backend {
	case "auto", "legacy", "nft":
	default:
		errs = append(errs, policy.FieldError{Field: "backend", Msg: fmt.Sprintf("must be auto, legacy or nft, not %q", p.Backend)})
	}
	if p.GraceSyncPeriods < 1 || p.GraceSyncPeriods > 100 {
		errs = append(errs, policy.FieldError{Field: "graceSyncPeriods", Msg: "must be between 1 and 100 (times syncPeriod)"})
	}
	if p.MaxPortsPerFinding < 1 {
		errs = append(errs, policy.FieldError{Field: "maxPortsPerFinding", Msg: "must be >= 1"})
	}
	if p.SaveTimeout.Duration <= 0 {
		errs = append(errs, policy.FieldError{Field: "saveTimeout", Msg: "must be > 0"})
	}
	return errs
}

// SetDefaults sets the defaults of DataplaneDrift and
// KubeProxyNotHearingAPI (registry.Defaulter).
func (p *DataplaneDriftParams) SetDefaults() {
	*p = DataplaneDriftParams{Families: []string{"IPv4", "IPv6"}, ProxyMode: "auto", Backend: "auto",
		GraceSyncPeriods: 3, MaxPortsPerFinding: 10, SaveTimeout: policy.D(8 * time.Second)}
}

func init() {
	Define("DataplaneDrift",
		"a Service port whose programmed entries or backends (iptables rules, kube-proxy's nftables table, IPVS virtual and real servers) differ from what kube-proxy should program from the cluster view, for longer than graceSyncPeriods x syncPeriod since the objects last changed",
		func(p *DataplaneDriftParams, n *node.Node) (Detector, error) {
			return &dataplaneDrift{p: *p, n: n, firstSeen: map[string]time.Time{}}, nil
		}, Targets(finding.KindDataplanePort, finding.KindKubeProxy), UsesClusterView())
	Define("KubeProxyNotHearingAPI",
		"drift older than the grace while kube-proxy has nothing queued: kube-proxy is not receiving API updates (a silently dead watch connection); evidence from its own metrics",
		func(p *DataplaneDriftParams, n *node.Node) (Detector, error) {
			return &kubeProxyDeaf{p: *p, n: n}, nil
		}, Targets(finding.KindKubeProxy), UsesClusterView())
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

func observe(ctx context.Context, n *node.Node, p DataplaneDriftParams) (*driftObservation, error) {
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

type dataplaneDrift struct {
	p DataplaneDriftParams
	n *node.Node

	mu        sync.Mutex
	firstSeen map[string]time.Time
}

func (d *dataplaneDrift) Detect(ctx context.Context) ([]finding.Finding, error) {
	obs, err := observe(ctx, d.n, d.p)
	if err != nil {
		return nil, err
	}
	var lastSync map[kubeproxy.Family]float64
	if d.n.KubeProxy != nil && obs.kubeProxyErr == nil {
		qctx, cancel := kubeProxyQueryCtx(ctx)
		sc, err := d.n.KubeProxy.Metrics(qctx)
		cancel()
		if err == nil {
			lastSync = map[kubeproxy.Family]float64{}
			for f, fm := range sc.Metrics.Families {
				if fm.LastSync != nil {
					lastSync[f] = *fm.LastSync
				}
			}
		}
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	return driftFindings(obs, d.p, d.n.Clock.Now(), d.firstSeen, lastSync), nil
}

// driftFindings is DataplaneDrift's decision: one finding per Service port
// whose differences are older than the grace, and a warning when
// kube-proxy's /configz syncPeriod differs from the policy's.
func driftFindings(obs *driftObservation, p DataplaneDriftParams, now time.Time, firstSeen map[string]time.Time, lastSync map[kubeproxy.Family]float64) []finding.Finding {
	grace := time.Duration(p.GraceSyncPeriods * float64(obs.syncPeriod))
	var out []finding.Finding
	for _, pd := range oldDrift(obs, grace, now, firstSeen) {
		sev := finding.Warning
		var parts []string
		for _, df := range pd.diffs {
			if df.Problem != dataplane.WrongVerdict || df.Want == dataplane.Forward {
				sev = finding.Critical
			}
			parts = append(parts, describeDiff(df))
		}
		ev := driftEvidence(pd, obs, grace, now)
		if ls, ok := lastSync[kubeproxy.Family(pd.family)]; ok {
			ev["kubeProxyLastSync"] = rfc3339(seconds(ls))
		} else if ls, ok := lastSync[kubeproxy.Unlabelled]; ok {
			ev["kubeProxyLastSync"] = rfc3339(seconds(ls))
		}
		msg := fmt.Sprintf("%s (%s) is not programmed as the cluster says, %s after its last change (grace %s): %s",
			pd.name, pd.family, now.Sub(pd.changed).Round(time.Second), grace, strings.Join(parts, "; "))
		if ls, ok := ev["kubeProxyLastSync"]; ok {
			msg += fmt.Sprintf("; kube-proxy last synced at %s", ls)
		}
		if obs.kubeProxyErr != nil {
			msg += fmt.Sprintf("; kube-proxy does not answer (see KubeProxyUnreachable): %s mode read from the %s", obs.mode, obs.modeSource)
		}
		out = append(out, finding.Finding{Detector: "DataplaneDrift", Target: "dataplane/" + string(pd.family) + "/" + pd.name.String(),
			Severity: sev, Message: msg, Evidence: ev})
	}
	if obs.configzSyncPeriod > 0 && obs.policySyncPeriod > 0 && obs.configzSyncPeriod != obs.policySyncPeriod {
		out = append(out, finding.Finding{Detector: "DataplaneDrift", Target: "kube-proxy/syncPeriod", Severity: finding.Warning,
			Message: fmt.Sprintf("kube-proxy's /configz says syncPeriod %s but the policy says %s: thresholds relative to syncPeriod use %s; fix kubeProxy.syncPeriod in the policy",
				obs.configzSyncPeriod, obs.policySyncPeriod, obs.configzSyncPeriod),
			Evidence: map[string]any{"configzSyncPeriod": obs.configzSyncPeriod.String(), "policySyncPeriod": obs.policySyncPeriod.String()}})
	}
	return out
}

func describeDiff(d dataplane.Diff) string {
	s := fmt.Sprintf("%s %s %s", d.Kind, d.Key, d.Problem)
	switch d.Problem {
	case dataplane.MissingEntry:
		s += fmt.Sprintf(" (want %s", d.Want)
		if len(d.Missing) > 0 {
			s += " to " + addrList(d.Missing, 5)
		}
		s += ")"
	case dataplane.MissingBackends:
		s += " " + addrList(d.Missing, 5)
		// A port can miss some backends and still forward to others
		// that no longer serve (a rollout kube-proxy did not follow,
		// the terminating fallback): name both.
		if len(d.Stale) > 0 {
			s += ", still forwarding to stale " + addrList(d.Stale, 5)
		}
	case dataplane.StaleBackends, dataplane.StaleEntry:
		s += " " + addrList(d.Stale, 5)
	case dataplane.WrongVerdict:
		s += fmt.Sprintf(" (want %s, programmed %s)", d.Want, d.Got)
	}
	return s
}

func addrList[T fmt.Stringer](as []T, max int) string {
	var ss []string
	for i, a := range as {
		if i == max {
			ss = append(ss, fmt.Sprintf("and %d more", len(as)-max))
			break
		}
		ss = append(ss, a.String())
	}
	return "[" + strings.Join(ss, " ") + "]"
}

func driftEvidence(pd portDrift, obs *driftObservation, grace time.Duration, now time.Time) map[string]any {
	var diffs []map[string]any
	for _, d := range pd.diffs {
		m := map[string]any{"kind": string(d.Kind), "entry": d.Key.String(), "problem": string(d.Problem), "want": string(d.Want), "programmed": string(d.Got)}
		if len(d.Missing) > 0 {
			m["missingBackends"] = strs(d.Missing)
		}
		if len(d.Stale) > 0 {
			m["staleBackends"] = strs(d.Stale)
		}
		diffs = append(diffs, m)
	}
	ev := map[string]any{
		"servicePort": pd.name.String(), "family": string(pd.family), "proxyMode": obs.mode, "proxyModeSource": obs.modeSource, "source": pd.source,
		"differences": diffs, "graceSeconds": grace.Seconds(), "syncPeriod": obs.syncPeriod.String(), "syncPeriodSource": obs.syncPeriodSource,
		"changeAgeSeconds": now.Sub(pd.changed).Round(time.Second).Seconds(),
	}
	if obs.kubeProxyErr != nil {
		ev["kubeProxyError"] = obs.kubeProxyErr.Error()
	}
	if pd.port != nil {
		ev["lastChange"] = rfc3339(pd.changed)
		ev["lastChangeSource"] = "API objects' managedFields/creationTimestamp"
		if !pd.port.Created.IsZero() {
			ev["serviceCreated"] = rfc3339(pd.port.Created)
			ev["serviceAgeSeconds"] = now.Sub(pd.port.Created).Round(time.Second).Seconds()
		}
		ev["endpointCount"] = pd.port.Endpoints
	} else {
		ev["firstSeenProgrammedWithoutService"] = rfc3339(pd.changed)
	}
	return ev
}

func strs[T fmt.Stringer](as []T) []string {
	out := make([]string, len(as))
	for i, a := range as {
		out[i] = a.String()
	}
	return out
}

type kubeProxyDeaf struct {
	p DataplaneDriftParams
	n *node.Node

	mu       sync.Mutex
	lastREST *restSample
}

type restSample struct {
	seq    uint64
	at     time.Time
	total  float64
	errors float64
}

func (d *kubeProxyDeaf) Detect(ctx context.Context) ([]finding.Finding, error) {
	kp, err := kubeProxyOf(d.n)
	if err != nil {
		return nil, err
	}
	obs, err := observe(ctx, d.n, d.p)
	if err != nil {
		return nil, err
	}
	if obs.kubeProxyErr != nil {
		// Deaf is judged from kube-proxy's own metrics (nothing queued);
		// one that does not answer at all is not deaf but frozen or gone:
		// DataplaneDrift names the drift, KubeProxyUnreachable and
		// KubeProxyFrozen the cause.
		return nil, finding.Skip("kube-proxy does not answer (see KubeProxyUnreachable, KubeProxyFrozen; DataplaneDrift names the drift): %v", obs.kubeProxyErr)
	}
	qctx, cancel := kubeProxyQueryCtx(ctx)
	defer cancel()
	sc, err := kubeProxyScrape(qctx, d.n, kp)
	if err != nil {
		return nil, err
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	prev := d.lastREST
	if sc.Metrics.RESTRequests != nil && (prev == nil || prev.seq != sc.Seq) {
		d.lastREST = &restSample{seq: sc.Seq, at: sc.At, total: sc.Metrics.RESTTotal(), errors: sc.Metrics.RESTErrors()}
	}
	return deafFindings(obs, d.p, sc.Metrics, prev, d.n.Clock.Now()), nil
}

// deafFindings is KubeProxyNotHearingAPI's decision: Service ports in the
// view whose differences are older than the grace while kube-proxy has
// nothing queued and no change pending. A kube-proxy that had heard of the
// change would have queued a sync (KubeProxySyncStale reports one that does
// not complete); with nothing queued it does not know.
func deafFindings(obs *driftObservation, p DataplaneDriftParams, m *kubeproxy.Metrics, prev *restSample, now time.Time) []finding.Finding {
	grace := time.Duration(p.GraceSyncPeriods * float64(obs.syncPeriod))
	var old []portDrift
	for _, pd := range oldDrift(obs, grace, now, nil) {
		if pd.port != nil { // dated by the API: kube-proxy should have heard
			old = append(old, pd)
		}
	}
	if len(old) == 0 {
		return nil
	}
	if pending := m.EndpointChangesPending; pending != nil && *pending > 0 {
		return nil
	}
	if pending := m.ServiceChangesPending; pending != nil && *pending > 0 {
		return nil
	}
	var families []string
	var lastSync, lastQueued float64
	for _, f := range m.FamilyNames() {
		fm := m.Families[f]
		if fm.LastSync == nil {
			return nil // cannot tell that kube-proxy syncs
		}
		if fm.LastQueued != nil && *fm.LastQueued > *fm.LastSync {
			return nil // work queued: KubeProxySyncStale's case
		}
		families = append(families, string(f))
		if *fm.LastSync > lastSync {
			lastSync = *fm.LastSync
		}
		if fm.LastQueued != nil && *fm.LastQueued > lastQueued {
			lastQueued = *fm.LastQueued
		}
	}
	if len(families) == 0 {
		return nil
	}
	sort.Slice(old, func(i, j int) bool { return old[i].changed.Before(old[j].changed) })
	var names []string
	var ports []map[string]any
	for i, pd := range old {
		if i == p.MaxPortsPerFinding {
			break
		}
		names = append(names, pd.name.String())
		var problems []string
		for _, d := range pd.diffs {
			problems = append(problems, describeDiff(d))
		}
		ports = append(ports, map[string]any{"servicePort": pd.name.String(), "family": string(pd.family), "lastChange": rfc3339(pd.changed),
			"changeAgeSeconds": now.Sub(pd.changed).Round(time.Second).Seconds(), "differences": problems})
	}
	ev := map[string]any{
		"driftedServicePorts": len(old), "servicePorts": ports, "graceSeconds": grace.Seconds(),
		"syncPeriod": obs.syncPeriod.String(), "syncPeriodSource": obs.syncPeriodSource, "proxyMode": obs.mode, "proxyModeSource": obs.modeSource,
		"kubeProxyLastSync": rfc3339(seconds(lastSync)), "kubeProxyFamilies": families,
		"lastQueuedBeforeOldestChange": lastQueued < float64(old[0].changed.Unix()),
	}
	if lastQueued > 0 {
		ev["kubeProxyLastQueued"] = rfc3339(seconds(lastQueued))
	}
	if m.RESTRequests != nil {
		byCode := map[string]float64{}
		for k, v := range m.RESTRequests {
			byCode[k] = v
		}
		ev["restClientRequestsByCode"] = byCode
		ev["restClientErrors"] = m.RESTErrors()
		if prev != nil {
			ev["restClientRequestsDelta"] = m.RESTTotal() - prev.total
			ev["restClientErrorsDelta"] = m.RESTErrors() - prev.errors
			ev["restClientDeltaSince"] = rfc3339(prev.at)
		}
	}
	more := ""
	if len(old) > len(names) {
		more = fmt.Sprintf(" and %d more", len(old)-len(names))
	}
	return []finding.Finding{{
		Detector: "KubeProxyNotHearingAPI",
		Target:   "kube-proxy/api-updates",
		Severity: finding.Critical,
		Message: fmt.Sprintf("kube-proxy is not receiving API updates: %s%s changed more than %s ago and is not programmed, while kube-proxy has nothing queued (last sync %s)",
			strings.Join(names, ", "), more, grace, rfc3339(seconds(lastSync))),
		Evidence: ev,
	}}
}
