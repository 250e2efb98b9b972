package detect

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"sort"
	"strings"
	"sync/atomic"
	"time"

	"go.uber.org/zap"

	"github.com/remediate-dev/remediate/internal/finding"
	"github.com/remediate-dev/remediate/internal/iptables"
	"github.com/remediate-dev/remediate/internal/ipvs"
	"github.com/remediate-dev/remediate/internal/kubeproxy"
	"github.com/remediate-dev/remediate/internal/nftables"
	"github.com/remediate-dev/remediate/internal/node"
)

// This file holds what the kube-proxy detectors (kubeproxy_*.go) and the
// others asking kube-proxy share: access to the adapter, its scrape, and
// kube-proxy's proxy mode (the policy's, kube-proxy's answer, or read
// from the node).

// subsystemKubeProxy is the node.Unavailable key of the kube-proxy adapter.
const subsystemKubeProxy = "kube-proxy"

// kubeProxyOf returns the node's kube-proxy adapter or a Skip saying why
// there is none.
func kubeProxyOf(n *node.Node) (kubeproxy.Interface, error) {
	if n.KubeProxy == nil {
		return nil, finding.Skip("%s", n.Why(subsystemKubeProxy))
	}
	return n.KubeProxy, nil
}

// kubeProxyScrape returns the node's kube-proxy adapter (kubeProxyOf) and
// reads kube-proxy's metrics. When kube-proxy cannot be
// read (unreachable, or an unusable answer) the detector cannot tell: that
// is a Skip naming the cause, not an error, because KubeProxyUnreachable
// reports it as its own finding and the engine keeps the rule's state as
// it was ("unknown is not absent").
func kubeProxyScrape(ctx context.Context, n *node.Node) (kubeproxy.Interface, *kubeproxy.Scrape, error) {
	kp, err := kubeProxyOf(n)
	if err != nil {
		return nil, nil, err
	}
	sc, err := kp.Metrics(ctx)
	if err != nil {
		return nil, nil, kubeProxyReadError("metrics", err)
	}
	if sc.Metrics != nil && sc.Metrics.IgnoredFamilies > 0 && ignoredFamiliesWarned.CompareAndSwap(false, true) && n != nil && n.Log != nil {
		n.Log.Warn("kube-proxy metrics carry ip_family values other than IPv4/IPv6; those series are ignored (warned once)",
			zap.Int("ignoredSamples", sc.Metrics.IgnoredFamilies))
	}
	return kp, sc, nil
}

// ignoredFamiliesWarned makes the warning about unknown IP families once
// per process: a broken endpoint repeats it every scrape.
var ignoredFamiliesWarned atomic.Bool

// kubeProxyReadError turns a failed read into a Skip when it is kube-proxy's
// side (see kubeProxyScrape), else wraps it.
func kubeProxyReadError(what string, err error) error {
	if e, ok := kubeproxy.AsError(err); ok {
		return finding.Skip("cannot read kube-proxy %s (see KubeProxyUnreachable): %v", what, e)
	}
	return fmt.Errorf("reading kube-proxy %s: %w", what, err)
}

// skipUnlessMode returns a Skip when kube-proxy is known to run in a mode
// other than want. An unknown mode (the endpoint failed) does not skip: the
// metrics themselves then decide.
func skipUnlessMode(ctx context.Context, kp kubeproxy.Interface, want kubeproxy.Mode, what string) error {
	m, err := kp.ProxyMode(ctx)
	if err == nil && m != want {
		return finding.Skip("kube-proxy runs in %s mode; %s applies to %s mode only", m, what, want)
	}
	return nil
}

// seconds converts a kube-proxy timestamp gauge (Unix seconds) to a time.
func seconds(v float64) time.Time {
	sec := int64(v)
	return time.Unix(sec, int64((v-float64(sec))*1e9))
}

// kube-proxy's proxy mode, asked or read from the node.
//
// kube-proxy's own answer (/proxyMode) comes first. A frozen kube-proxy
// (stopped, deadlocked, stuck in the kernel) answers nothing until the
// request times out, and that is exactly when the detectors comparing what
// it programmed matter most; so the question gets at most a fraction of
// the detector's time, and when it fails the mode is read from what
// kube-proxy leaves on the node, each mode by its own mark:
//
//   - ipvs: the kube-ipvs0 interface it creates (the IPVS detectors'
//     long-standing fallback), with the IPVS virtual servers counted;
//   - nftables: its `kube-proxy` table (ip or ip6), from the nftables
//     listing the nftables detectors of the cycle share;
//   - iptables: its per-Service chains (KUBE-SVC-*, KUBE-SVL-*) in the nat
//     table of either backend, from the iptables saves the cycle shares
//     (iptables-save, which never takes the xtables lock).
//
// Exactly one mode's mark is an answer; none, or marks of several modes
// (leftovers of a mode switch), is a Skip saying which: guessing would
// compare the wrong thing.

// kubeProxyQueryShare is the share of a detector's remaining time one
// question to kube-proxy may use: a frozen kube-proxy must not eat the
// detector's deadline, so what follows (the node's own state) always gets
// most of it.
const kubeProxyQueryShare = 4

// kubeProxyQueryCtx bounds ctx to 1/kubeProxyQueryShare of the time left
// before its deadline (ctx itself when it has none).
func kubeProxyQueryCtx(ctx context.Context) (context.Context, context.CancelFunc) {
	dl, ok := ctx.Deadline()
	if !ok {
		return context.WithCancel(ctx)
	}
	return context.WithTimeout(ctx, time.Until(dl)/kubeProxyQueryShare)
}

// modeAnswer is kube-proxy's mode and where it came from.
type modeAnswer struct {
	mode kubeproxy.Mode
	// source is "kube-proxy /proxyMode", "the policy", or the node's
	// marks ("node: table ip kube-proxy (nftables)").
	source string
	// askErr is why kube-proxy could not be asked (nil when it answered or
	// was not asked).
	askErr error
}

// modeMark is one mode's mark found on the node.
type modeMark struct {
	mode kubeproxy.Mode
	what string
}

// resolveKubeProxyMode returns kube-proxy's mode: its /proxyMode, asked
// with a bounded share of ctx, else the node's marks (nodeProxyMode). The
// error is a Skip saying why neither could tell.
func resolveKubeProxyMode(ctx context.Context, n *node.Node, saveTimeout time.Duration) (modeAnswer, error) {
	var askErr error
	if n.KubeProxy != nil {
		qctx, cancel := kubeProxyQueryCtx(ctx)
		m, err := n.KubeProxy.ProxyMode(qctx)
		cancel()
		if err == nil {
			return modeAnswer{mode: m, source: "kube-proxy /proxyMode"}, nil
		}
		if ctx.Err() != nil {
			return modeAnswer{}, fmt.Errorf("asking kube-proxy's proxy mode: %w", ctx.Err())
		}
		askErr = err
	} else {
		askErr = errors.New(n.Why(subsystemKubeProxy))
	}
	marks, notes, err := nodeProxyMarks(ctx, n, saveTimeout)
	if err != nil {
		return modeAnswer{}, err
	}
	m, source, err := decideNodeMode(marks, notes, askErr)
	if err != nil {
		return modeAnswer{}, err
	}
	return modeAnswer{mode: m, source: source, askErr: askErr}, nil
}

// decideNodeMode is the pure decision over the node's marks: exactly one
// mode marked is the answer; none or several is a Skip naming them (and
// why kube-proxy was not asked or did not answer).
func decideNodeMode(marks []modeMark, notes []string, askErr error) (kubeproxy.Mode, string, error) {
	by := map[kubeproxy.Mode][]string{}
	var modes []kubeproxy.Mode
	for _, mk := range marks {
		if _, ok := by[mk.mode]; !ok {
			modes = append(modes, mk.mode)
		}
		by[mk.mode] = append(by[mk.mode], mk.what)
	}
	sort.Slice(modes, func(i, j int) bool { return modes[i] < modes[j] })
	why := "kube-proxy did not tell its mode (" + askErr.Error() + ")"
	switch len(modes) {
	case 1:
		return modes[0], "node: " + strings.Join(by[modes[0]], ", "), nil
	case 0:
		msg := why + " and the node shows no mark of any mode (kube-proxy's KUBE-SVC-* chains, its nftables table, kube-ipvs0)"
		if len(notes) > 0 {
			msg += "; " + strings.Join(notes, "; ")
		}
		return "", "", finding.Skip("%s", msg)
	default:
		var parts []string
		for _, m := range modes {
			parts = append(parts, fmt.Sprintf("%s (%s)", m, strings.Join(by[m], ", ")))
		}
		return "", "", finding.Skip("%s and the node shows marks of several modes, a mode switch's leftovers (KubeProxyModeLeftovers reports them): %s; set proxyMode in the policy to compare anyway",
			why, strings.Join(parts, " and "))
	}
}

// nodeProxyMarks reads each mode's mark from the node (read-only, shared
// reads). notes say what could not be read; err is only the caller's ctx
// ending.
func nodeProxyMarks(ctx context.Context, n *node.Node, saveTimeout time.Duration) ([]modeMark, []string, error) {
	var marks []modeMark
	var notes []string
	// IPVS: kube-ipvs0.
	if ok, err := ipvs.KubeIPVSInterfacePresent(n.ProcRoot); err != nil {
		notes = append(notes, fmt.Sprintf("cannot read the interfaces: %v", err))
	} else if ok {
		what := "kube-ipvs0 interface in " + filepath.Join(ipvsProcRootOr(n.ProcRoot), "net", "dev")
		if n.IPVS != nil {
			if vss, err := n.IPVS.VirtualServers(ctx); err == nil {
				what += fmt.Sprintf(" with %d IPVS virtual servers", len(vss))
			}
		}
		marks = append(marks, modeMark{kubeproxy.ModeIPVS, what})
	}
	// nftables: table ip/ip6 kube-proxy.
	if n.NFTables == nil {
		notes = append(notes, "nftables not read: "+n.Why("nftables"))
	} else {
		for _, fam := range []nftables.Family{nftables.FamilyIP, nftables.FamilyIP6} {
			_, err := n.NFTables.ListTable(ctx, fam, nftables.KubeProxyTableName)
			switch {
			case err == nil:
				marks = append(marks, modeMark{kubeproxy.ModeNFTables, fmt.Sprintf("table %s %s", fam, nftables.KubeProxyTableName)})
			case errors.Is(err, nftables.ErrNoTable):
			default:
				notes = append(notes, fmt.Sprintf("listing table %s %s: %v", fam, nftables.KubeProxyTableName, err))
			}
		}
	}
	// iptables: KUBE-SVC-*/KUBE-SVL-* chains in nat, either backend.
	if n.IPTables == nil {
		notes = append(notes, "iptables not read: "+n.Why("iptables"))
	} else {
		for _, fam := range []iptables.Family{iptables.IPv4, iptables.IPv6} {
			for _, b := range []iptables.Backend{iptables.Legacy, iptables.NFT} {
				sctx, cancel := context.WithTimeout(ctx, saveTimeout)
				snap, err := n.IPTables.Save(sctx, fam, b)
				cancel()
				switch {
				case errors.Is(err, iptables.ErrUnavailable):
					continue
				case err != nil:
					notes = append(notes, fmt.Sprintf("%s: %v", iptables.SaveCommand(fam, b), err))
					continue
				}
				if c := serviceChains(snap.Rules); c > 0 {
					marks = append(marks, modeMark{kubeproxy.ModeIPTables, fmt.Sprintf("%d KUBE-SVC/KUBE-SVL chains in %s", c, iptables.SaveCommand(fam, b))})
				}
			}
		}
	}
	if ctx.Err() != nil {
		return nil, nil, fmt.Errorf("reading kube-proxy's mode from the node: %w", ctx.Err())
	}
	return marks, notes, nil
}

// serviceChains counts the nat chains iptables-mode kube-proxy makes per
// Service port (KUBE-SVC-*, and KUBE-SVL-* for local traffic policy); the
// IPVS mode's KUBE-SERVICES has none.
func serviceChains(rs *iptables.Ruleset) int {
	if rs == nil || rs.Table("nat") == nil {
		return 0
	}
	c := 0
	for _, ch := range rs.Table("nat").Chains {
		if strings.HasPrefix(ch.Name, "KUBE-SVC-") || strings.HasPrefix(ch.Name, "KUBE-SVL-") {
			c++
		}
	}
	return c
}

// The detectors learn the mode in one of three ways, by what they do when
// kube-proxy cannot say: resolveKubeProxyMode reads the node's marks (the
// drift comparison, which matters most when kube-proxy is frozen);
// resolveProxyMode goes on with the mode unknown (the iptables detectors,
// whose checks hold in either iptables-based mode); kubeProxyMode skips
// (the nftables detectors). skipUnlessMode skips only a known other mode.

// proxyMode is kube-proxy's mode as this cycle knows it.
type proxyMode struct {
	mode  string // iptables, ipvs, nftables, ... or "" when unknown
	check bool   // run the KUBE-SERVICES jump check
	note  string // where the mode came from, or why it is unknown
}

// resolveProxyMode is kube-proxy's mode as configured ("auto": as
// kube-proxy's /proxyMode says).
func resolveProxyMode(ctx context.Context, n *node.Node, configured string) proxyMode {
	if configured != "auto" {
		return proxyMode{mode: configured, check: configured == "iptables" || configured == "ipvs", note: "from the policy"}
	}
	if n.KubeProxy == nil {
		return proxyMode{check: true, note: "kube-proxy mode unknown: " + n.Why("kube-proxy")}
	}
	qctx, cancel := kubeProxyQueryCtx(ctx) // a frozen kube-proxy must not eat the saves' time
	defer cancel()
	m, err := n.KubeProxy.ProxyMode(qctx)
	if err != nil {
		return proxyMode{check: true, note: "kube-proxy mode unknown: " + err.Error()}
	}
	return proxyMode{mode: string(m), check: m == kubeproxy.ModeIPTables || m == kubeproxy.ModeIPVS, note: "from kube-proxy /proxyMode"}
}

// kubeProxyMode returns kube-proxy's mode per the policy, or an error
// (a Skip) when it cannot be told.
func kubeProxyMode(ctx context.Context, n *node.Node, policyMode string) (kubeproxy.Mode, string, error) {
	if policyMode == "nftables" {
		return kubeproxy.ModeNFTables, "from the policy", nil
	}
	kp, err := kubeProxyOf(n)
	if err != nil {
		return "", "", finding.Skip("kube-proxy mode unknown: %s", n.Why(subsystemKubeProxy))
	}
	m, err := kp.ProxyMode(ctx)
	if err != nil {
		return "", "", finding.Skip("kube-proxy mode unknown (KubeProxyUnreachable reports it): %v", err)
	}
	return m, "from kube-proxy /proxyMode", nil
}
