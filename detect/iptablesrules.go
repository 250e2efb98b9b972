package detect

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/hashicorp/go-multierror"
	"go.uber.org/zap"

	"github.com/remediate-dev/remediate/internal/finding"
	"github.com/remediate-dev/remediate/internal/iptables"
	"github.com/remediate-dev/remediate/internal/kubeproxy"
	"github.com/remediate-dev/remediate/internal/node"
	"github.com/remediate-dev/remediate/policy"
)

// IPTablesRulesParams select the checks of IPTablesRules and their
// thresholds. One detector runs all checks from a single save per family
// and backend per cycle (one type rather than one per check, so a cycle
// never runs iptables-save more than once per backend).
type IPTablesRulesParams struct {
	// Families to check: IPv4, IPv6.
	Families []string `yaml:"families"`
	// Backends to check: legacy, nft. A backend whose save command is not
	// installed is skipped and listed in the evidence.
	Backends []string `yaml:"backends"`
	// ProxyMode is kube-proxy's mode. The KUBE-SERVICES jump check runs
	// only in iptables (and ipvs, which uses the same jumps) mode; nftables,
	// or "" (unknown), turns it off with the reason logged. "auto" asks
	// kube-proxy's /proxyMode each cycle (the kube-proxy adapter) and, when
	// kube-proxy cannot say, still checks (a KUBE-SERVICES chain means an
	// iptables-based proxy) with the reason in the evidence. Defaults to
	// iptables, kube-proxy's default on Linux.
	ProxyMode string `yaml:"proxyMode"`
	// CheckServicesJump reports nat KUBE-SERVICES not jumped to from nat
	// PREROUTING or OUTPUT.
	CheckServicesJump bool `yaml:"checkServicesJump"`
	// CheckFirewallDrop reports a -j DROP in filter KUBE-FIREWALL with no
	// mark match and no other condition (drops all traffic).
	CheckFirewallDrop bool `yaml:"checkFirewallDrop"`
	// CheckBackendMix reports KUBE-* rules present in both legacy and nft.
	CheckBackendMix bool `yaml:"checkBackendMix"`
	// CheckKubeProxyChains compares kube-proxy's other rules with what
	// kube-proxy v1.34 writes in iptables mode: the nat POSTROUTING jump to
	// KUBE-POSTROUTING (and the filter jumps), the KUBE-MARK-MASQ mark rule,
	// KUBE-POSTROUTING's RETURN, mark-clearing and MASQUERADE rules, and
	// every rule of kube-proxy's chains that lost the match conditions
	// kube-proxy gives it (version-skew corruption). One finding per
	// table, chain (per-Service chains grouped: KUBE-SEP-*) and check.
	// iptables mode only (IPVS mode's chains differ).
	CheckKubeProxyChains bool `yaml:"checkKubeProxyChains"`
	// MaxKubeRules reports more KUBE-* rules than this in one backend and
	// family (0 turns the check off).
	MaxKubeRules int `yaml:"maxKubeRules"`
	// MaxSaveDuration reports a save slower than this, a sign of lock
	// pressure: kube-proxy's restore of the same rules holds the lock
	// about as long (0 turns the check off). A save that times out is
	// always reported.
	MaxSaveDuration policy.Duration `yaml:"maxSaveDuration"`
	// SaveTimeout bounds each save run; a save that runs out of it is a
	// critical finding. Saves of all families and backends run at once
	// (they take no lock), so keep it under the policy's detectorTimeout.
	SaveTimeout policy.Duration `yaml:"saveTimeout"`
	// MaxSaveDutyCycle caps the share of time spent saving one backend: a
	// save that took D is repeated only after D/maxSaveDutyCycle, and the
	// cycles in between reuse its result. iptables-nft-save is slow on
	// large rule sets (about 50s for 100k nat rules on 2 vCPUs, against
	// under 1s for iptables-legacy-save). 0 saves every cycle.
	MaxSaveDutyCycle float64 `yaml:"maxSaveDutyCycle"`
}

// SetDefaults sets the defaults of IPTablesRules (registry.Defaulter).
func (p *IPTablesRulesParams) SetDefaults() {
	*p = IPTablesRulesParams{
		Families:             []string{"IPv4", "IPv6"},
		Backends:             []string{"legacy", "nft"},
		ProxyMode:            "iptables",
		CheckServicesJump:    true,
		CheckFirewallDrop:    true,
		CheckBackendMix:      true,
		CheckKubeProxyChains: true,
		MaxKubeRules:         10000,
		MaxSaveDuration:      policy.D(2 * time.Second),
		SaveTimeout:          policy.D(8 * time.Second),
		MaxSaveDutyCycle:     0.1,
	}
}

// Validate implements policy.Validator.
func (p *IPTablesRulesParams) Validate() []policy.FieldError {
	var errs []policy.FieldError
	errs = append(errs, validateFamilies(p.Families)...)
	errs = append(errs, validateBackends(p.Backends)...)
	errs = append(errs, validateProxyMode(p.ProxyMode)...)
	if p.MaxKubeRules < 0 {
		errs = append(errs, policy.FieldError{Field: "maxKubeRules", Msg: "must be >= 0 (0 = off)"})
	}
	if p.MaxSaveDuration.Duration < 0 {
		errs = append(errs, policy.FieldError{Field: "maxSaveDuration", Msg: "must be >= 0 (0 = off)"})
	}
	if p.MaxSaveDutyCycle < 0 || p.MaxSaveDutyCycle > 1 {
		errs = append(errs, policy.FieldError{Field: "maxSaveDutyCycle", Msg: "must be between 0 (off) and 1"})
	}
	errs = append(errs, validateSaveTimeout(p.SaveTimeout)...)
	if p.SaveTimeout.Duration > 0 && p.MaxSaveDuration.Duration >= p.SaveTimeout.Duration {
		errs = append(errs, policy.FieldError{Field: "maxSaveDuration", Msg: "must be below saveTimeout"})
	}
	return errs
}

func init() {
	Define("IPTablesRules",
		"kube-proxy iptables rule corruption from one *-save per backend: kube-proxy's chains absent while it says it programs iptables (a flushed firewall), missing KUBE-SERVICES and KUBE-POSTROUTING jumps, the masquerade mark and MASQUERADE rules, rules that lost their match conditions, bare DROP in KUBE-FIREWALL, KUBE-* in both legacy and nft, rule count, slow save",
		newIPTablesRules, Targets(finding.KindIPTablesRules))
}

type iptablesRules struct {
	p IPTablesRulesParams
	n *node.Node

	mu   sync.Mutex
	last map[string]*saveResult // family/backend -> last save
	judgement

	// absence is what chainsAbsent remembers per family across cycles.
	absence chainsAbsence

	// defects are kube-proxy's chain defects of the rule set last checked
	// per family/backend: a reused save (the same *Ruleset, never
	// modified after its parse) is not compared again.
	defectsMu sync.Mutex
	defects   map[string]cachedDefects
}

type cachedDefects struct {
	rs *iptables.Ruleset
	ds []iptables.Defect
}

// kubeProxyDefects is iptables.KubeProxyDefects of the snapshot's rules,
// computed once per rule set.
func (d *iptablesRules) kubeProxyDefects(s *iptables.Snapshot) []iptables.Defect {
	key := string(s.Family) + "/" + string(s.Backend)
	d.defectsMu.Lock()
	defer d.defectsMu.Unlock()
	if c, ok := d.defects[key]; ok && c.rs == s.Rules {
		return c.ds
	}
	ds := iptables.KubeProxyDefects(s.Rules, iptables.DefectOptions{
		// Those two are checkServicesJump's and checkFirewallDrop's
		// (which may be turned off on their own).
		SkipServicesJumps:    true,
		SkipBareFirewallDrop: true,
	})
	if d.defects == nil {
		d.defects = map[string]cachedDefects{}
	}
	d.defects[key] = cachedDefects{rs: s.Rules, ds: ds}
	return ds
}

func newIPTablesRules(p *IPTablesRulesParams, n *node.Node) (Detector, error) {
	return &iptablesRules{p: *p, n: n}, nil
}

// saveResult is one save run (or its failure) and when it started.
type saveResult struct {
	snap   *iptables.Snapshot
	err    error
	at     time.Time
	took   time.Duration
	cached bool
}

// reuse returns the last result of key when saving again now would exceed
// the duty cycle: a save that took D is repeated only after D/maxSaveDutyCycle.
func (d *iptablesRules) reuse(key string, now time.Time) *saveResult {
	d.mu.Lock()
	defer d.mu.Unlock()
	l := d.last[key]
	if l == nil || d.p.MaxSaveDutyCycle <= 0 {
		return nil
	}
	if now.Sub(l.at) < time.Duration(float64(l.took)/d.p.MaxSaveDutyCycle) {
		c := *l
		c.cached = true
		return &c
	}
	return nil
}

func (d *iptablesRules) remember(key string, r *saveResult) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.last == nil {
		d.last = map[string]*saveResult{}
	}
	d.last[key] = r
}

func (d *iptablesRules) Detect(ctx context.Context) ([]finding.Finding, error) {
	if d.n.IPTables == nil {
		return nil, finding.Skip("%s", d.n.Why("iptables"))
	}
	mode := resolveProxyMode(ctx, d.n, d.p.ProxyMode)
	if mode.mode == string(kubeproxy.ModeNFTables) {
		return nil, finding.Skip("kube-proxy runs in nftables mode (%s): its Service rules are nftables, checked by KubeProxyNFTablesIntegrity; KUBE-* iptables rules left over are reported by KubeProxyModeLeftovers", mode.note)
	}
	var (
		out         []finding.Finding
		errs        *multierror.Error
		unavailable []string
		saved       int
	)
	// All saves at once: they take no lock, and the cycle waits for the
	// slowest instead of the sum. A backend whose last save was slow is
	// not saved again before its duty cycle allows; its last result is
	// reused (evidence "cached").
	results := make(map[string]*saveResult)
	var wg sync.WaitGroup
	now := d.n.Clock.Now()
	for _, fs := range d.p.Families {
		for _, bs := range d.p.Backends {
			key := fs + "/" + bs
			if r := d.reuse(key, now); r != nil {
				results[key] = r
				continue
			}
			r := &saveResult{at: now}
			results[key] = r
			wg.Add(1)
			go func(fam iptables.Family, be iptables.Backend) {
				defer wg.Done()
				sctx, cancel := context.WithTimeout(ctx, d.p.SaveTimeout.Duration)
				defer cancel()
				start := time.Now()
				r.snap, r.err = d.n.IPTables.Save(sctx, fam, be)
				r.took = time.Since(start)
				if r.snap != nil && r.snap.Duration > r.took {
					r.took = r.snap.Duration
				}
			}(iptables.Family(fs), iptables.Backend(bs))
		}
	}
	wg.Wait()
	for key, r := range results {
		if !r.cached && (r.err == nil || errors.Is(r.err, context.DeadlineExceeded) && ctx.Err() == nil) {
			d.remember(key, r)
		}
	}
	for _, fs := range d.p.Families {
		fam := iptables.Family(fs)
		snaps := map[iptables.Backend]*iptables.Snapshot{}
		complete := true // every backend saved or not installed
		for _, bs := range d.p.Backends {
			be := iptables.Backend(bs)
			res := results[fs+"/"+bs]
			snap, err := res.snap, res.err
			switch {
			case errors.Is(err, iptables.ErrUnavailable):
				unavailable = append(unavailable, iptables.SaveCommand(fam, be))
				continue
			case errors.Is(err, context.DeadlineExceeded) && ctx.Err() == nil:
				// The save's own timeout, not the cycle's: that is a finding.
				complete = false
				out = append(out, finding.Finding{
					Detector: "IPTablesRules",
					Target:   iptablesTarget(fam, be, "save-duration"),
					Severity: finding.Critical,
					Message:  fmt.Sprintf("%s did not finish within %s: %v", iptables.SaveCommand(fam, be), d.p.SaveTimeout.Duration, err),
					Evidence: map[string]any{"family": fs, "backend": bs, "error": err.Error(), "saveTimeoutMs": d.p.SaveTimeout.Milliseconds(),
						"savedAt": res.at.UTC().Format(time.RFC3339), "cached": res.cached},
				})
				continue
			case err != nil:
				complete = false
				errs = multierror.Append(errs, err)
				continue
			}
			saved++
			snaps[be] = snap
			for _, f := range d.checkSnapshot(snap, mode) {
				f.Evidence["savedAt"] = res.at.UTC().Format(time.RFC3339)
				f.Evidence["cached"] = res.cached
				out = append(out, f)
			}
		}
		if f := d.chainsAbsent(ctx, fam, snaps, complete, mode, now); f != nil {
			out = append(out, *f)
		}
		if d.p.CheckBackendMix {
			mix := mixFinding(fam, snaps)
			if len(mix) > 0 {
				d.mixVersions(ctx, &mix[0])
			}
			out = append(out, mix...)
		}
	}
	if err := errs.ErrorOrNil(); err != nil {
		return nil, fmt.Errorf("saving iptables rules: %w", err)
	}
	if saved == 0 && len(out) == 0 {
		return nil, finding.Skip("no iptables save command available (%s)", strings.Join(unavailable, ", "))
	}
	for i := range out {
		if len(unavailable) > 0 {
			out[i].Evidence["unavailableBackends"] = unavailable
		}
	}
	d.set("%d rule sets saved and checked%s", saved, notInstalled(unavailable))
	return out, nil
}

func (d *iptablesRules) checkSnapshot(s *iptables.Snapshot, mode proxyMode) []finding.Finding {
	var out []finding.Finding
	base := func() map[string]any {
		return map[string]any{
			"family":        string(s.Family),
			"backend":       string(s.Backend),
			"saveCommand":   iptables.SaveCommand(s.Family, s.Backend),
			"saveMs":        s.Duration.Milliseconds(),
			"kubeRuleCount": s.Rules.KubeRuleCount(),
			// decoded: no save ran; saveMs is the entry read and decode.
			"decoded": s.Decoded,
		}
	}
	where := fmt.Sprintf("(%s, %s)", s.Family, s.Backend)
	nat := s.Rules.Table("nat")

	if d.p.CheckServicesJump {
		if mode.check {
			if nat.Chain("KUBE-SERVICES") != nil {
				for _, c := range []string{"PREROUTING", "OUTPUT"} {
					if nat.Chain(c).JumpsTo("KUBE-SERVICES") {
						continue
					}
					ev := base()
					ev["table"], ev["chain"], ev["missingJump"] = "nat", c, "KUBE-SERVICES"
					ev["proxyMode"], ev["proxyModeSource"] = mode.mode, mode.note
					out = append(out, finding.Finding{
						Detector: "IPTablesRules",
						Target:   iptablesTarget(s.Family, s.Backend, "nat/"+c+"/KUBE-SERVICES"),
						Severity: finding.Critical,
						Message:  fmt.Sprintf("nat %s does not jump to KUBE-SERVICES %s: service traffic %s is not load-balanced", c, where, map[string]string{"PREROUTING": "arriving at the node", "OUTPUT": "from host-network processes"}[c]),
						Evidence: ev,
					})
				}
			}
		} else if d.n.Log != nil {
			d.n.Log.Debug("KUBE-SERVICES jump check skipped", zap.String("reason", fmt.Sprintf("kube-proxy mode is %q (%s), not iptables or ipvs", mode.mode, mode.note)))
		}
	}

	if d.p.CheckFirewallDrop {
		if fw := s.Rules.Table("filter").Chain("KUBE-FIREWALL"); fw != nil {
			for _, r := range fw.Rules {
				if r.Target != "DROP" {
					continue
				}
				if _, _, hasMark := r.Match("mark", "--mark"); hasMark || len(r.Conditions()) > 0 {
					continue
				}
				ev := base()
				ev["table"], ev["chain"], ev["rule"], ev["line"] = "filter", "KUBE-FIREWALL", r.Text("KUBE-FIREWALL"), r.Line
				out = append(out, finding.Finding{
					Detector: "IPTablesRules",
					Target:   iptablesTarget(s.Family, s.Backend, "filter/KUBE-FIREWALL/bare-drop"),
					Severity: finding.Critical,
					Message:  fmt.Sprintf("filter KUBE-FIREWALL has a DROP without its mark match %s: it drops every packet passing through it (version-skew rule corruption)", where),
					Evidence: ev,
				})
				break
			}
		}
	}

	if d.p.CheckKubeProxyChains && mode.check && mode.mode != string(kubeproxy.ModeIPVS) {
		out = append(out, defectFindings(s, d.kubeProxyDefects(s), base, mode)...)
	}

	if n := s.Rules.KubeRuleCount(); d.p.MaxKubeRules > 0 && n > d.p.MaxKubeRules {
		ev := base()
		ev["maxKubeRules"] = d.p.MaxKubeRules
		out = append(out, finding.Finding{
			Detector: "IPTablesRules",
			Target:   iptablesTarget(s.Family, s.Backend, "kube-rule-count"),
			Severity: finding.Warning,
			Message:  fmt.Sprintf("%d KUBE-* rules %s, over %d: every kube-proxy sync rewrites them under the xtables lock", n, where, d.p.MaxKubeRules),
			Evidence: ev,
		})
	}
	if d.p.MaxSaveDuration.Duration > 0 && s.Duration > d.p.MaxSaveDuration.Duration {
		ev := base()
		ev["maxSaveMs"] = d.p.MaxSaveDuration.Milliseconds()
		out = append(out, finding.Finding{
			Detector: "IPTablesRules",
			Target:   iptablesTarget(s.Family, s.Backend, "save-duration"),
			Severity: finding.Warning,
			Message:  fmt.Sprintf("%s took %s (over %s): the rule set is large enough to hold the xtables lock for long", saveName(s), s.Duration.Round(time.Millisecond), d.p.MaxSaveDuration.Duration),
			Evidence: ev,
		})
	}
	return out
}

// saveName names what read a snapshot's rules: the save command, or the
// decode of the legacy entries that replaced it.
func saveName(s *iptables.Snapshot) string {
	if s.Decoded {
		return "reading and decoding the " + string(s.Family) + " legacy entries"
	}
	return iptables.SaveCommand(s.Family, s.Backend)
}

// mixVersions adds to a backend-mix finding which iptables the host and
// kube-proxy use, each read from its own root filesystem (never the
// daemon's image, never by running a binary): the set in kube-proxy's
// backend is the one it maintains, the other is stale.
func (d *iptablesRules) mixVersions(ctx context.Context, f *finding.Finding) {
	host, kp, _, notes := readIPTablesParties(ctx, d.n, nil, nil)
	if host.known() {
		f.Evidence["nodeIptablesBackend"], f.Evidence["nodeIptables"] = string(host.In.Backend), host.In.Describe()
	} else {
		f.Evidence["nodeIptables"] = host.Err.Error()
	}
	switch {
	case kp == nil:
	case !kp.known():
		f.Evidence["kubeProxyIptables"] = kp.Err.Error()
	default:
		f.Evidence["kubeProxyIptablesBackend"], f.Evidence["kubeProxyIptables"] = string(kp.In.Backend), kp.In.Describe()
		if kp.In.Backend != "" {
			stale := iptables.Legacy
			if kp.In.Backend == iptables.Legacy {
				stale = iptables.NFT
			}
			f.Evidence["staleBackend"] = string(stale)
			f.Message += fmt.Sprintf("; kube-proxy's iptables writes %s, so the %s set is the stale one", kp.In.Backend, stale)
		}
	}
	if len(notes) > 0 {
		f.Evidence["iptablesNotes"] = notes
	}
}

func mixFinding(f iptables.Family, snaps map[iptables.Backend]*iptables.Snapshot) []finding.Finding {
	leg, nft := snaps[iptables.Legacy], snaps[iptables.NFT]
	if leg == nil || nft == nil {
		return nil
	}
	nl, nn := leg.Rules.KubeRuleCount(), nft.Rules.KubeRuleCount()
	cl, cn := leg.Rules.KubeChains(), nft.Rules.KubeChains()
	// Rules, not chains: kubelet's empty hint and canary chains
	// (KUBE-IPTABLES-HINT, KUBE-KUBELET-CANARY) are not a mix.
	if nl == 0 || nn == 0 {
		return nil
	}
	return []finding.Finding{{
		Detector: "IPTablesRules",
		Target:   "iptables/" + string(f) + "/backend-mix",
		Severity: finding.Critical,
		Message:  fmt.Sprintf("KUBE-* rules in both iptables backends (%s): legacy %d rules in %d chains, nft %d rules in %d chains; one set is stale and may shadow or break service traffic", f, nl, cl, nn, cn),
		Evidence: map[string]any{
			"family":           string(f),
			"legacyKubeRules":  nl,
			"legacyKubeChains": cl,
			"nftKubeRules":     nn,
			"nftKubeChains":    cn,
			"legacySaveMs":     leg.Duration.Milliseconds(),
			"nftSaveMs":        nft.Duration.Milliseconds(),
		},
	}}
}

// maxDefectExamples bounds the rules listed in one finding's evidence.
const maxDefectExamples = 5

// defectFindings turns kube-proxy rule defects into findings: one per
// table, chain group and check, with the count and the first rules.
func defectFindings(s *iptables.Snapshot, ds []iptables.Defect, base func() map[string]any, mode proxyMode) []finding.Finding {
	type group struct {
		first  iptables.Defect
		n      int
		breaks bool
		rules  []string
		lines  []int
		chains map[string]bool
	}
	var order []string
	groups := map[string]*group{}
	for _, df := range ds {
		what := df.Check
		if df.Check == iptables.CheckJump {
			what = df.To
		}
		key := df.Table + "/" + iptables.ChainGroup(df.Chain) + "/" + what
		g := groups[key]
		if g == nil {
			g = &group{first: df, chains: map[string]bool{}}
			groups[key] = g
			order = append(order, key)
		}
		g.n++
		g.breaks = g.breaks || df.Breaks
		g.chains[df.Chain] = true
		if df.Rule != "" && len(g.rules) < maxDefectExamples {
			g.rules = append(g.rules, df.Rule)
			g.lines = append(g.lines, df.Line)
		}
	}
	where := fmt.Sprintf("(%s, %s)", s.Family, s.Backend)
	out := make([]finding.Finding, 0, len(order))
	for _, key := range order {
		g := groups[key]
		df := g.first
		sev := finding.Warning
		if g.breaks {
			sev = finding.Critical
		}
		ev := base()
		ev["table"], ev["chain"], ev["check"] = df.Table, iptables.ChainGroup(df.Chain), df.Check
		ev["problem"], ev["canonical"], ev["impact"], ev["count"] = df.Problem, df.Want, df.Impact, g.n
		ev["proxyMode"], ev["proxyModeSource"] = mode.mode, mode.note
		if len(df.Missing) > 0 {
			ev["missingConditions"] = df.Missing
		}
		if len(g.rules) > 0 {
			ev["rules"], ev["lines"] = g.rules, g.lines
		}
		var msg string
		switch {
		case df.Check == iptables.CheckJump && df.Rule == "":
			msg = fmt.Sprintf("%s %s does not jump to %s %s: %s", df.Table, df.Chain, df.To, where, df.Impact)
		case g.n > 1:
			msg = fmt.Sprintf("%d rules of %s %s %s: %s (e.g. %q): %s", g.n, df.Table, iptables.ChainGroup(df.Chain), where, df.Problem, df.Rule, df.Impact)
		case df.Rule == "":
			msg = fmt.Sprintf("%s %s %s: %s (want %q): %s", df.Table, df.Chain, where, df.Problem, df.Want, df.Impact)
		default:
			msg = fmt.Sprintf("%s %s %s: %s: %q (want %s): %s", df.Table, df.Chain, where, df.Problem, df.Rule, df.Want, df.Impact)
		}
		out = append(out, finding.Finding{
			Detector: "IPTablesRules",
			Target:   iptablesTarget(s.Family, s.Backend, key),
			Severity: sev,
			Message:  msg,
			Evidence: ev,
		})
	}
	return out
}
