package detect

import (
	"context"
	"fmt"
	"math"
	"strings"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/remediate-dev/remediate/internal/conntrack"
	"github.com/remediate-dev/remediate/internal/finding"
	"github.com/remediate-dev/remediate/internal/node"
	"github.com/remediate-dev/remediate/policy"
)

// ConntrackExhaustionName is the registered type name.
const ConntrackExhaustionName = "ConntrackExhaustion"

// Targets of ConntrackExhaustion findings.
const (
	// ConntrackTableTarget is the finding about the table filling up or
	// dropping.
	ConntrackTableTarget = conntrack.TableTarget
	// ConntrackDriftTarget is the finding "nf_conntrack_max is lower than
	// what this daemon last set" (kube-proxy resets it when it restarts).
	ConntrackDriftTarget = conntrack.DriftTarget
)

// ConntrackExhaustionParams are the thresholds of ConntrackExhaustion.
//
// Rates need two cycles of the same detector instance (it is rebuilt on
// policy reload): the first cycle, and every `remediate --once` run, judges
// utilization and drift only.
type ConntrackExhaustionParams struct {
	// UtilizationThreshold is count/max at or above which the table is
	// reported (warning). Default 0.8, the field guides' alert threshold
	// (their guidance ranges 75-90%; examples/RUNBOOK.md, section 7).
	UtilizationThreshold float64 `yaml:"utilizationThreshold"`
	// CriticalUtilization raises the severity to critical.
	CriticalUtilization float64 `yaml:"criticalUtilization"`
	// DropRateThreshold is the rate (per second, between two cycles) of
	// drop + early_drop at or above which the table is reported (critical:
	// packets are being lost). 0 disables the rate check.
	DropRateThreshold float64 `yaml:"dropRateThreshold"`
	// InsertFailedRateThreshold is the rate (per second) of insert_failed
	// at or above which the table is reported (warning; a small rate is the
	// known UDP/DNS insertion race, not exhaustion). 0 disables.
	InsertFailedRateThreshold float64 `yaml:"insertFailedRateThreshold"`
	// ReportDrift reports nf_conntrack_max being lower than the value
	// RaiseConntrackMax last set (recorded in the state directory).
	ReportDrift bool `yaml:"reportDrift"`
	// Breakdown adds what fills the table to the finding when utilization
	// is at or above utilizationThreshold: exact counts per class
	// (tcp/<state>, udp/stream, udp/unreplied, icmp, ...) and the topN
	// original destinations and sources, from one streamed dump of the
	// whole table (memory bounded, whatever its size; about 1 s per 250k
	// entries). Below the threshold nothing is dumped.
	Breakdown bool `yaml:"breakdown"`
	// TopN is how many destinations and sources the breakdown names.
	TopN int `yaml:"topN"`
	// BreakdownMaxEntries stops the dump after this many entries (the
	// breakdown then says it is truncated).
	BreakdownMaxEntries int `yaml:"breakdownMaxEntries"`
}

// SetDefaults sets the defaults of ConntrackExhaustion (registry.Defaulter).
func (p *ConntrackExhaustionParams) SetDefaults() {
	*p = ConntrackExhaustionParams{
		UtilizationThreshold:      0.8,
		CriticalUtilization:       0.95,
		DropRateThreshold:         0.1,
		InsertFailedRateThreshold: 1,
		ReportDrift:               true,
		Breakdown:                 true,
		TopN:                      conntrack.DefaultTopN,
		BreakdownMaxEntries:       4 << 20,
	}
}

// Validate implements policy.Validator.
func (p *ConntrackExhaustionParams) Validate() []policy.FieldError {
	var errs []policy.FieldError
	utilOK := p.UtilizationThreshold > 0 && p.UtilizationThreshold <= 1
	if !utilOK {
		errs = append(errs, policy.FieldError{Field: "utilizationThreshold", Msg: "must be in (0, 1]"})
	}
	if !(p.CriticalUtilization > 0 && p.CriticalUtilization <= 1) {
		errs = append(errs, policy.FieldError{Field: "criticalUtilization", Msg: "must be in (0, 1]"})
	} else if utilOK && p.CriticalUtilization < p.UtilizationThreshold {
		errs = append(errs, policy.FieldError{Field: "criticalUtilization", Msg: "must be >= utilizationThreshold"})
	}
	if !(p.DropRateThreshold >= 0) || math.IsInf(p.DropRateThreshold, 0) {
		errs = append(errs, policy.FieldError{Field: "dropRateThreshold", Msg: "must be >= 0 (0 disables)"})
	}
	if !(p.InsertFailedRateThreshold >= 0) || math.IsInf(p.InsertFailedRateThreshold, 0) {
		errs = append(errs, policy.FieldError{Field: "insertFailedRateThreshold", Msg: "must be >= 0 (0 disables)"})
	}
	if p.TopN < 1 || p.TopN > 20 {
		errs = append(errs, policy.FieldError{Field: "topN", Msg: "must be in [1, 20]"})
	}
	if p.BreakdownMaxEntries < 1000 || p.BreakdownMaxEntries > 1<<26 {
		errs = append(errs, policy.FieldError{Field: "breakdownMaxEntries", Msg: "must be in [1000, 67108864]"})
	}
	return errs
}

func init() {
	Define(ConntrackExhaustionName,
		"conntrack table utilization (count/max), drop/early_drop/insert_failed rates, and nf_conntrack_max reset below what remediate set",
		newConntrackExhaustion, Targets(finding.KindConntrackTable), Windowed())
}

// ctSample is one observation of the counters.
type ctSample struct {
	at    time.Time
	stats conntrack.Stats
}

func newConntrackExhaustion(p *ConntrackExhaustionParams, n *node.Node) (Detector, error) {
	return &conntrackExhaustion{p: *p, n: n}, nil
}

// conntrackExhaustion keeps the previous sample to turn counters into
// rates. The first cycle after (re)load has no rates.
type conntrackExhaustion struct {
	p ConntrackExhaustionParams
	n *node.Node

	mu   sync.Mutex
	prev *ctSample
	judgement
}

// ctRates are per-second rates between two samples.
type ctRates struct {
	Drop, EarlyDrop, InsertFailed float64
}

// conntrackRates computes the rates between prev and cur. ok is false when
// there is no usable previous sample: none, no time elapsed, or a counter
// went backwards (module reload, CPU hot-unplug).
func conntrackRates(prev *ctSample, cur ctSample) (r ctRates, ok bool) {
	if prev == nil {
		return r, false
	}
	dt := cur.at.Sub(prev.at).Seconds()
	if dt <= 0 {
		return r, false
	}
	p, c := prev.stats, cur.stats
	if c.Drop < p.Drop || c.EarlyDrop < p.EarlyDrop || c.InsertFailed < p.InsertFailed {
		return r, false
	}
	return ctRates{
		Drop:         float64(c.Drop-p.Drop) / dt,
		EarlyDrop:    float64(c.EarlyDrop-p.EarlyDrop) / dt,
		InsertFailed: float64(c.InsertFailed-p.InsertFailed) / dt,
	}, true
}

// judgeConntrack is the decision: which reasons hold and how severe.
func judgeConntrack(p ConntrackExhaustionParams, u conntrack.Usage, r ctRates, haveRates bool) (reasons []string, sev finding.Severity) {
	util := u.Utilization()
	if u.Max > 0 && util >= p.UtilizationThreshold {
		reasons = append(reasons, fmt.Sprintf("table %.1f%% full (%d/%d, threshold %.0f%%)", util*100, u.Count, u.Max, p.UtilizationThreshold*100))
		sev = finding.Warning
		if util >= p.CriticalUtilization {
			sev = finding.Critical
		}
	}
	if haveRates {
		if d := r.Drop + r.EarlyDrop; p.DropRateThreshold > 0 && d >= p.DropRateThreshold {
			reasons = append(reasons, fmt.Sprintf("dropping %.2f/s (drop %.2f/s, early_drop %.2f/s)", d, r.Drop, r.EarlyDrop))
			sev = finding.Critical
		}
		if p.InsertFailedRateThreshold > 0 && r.InsertFailed >= p.InsertFailedRateThreshold {
			reasons = append(reasons, fmt.Sprintf("insert_failed %.2f/s", r.InsertFailed))
			if sev == "" {
				sev = finding.Warning
			}
		}
	}
	return reasons, sev
}

func round(v float64, digits int) float64 {
	m := math.Pow(10, float64(digits))
	return math.Round(v*m) / m
}

// breakdown dumps the table once for its composition, only when the
// table is at or above the utilization threshold (an idle table costs
// nothing) and the adapter can stream it. The dump gets at most half of
// the time left to the detector: a table too big for it gives a partial
// breakdown (Truncated, with the reason as the error), never a detector
// that times out and loses the finding. A failed dump is reported in the
// evidence and logged; the finding stands without it.
func (d *conntrackExhaustion) breakdown(ctx context.Context, u conntrack.Usage) (conntrack.Composition, bool, error) {
	if !d.p.Breakdown || u.Max == 0 || u.Utilization() < d.p.UtilizationThreshold {
		return conntrack.Composition{}, false, nil
	}
	ts, ok := d.n.Conntrack.(conntrack.TableScanner)
	if !ok {
		return conntrack.Composition{}, false, nil
	}
	bctx, cancel := halfOfDeadline(ctx)
	defer cancel()
	comp, err := conntrack.Compose(bctx, ts, d.p.TopN, d.p.BreakdownMaxEntries)
	if err != nil && ctx.Err() == nil && bctx.Err() != nil && comp.Total > 0 {
		comp.Truncated = true
		return comp, true, fmt.Errorf("breakdown stopped after %d entries (%d ms, half the detector's deadline): counts are of those", comp.Total, comp.DurationMs)
	}
	if err != nil {
		if d.n.Log != nil {
			d.n.Log.Warn("conntrack: breakdown failed", zap.Error(err))
		}
		return conntrack.Composition{}, false, err
	}
	return comp, true, nil
}

// Detect implements Detector.
func (d *conntrackExhaustion) Detect(ctx context.Context) ([]finding.Finding, error) {
	ct := d.n.Conntrack
	if ct == nil {
		return nil, finding.Skip("%s", d.n.Why("conntrack"))
	}
	u, err := ct.Usage(ctx)
	if err != nil {
		return nil, fmt.Errorf("conntrack usage: %w", err)
	}
	st, err := ct.Stats(ctx)
	if err != nil {
		return nil, fmt.Errorf("conntrack statistics: %w", err)
	}
	d.set("conntrack %s of max (%d of %d entries, threshold %s)", pct(u.Utilization()), u.Count, u.Max, pct(d.p.UtilizationThreshold))
	cur := ctSample{at: d.n.Clock.Now(), stats: st}
	d.mu.Lock()
	rates, haveRates := conntrackRates(d.prev, cur)
	d.prev = &cur
	d.mu.Unlock()

	var out []finding.Finding
	if reasons, sev := judgeConntrack(d.p, u, rates, haveRates); len(reasons) > 0 {
		comp, haveComp, compErr := d.breakdown(ctx, u)
		ev := map[string]any{
			"count":               u.Count,
			conntrack.EvidenceMax: u.Max,
			"utilization":         round(u.Utilization(), 4),
			"threshold":           d.p.UtilizationThreshold,
			"drop":                st.Drop,
			"earlyDrop":           st.EarlyDrop,
			"insertFailed":        st.InsertFailed,
			"reasons":             reasons,
		}
		if haveRates {
			ev["dropRate"] = round(rates.Drop, 3)
			ev["earlyDropRate"] = round(rates.EarlyDrop, 3)
			ev["insertFailedRate"] = round(rates.InsertFailed, 3)
		}
		msg := "conntrack: " + strings.Join(reasons, "; ")
		ref := conntrack.TableRef{Max: u.Max}
		if haveComp {
			ref.Composition = &comp
			comp.PutEvidence(ev)
			if comp.Total > 0 {
				msg += "; filled by " + comp.Summary()
			}
		}
		if compErr != nil {
			ev["breakdownError"] = compErr.Error()
		}
		out = append(out, finding.Finding{
			Detector: ConntrackExhaustionName,
			Target:   ConntrackTableTarget,
			Severity: sev,
			Message:  msg,
			Evidence: ev,
			Subject:  finding.Subject{Refs: []finding.Ref{ref}},
		})
	}

	if d.p.ReportDrift {
		// Drift compares the tunable file (what RaiseConntrackMax writes,
		// under --proc-root) with the record of the last write.
		rec, ok, err := ct.LastSetMax(ctx)
		var cur uint64
		if err == nil && ok {
			cur, err = ct.Max(ctx)
		}
		if err != nil {
			// Only drift needs these: say so, keep the rest.
			if d.n.Log != nil {
				d.n.Log.Warn("conntrack: cannot check nf_conntrack_max drift", zap.Error(err))
			}
		} else if ok && cur < rec.Max {
			u.Max = cur
			out = append(out, finding.Finding{
				Detector: ConntrackExhaustionName,
				Target:   ConntrackDriftTarget,
				Severity: finding.Warning,
				Message: fmt.Sprintf("nf_conntrack_max is %d, lower than %d set by remediate at %s (a kube-proxy restart resets it to its own sizing)",
					u.Max, rec.Max, rec.SetAt.UTC().Format(time.RFC3339)),
				Evidence: map[string]any{
					conntrack.EvidenceMax:        u.Max,
					"count":                      u.Count,
					conntrack.EvidenceLastSetMax: rec.Max,
					"lastSetAt":                  rec.SetAt.UTC().Format(time.RFC3339),
					"utilization":                round(u.Utilization(), 4),
				},
				Subject: finding.Subject{Refs: []finding.Ref{conntrack.TableRef{Max: u.Max, LastSetMax: rec.Max}}},
			})
		}
	}
	return out, nil
}
