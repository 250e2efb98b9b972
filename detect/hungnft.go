package detect

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/remediate-dev/remediate/internal/finding"
	"github.com/remediate-dev/remediate/internal/node"
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
	// MinAge is how long an nft child must have run to be reported (a
	// kube-proxy transaction normally takes well under a second, seconds
	// for tens of thousands of services).
	MinAge policy.Duration `yaml:"minAge"`
	// Programs are the executables (basenames of /proc/<pid>/exe) a
	// reported process must run, with CAP_NET_ADMIN; anything else named
	// nft is at most an info finding (argv[0] is chosen by the process).
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
		"an nft child of kube-proxy running longer than minAge (kube-proxy's nftables sync is stuck on it)",
		newHungNFT, Targets(finding.KindProcess))
}

func newHungNFT(p *HungNFTParams, n *node.Node) (Detector, error) { return &hungNFT{p: *p, n: n}, nil }

type hungNFT struct {
	p HungNFTParams
	n *node.Node
}

func (d *hungNFT) Detect(ctx context.Context) ([]finding.Finding, error) {
	if d.n.Procs == nil {
		return nil, finding.Skip("%s", d.n.Why("procs"))
	}
	found, err := d.n.Procs.Find(ctx, d.p.Names)
	if err != nil {
		return nil, fmt.Errorf("scanning processes: %w", err)
	}
	return hungNFTFindings(found, d.p, d.n.Procs.SelfNetNS(), d.n.Clock.Now()), nil
}

// hungNFTFindings is the decision: the watched children of the watched
// parents older than MinAge.
func hungNFTFindings(found []procs.Process, p HungNFTParams, nodeNetNS string, now time.Time) []finding.Finding {
	var out []finding.Finding
	for _, pr := range found {
		age := pr.Age(now)
		if age < p.MinAge.Duration || !slices.Contains(p.Parents, pr.ParentName) {
			continue
		}
		sev := finding.Warning
		msg := fmt.Sprintf("%s (pid %d), a child of %s (pid %d), has been running for %s: kube-proxy's sync waits for it, so Service changes are not programmed",
			pr.Name(), pr.Pid, pr.ParentName, pr.PPid, age.Round(time.Second))
		if pr.Blocked() {
			sev = finding.Critical
			msg += "; it is in uninterruptible sleep (D)"
		}
		ev := processEvidence(pr, now)
		ev["minAgeSeconds"] = p.MinAge.Seconds()
		if why := outOfReach(pr, p.Programs, nodeNetNS, ev); why != "" {
			sev = finding.Info
			msg += "; not a target: " + why
		}
		out = append(out, finding.Finding{Detector: "HungNFT", Target: pr.Target(), Severity: sev, Message: msg, Evidence: ev,
			Subject: finding.Subject{AgeSeconds: durSeconds(age), Process: &finding.Process{}}})
	}
	return out
}
