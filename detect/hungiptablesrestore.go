package detect

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/remediate-dev/remediate/internal/finding"
	"github.com/remediate-dev/remediate/internal/node"
	"github.com/remediate-dev/remediate/internal/procident"
	"github.com/remediate-dev/remediate/internal/procs"
	"github.com/remediate-dev/remediate/policy"
)

// HungIPTablesRestoreParams are the thresholds of HungIPTablesRestore.
type HungIPTablesRestoreParams struct {
	// Names are the argv[0] basenames to watch (never comm: a blocked
	// iptables-legacy-restore has comm "iptables-legacy").
	Names []string `yaml:"names"`
	// MinAge is how long a restore must have run to be reported, and
	// only when it made no progress (no CPU time used over the window,
	// not running). kube-proxy's restores wait at most 5s for the lock and
	// normally finish in well under a second.
	MinAge policy.Duration `yaml:"minAge"`
	// Programs are the executables (basenames of /proc/<pid>/exe) a
	// restore must really run, where readable (CAP_SYS_PTRACE: a second
	// opinion), to be a target; it must also be kube-proxy's or a CNI
	// agent's (its cgroup per the API) or a host process, with
	// CAP_NET_ADMIN. Anything else is reported at info level and never
	// acted on.
	Programs []string `yaml:"programs"`
}

// SetDefaults sets the defaults of HungIPTablesRestore (registry.Defaulter).
func (p *HungIPTablesRestoreParams) SetDefaults() {
	*p = HungIPTablesRestoreParams{Names: append([]string(nil), procs.RestoreNames...), MinAge: policy.D(time.Minute),
		Programs: append([]string(nil), procs.NetfilterPrograms...)}
}

// Validate implements policy.Validator.
func (p *HungIPTablesRestoreParams) Validate() []policy.FieldError {
	var errs []policy.FieldError
	errs = append(errs, validateNames("names", p.Names)...)
	errs = append(errs, validateNames("programs", p.Programs)...)
	if p.MinAge.Duration <= 0 {
		errs = append(errs, policy.FieldError{Field: "minAge", Msg: "must be > 0"})
	}
	return errs
}

func init() {
	Define("HungIPTablesRestore",
		"iptables-restore processes running longer than minAge and making no progress (no CPU time over the window: stuck, often waiting on the xtables lock)",
		newHungIPTablesRestore, Targets(finding.KindProcess))
}

type hungRestore struct {
	p HungIPTablesRestoreParams
	n *node.Node
	judgement
	watch progressWatch
}

func newHungIPTablesRestore(p *HungIPTablesRestoreParams, n *node.Node) (Detector, error) {
	return &hungRestore{p: *p, n: n}, nil
}

func (d *hungRestore) Detect(ctx context.Context) ([]finding.Finding, error) {
	found, old, now, err := findOld(ctx, d.n, d.p.Names, d.p.MinAge.Duration, nil)
	if err != nil {
		return nil, err
	}
	d.set("%d iptables-restore running, none for %s or longer", len(found), d.p.MinAge.Duration)
	if len(old) == 0 {
		d.watch.forget()
		return nil, nil
	}
	// Old is not hung: only those that made no progress over the window.
	judged, err := d.watch.judge(ctx, d.n, old)
	if err != nil {
		return nil, err
	}
	busy, old := splitBusy(judged)
	if len(busy) > 0 {
		d.set("%d iptables-restore running for %s or longer, %d of them making progress, not hung (%s)", len(judged), d.p.MinAge.Duration, len(busy), strings.Join(busy, "; "))
	}
	if len(old) == 0 {
		return nil, nil
	}
	byRef := map[procs.Ref]progress{}
	for _, pr := range judged {
		byRef[pr.cur.Ref()] = pr
	}
	pods := procident.PodsOf(d.n.Pods, now)
	// Only now (something is old) look at the lock.
	var (
		locks   procs.FileLocks
		lockErr error
	)
	if d.n.XtablesLock != "" {
		locks, lockErr = d.n.Procs.FileLocks(ctx, d.n.XtablesLock)
	}
	var out []finding.Finding
	for _, p := range old {
		age := p.Age(now)
		ev := processEvidence(p, now)
		sp := &finding.Process{}
		pr := byRef[p.Ref()]
		pr.evidence(ev, sp)
		msg := fmt.Sprintf("%s (pid %d) has been running for %s, making no progress (%s)", p.Name(), p.Pid, age.Round(time.Second), pr)
		sev := finding.Warning
		if p.Blocked() {
			sev = finding.Critical
			msg += ", in uninterruptible sleep (D)"
		}
		switch {
		case d.n.XtablesLock == "":
			ev["waitsOnXtablesLock"] = nil
		case lockErr != nil:
			ev["waitsOnXtablesLock"] = nil
			ev["xtablesLockError"] = lockErr.Error()
		default:
			waits, holds := false, false
			for _, w := range locks.Waiters {
				if w.Pid == p.Pid {
					waits = true
				}
			}
			for _, h := range locks.Holders {
				if h.Pid == p.Pid {
					holds = true
				}
			}
			ev["waitsOnXtablesLock"] = waits
			ev["holdsXtablesLock"] = holds
			sp.WaitsOnXtablesLock, sp.HoldsXtablesLock = waits, holds
			ev["xtablesLock"] = d.n.XtablesLock
			if holds {
				sev = finding.Critical
				msg += fmt.Sprintf(", holding the xtables lock (%d waiting)", len(locks.Waiters))
			}
			if waits {
				sev = finding.Critical
				ev["xtablesLockHolders"] = processSummaries(locks.Holders, now)
				msg += ", waiting on the xtables lock" + heldBy(locks)
			}
		}
		if why := outOfReach(p, d.p.Programs, d.n, pods, ev); why != "" {
			sev = finding.Info
			msg += "; not a target: " + why
		}
		out = append(out, finding.Finding{
			Detector: "HungIPTablesRestore",
			Target:   p.Target(),
			Severity: sev,
			Message:  msg,
			Evidence: ev,
			Subject:  finding.Subject{AgeSeconds: durSeconds(age), Process: sp},
		})
	}
	return out, nil
}

func heldBy(l procs.FileLocks) string {
	if len(l.Holders) == 0 {
		return fmt.Sprintf(" (holder not visible; /proc/locks pid %v)", l.LockPIDs)
	}
	var s []string
	for _, h := range l.Holders {
		s = append(s, fmt.Sprintf("%s (pid %d)", h.Name(), h.Pid))
	}
	return " held by " + strings.Join(s, ", ")
}
