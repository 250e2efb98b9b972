package detect

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/remediate-dev/remediate/internal/finding"
	"github.com/remediate-dev/remediate/internal/node"
	"github.com/remediate-dev/remediate/internal/procident"
	"github.com/remediate-dev/remediate/internal/procs"
	"github.com/remediate-dev/remediate/policy"
)

// HungNFTParams are the thresholds of HungNFT.
type HungNFTParams struct {
	// Names are the argv[0] basenames to watch (default ["nft"]: kube-proxy
	// in nftables mode runs `nft -f -` for every sync, through knftables).
	Names []string `yaml:"names"`
	// Parents are the parent command names (comm) whose children are
	// watched (default ["kube-proxy"]): an administrator's interactive nft
	// is none of our business.
	Parents []string `yaml:"parents"`
	// MinAge is how long an nft child must have run to be reported, and
	// only when it made no progress (no CPU time used over the window,
	// not running: a busy nft at tens of thousands of Services runs for
	// minutes; a kube-proxy transaction normally takes well under a
	// second).
	MinAge policy.Duration `yaml:"minAge"`
	// Programs are the executables (basenames of /proc/<pid>/exe) a
	// reported process must run where readable (CAP_SYS_PTRACE: a second
	// opinion); it must also be kube-proxy's (its cgroup per the API) or
	// a host process, with CAP_NET_ADMIN; anything else named nft is at
	// most an info finding (argv[0] is chosen by the process).
	Programs []string `yaml:"programs"`
}

// Validate implements policy.Validator.
func (p *HungNFTParams) Validate() []policy.FieldError {
	errs := validateNames("names", p.Names)
	errs = append(errs, validateNames("programs", p.Programs)...)
	if len(p.Parents) == 0 {
		errs = append(errs, policy.FieldError{Field: "parents", Msg: "must name at least one parent program"})
	}
	for i, n := range p.Parents {
		if n == "" || strings.ContainsRune(n, '/') || len(n) > 15 {
			errs = append(errs, policy.FieldError{Field: fmt.Sprintf("parents[%d]", i), Msg: "must be a command name (comm, at most 15 characters), not empty or a path"})
		}
	}
	if p.MinAge.Duration <= 0 {
		errs = append(errs, policy.FieldError{Field: "minAge", Msg: "must be > 0"})
	}
	return errs
}

// SetDefaults implements registry.Defaulter.
func (p *HungNFTParams) SetDefaults() {
	*p = HungNFTParams{Names: []string{"nft"}, Parents: []string{"kube-proxy"}, MinAge: policy.D(30 * time.Second),
		Programs: append([]string(nil), procs.NetfilterPrograms...)}
}

func init() {
	Define("HungNFT",
		"an nft child of kube-proxy running longer than minAge and making no progress (no CPU time over the window: kube-proxy's nftables sync is stuck on it)",
		newHungNFT, Targets(finding.KindProcess))
}

func newHungNFT(p *HungNFTParams, n *node.Node) (Detector, error) { return &hungNFT{p: *p, n: n}, nil }

type hungNFT struct {
	p HungNFTParams
	n *node.Node
	judgement
	watch progressWatch
}

func (d *hungNFT) Detect(ctx context.Context) ([]finding.Finding, error) {
	found, old, now, err := findOld(ctx, d.n, d.p.Names, d.p.MinAge.Duration, func(p procs.Process) bool {
		return slices.Contains(d.p.Parents, p.ParentName)
	})
	if err != nil {
		return nil, err
	}
	d.set("%d nft running, none a child of %s for %s or longer", len(found), strings.Join(d.p.Parents, ", "), d.p.MinAge.Duration)
	if len(old) == 0 {
		d.watch.forget()
		return nil, nil
	}
	// Old is not hung: kube-proxy's nft at tens of thousands of Services
	// runs for minutes, busy.
	judged, err := d.watch.judge(ctx, d.n, old)
	if err != nil {
		return nil, err
	}
	busy, _ := splitBusy(judged)
	if len(busy) > 0 {
		d.set("%d nft children of %s running for %s or longer, %d of them making progress, not hung (%s)", len(judged), strings.Join(d.p.Parents, ", "), d.p.MinAge.Duration, len(busy), strings.Join(busy, "; "))
	}
	return hungNFTFindings(judged, d.p, d.n, procident.PodsOf(d.n.Pods, now), now), nil
}

// hungNFTFindings is the decision: the watched children of the watched
// parents older than MinAge that made no progress over the window.
func hungNFTFindings(judged []progress, p HungNFTParams, n *node.Node, pods procident.Pods, now time.Time) []finding.Finding {
	var out []finding.Finding
	for _, prog := range judged {
		pr := prog.cur
		age := pr.Age(now)
		if prog.advancing() || age < p.MinAge.Duration || !slices.Contains(p.Parents, pr.ParentName) {
			continue
		}
		sev := finding.Warning
		msg := fmt.Sprintf("%s (pid %d), a child of %s (pid %d), has been running for %s, making no progress (%s): kube-proxy's sync waits for it, so Service changes are not programmed",
			pr.Name(), pr.Pid, pr.ParentName, pr.PPid, age.Round(time.Second), prog)
		if pr.Blocked() {
			sev = finding.Critical
			msg += "; it is in uninterruptible sleep (D)"
		}
		ev := processEvidence(pr, now)
		ev["minAgeSeconds"] = p.MinAge.Seconds()
		sp := &finding.Process{}
		prog.evidence(ev, sp)
		if why := outOfReach(pr, p.Programs, n, pods, ev); why != "" {
			sev = finding.Info
			msg += "; not a target: " + why
		}
		out = append(out, finding.Finding{Detector: "HungNFT", Target: pr.Target(), Severity: sev, Message: msg, Evidence: ev,
			Subject: finding.Subject{AgeSeconds: durSeconds(age), Process: sp}})
	}
	return out
}
