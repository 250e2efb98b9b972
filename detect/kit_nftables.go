package detect

import (
	"context"
	"errors"
	"fmt"
	"sort"

	"github.com/remediate-dev/remediate/internal/finding"
	"github.com/remediate-dev/remediate/internal/kubeproxy"
	"github.com/remediate-dev/remediate/internal/nftables"
	"github.com/remediate-dev/remediate/internal/node"
	"github.com/remediate-dev/remediate/policy"
)

// This file holds what the nftables detectors (KubeProxyNFTablesIntegrity,
// NFTablesShadowing, KubeProxyModeLeftovers, DataplaneDrift) share: the
// adapter, a listing too large to see (blind), the mode parameters and the
// IP families kube-proxy serves.

// subsystemNFTables is the node.Unavailable key of the nftables adapter.
const subsystemNFTables = "nftables"

// nftOf returns the node's nftables adapter or a Skip saying why there is
// none.
func nftOf(n *node.Node) (nftables.Interface, error) {
	if n.NFTables == nil {
		return nil, finding.Skip("%s", n.Why(subsystemNFTables))
	}
	return n.NFTables, nil
}

// listRuleset lists the ruleset; a missing nft is a Skip.
func listRuleset(ctx context.Context, n *node.Node) (*nftables.Snapshot, error) {
	nft, err := nftOf(n)
	if err != nil {
		return nil, err
	}
	s, err := nft.ListRuleset(ctx)
	if err != nil {
		if isUnavailable(err) {
			return nil, finding.Skip("%v", err)
		}
		if nftBlind(err) {
			return nil, &blindError{err: err}
		}
		return nil, fmt.Errorf("listing the nftables ruleset: %w", err)
	}
	return s, nil
}

// nftBlind reports whether a listing failed for the ruleset's size: more
// output than the bound (nftables.ErrTooLarge) or more time than its own
// bound within the detector's (nftables.ErrTimeout; kube-proxy's table at
// 30,000 Services took 82 s, docs/SCALE.md). The caller's own deadline
// is not that.
func nftBlind(err error) bool {
	return errors.Is(err, nftables.ErrTooLarge) || errors.Is(err, nftables.ErrTimeout)
}

// blindError says the nftables checks cannot see the ruleset, and why:
// KubeProxyNFTablesIntegrity reports it (the report's one finding about
// it, by the daemon itself: no action acts on it); NFTablesShadowing and
// DataplaneDrift skip, naming it.
type blindError struct{ err error }

func (e *blindError) Error() string {
	what := "more time than its bound"
	if errors.Is(e.err, nftables.ErrTooLarge) {
		what = "more output than its bound"
	}
	return fmt.Sprintf("the nftables checks are blind: listing the ruleset took %s (%v): the ruleset is too large to check within the detector's timeout and the listing's size bound; KubeProxyNFTablesIntegrity, NFTablesShadowing and DataplaneDrift compare nothing until it can be listed (a longer rule timeout lets the listing run longer)", what, e.err)
}

func (e *blindError) Unwrap() error { return e.err }

// blindSkip turns a blind listing into the skip of a check that is not
// the one reporting it.
func blindSkip(err error) error {
	var be *blindError
	if errors.As(err, &be) {
		return finding.Skip("%s (reported by KubeProxyNFTablesIntegrity)", be.Error())
	}
	return err
}

func isUnavailable(err error) bool {
	return err != nil && errors.Is(err, nftables.ErrUnavailable)
}

// NFTablesModeParams are the parameters the kube-proxy nftables detectors
// share (each params struct carries them as its own proxyMode and
// families fields): how kube-proxy's mode is learnt and which families it
// serves.
type NFTablesModeParams struct {
	ProxyMode string
	Families  []string
}

func (p NFTablesModeParams) validate() []policy.FieldError {
	return append(validateOneOf("proxyMode", p.ProxyMode, "auto", "nftables"), validateFamilyNames(p.Families)...)
}

// servedFamilies returns the IP families kube-proxy serves, sorted, and
// where that came from.
func servedFamilies(ctx context.Context, n *node.Node, p NFTablesModeParams) ([]kubeproxy.Family, string, error) {
	if len(p.Families) > 0 {
		out := make([]kubeproxy.Family, 0, len(p.Families))
		for _, f := range p.Families {
			out = append(out, kubeproxy.Family(f))
		}
		sort.Slice(out, func(i, j int) bool { return out[i] < out[j] })
		return out, "from the policy", nil
	}
	_, sc, err := kubeProxyScrape(ctx, n)
	if err != nil {
		return nil, "", err
	}
	if !sc.Metrics.Labelled {
		return []kubeproxy.Family{"IPv4"}, "IPv4 assumed (kube-proxy < 1.33 does not label families)", nil
	}
	var out []kubeproxy.Family
	for _, f := range sc.Metrics.FamilyNames() {
		if sc.Metrics.Families[f].LastSync != nil {
			out = append(out, f)
		}
	}
	return out, "families with a completed kube-proxy sync", nil
}

// nftFamily maps kube-proxy's family to its table's nftables family.
func nftFamily(f kubeproxy.Family) nftables.Family {
	if f == "IPv6" {
		return nftables.FamilyIP6
	}
	return nftables.FamilyIP
}

// nftTarget is the target of a finding about a table: "nftables/ip/kube-proxy".
func nftTarget(f nftables.Family, table string) string {
	return "nftables/" + string(f) + "/" + table
}
