package detect

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"path/filepath"
	"sort"

	"github.com/remediate-dev/remediate/internal/finding"
	"github.com/remediate-dev/remediate/internal/ipvs"
	"github.com/remediate-dev/remediate/internal/kubeproxy"
	"github.com/remediate-dev/remediate/internal/node"
	"github.com/remediate-dev/remediate/policy"
)

// Shared pieces of the IPVS detectors (ipvs*.go).

// ipvsPrecheck returns a Skip when an IPVS detector cannot run here: no IPVS
// adapter, kube-proxy not in IPVS mode (no kube-ipvs0 interface, unless
// requireMode is false), or, when needView, no cluster view or one that is
// not synced or not connected.
func ipvsPrecheck(ctx context.Context, n *node.Node, requireMode, needView bool) error {
	if n.IPVS == nil {
		return finding.Skip("%s", n.Why("ipvs"))
	}
	// The root cause first: without ip_vs nothing else matters.
	if a, ok := n.IPVS.(interface{ Available(context.Context) error }); ok {
		if err := a.Available(ctx); err != nil {
			return ipvsErr("checking IPVS availability", err)
		}
	}
	if requireMode {
		// kube-proxy's own answer first (/proxyMode); when it cannot be
		// asked, the kube-ipvs0 interface it creates in IPVS mode.
		if n.KubeProxy != nil {
			// A frozen kube-proxy (stopped, or wedged with its listener
			// open) answers nothing until the request times out: that
			// is when its IPVS leftovers matter most, so the question
			// may use at most half of what is left of the detector's
			// time and the fallback below always gets the rest.
			pctx, cancel := halfOfDeadline(ctx)
			mode, err := n.KubeProxy.ProxyMode(pctx)
			cancel()
			if err == nil {
				if mode != kubeproxy.ModeIPVS {
					return finding.Skip("kube-proxy runs in %q mode (its /proxyMode), not IPVS", mode)
				}
				return ipvsViewPrecheck(n, needView)
			}
		}
		ok, err := ipvs.KubeIPVSInterfacePresent(n.ProcRoot)
		if err != nil {
			return finding.Skip("cannot tell whether kube-proxy runs in IPVS mode: %v", err)
		}
		if !ok {
			return finding.Skip("kube-proxy does not appear to run in IPVS mode: no kube-ipvs0 interface in %s (set requireIPVSMode: false to check anyway)",
				filepath.Join(ipvsProcRootOr(n.ProcRoot), "net", "dev"))
		}
	}
	return ipvsViewPrecheck(n, needView)
}

// ipvsViewPrecheck skips when the view is needed and missing, not synced
// or not connected.
func ipvsViewPrecheck(n *node.Node, needView bool) error {
	if needView {
		return clusterViewGate(n, "cannot compare IPVS with the desired state")
	}
	return nil
}

func ipvsProcRootOr(p string) string {
	if p == "" {
		return "/proc"
	}
	return p
}

// ipvsErr turns ErrUnavailable into a Skip and wraps anything else.
func ipvsErr(op string, err error) error {
	if err == nil {
		return nil
	}
	if errors.Is(err, ipvs.ErrUnavailable) {
		return finding.Skip("%s", err.Error())
	}
	return fmt.Errorf("%s: %w", op, err)
}

// ipvsParseAddrs parses a list of IP addresses (a parameter); field names the
// parameter for errors.
func ipvsParseAddrs(field string, in []string) ([]netip.Addr, []policy.FieldError) {
	var out []netip.Addr
	var errs []policy.FieldError
	for i, s := range in {
		a, err := netip.ParseAddr(s)
		if err != nil {
			errs = append(errs, policy.FieldError{Field: fmt.Sprintf("%s[%d]", field, i), Msg: fmt.Sprintf("%q is not an IP address", s)})
			continue
		}
		out = append(out, a.Unmap())
	}
	return out, errs
}

func ipvsParsePrefixes(field string, in []string) ([]netip.Prefix, []policy.FieldError) {
	var out []netip.Prefix
	var errs []policy.FieldError
	for i, s := range in {
		p, err := netip.ParsePrefix(s)
		if err != nil {
			errs = append(errs, policy.FieldError{Field: fmt.Sprintf("%s[%d]", field, i), Msg: fmt.Sprintf("%q is not a CIDR", s)})
			continue
		}
		out = append(out, p.Masked())
	}
	return out, errs
}

func ipvsMaxFindingsErr(n int) []policy.FieldError {
	if n < 1 {
		return []policy.FieldError{{Field: "maxFindings", Msg: "must be at least 1"}}
	}
	return nil
}

func ipvsExpectedList(sp *ipvs.ServicePort) []string {
	out := make([]string, 0, len(sp.Expected))
	for ap := range sp.Expected {
		out = append(out, ap.String())
	}
	sort.Strings(out)
	return out
}
