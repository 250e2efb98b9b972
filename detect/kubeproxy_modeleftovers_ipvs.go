package detect

import (
	"context"
	"fmt"
	"net/netip"
	"sort"
	"strings"

	"github.com/remediate-dev/remediate/internal/finding"
	"github.com/remediate-dev/remediate/internal/iptables"
	"github.com/remediate-dev/remediate/internal/ipvs"
	"github.com/remediate-dev/remediate/internal/kubeproxy"
)

// Mode-switch leftovers in the IPVS directions (issue 37.4,
// kubernetes/kubernetes#102314): iptables mode's rules while kube-proxy
// runs in IPVS mode, and IPVS mode's virtual servers and kube-ipvs0 while
// it runs in iptables or nftables mode.

// iptablesModeFindings turns the classification of each save into one
// finding per family and backend holding iptables mode's rules.
func iptablesModeFindings(snaps []*iptables.Snapshot, source string) []finding.Finding {
	var out []finding.Finding
	for _, s := range snaps {
		l := iptables.ClassifyIPTablesModeLeftovers(s.Rules)
		if l == nil {
			continue
		}
		sev := finding.Warning
		what := "stale chains of iptables mode (no longer used: clutter that slows every iptables-save and -restore)"
		if len(l.Rejects) > 0 && len(l.Hooked) > 0 {
			sev = finding.Critical
			what = fmt.Sprintf("%d REJECT/DROP rules for Services that had no endpoints when iptables mode wrote them are still hooked (%s): connections to those Services can be refused although IPVS now serves them (kubernetes/kubernetes#102314)",
				len(l.Rejects), strings.Join(l.Hooked, ", "))
		}
		shown := l.Chains
		if len(shown) > 10 {
			shown = shown[:10]
		}
		rejects := l.Rejects
		if len(rejects) > 10 {
			rejects = rejects[:10]
		}
		out = append(out, finding.Finding{
			Detector: "KubeProxyModeLeftovers",
			Target:   iptablesTarget(s.Family, s.Backend, "iptables-mode-leftovers"),
			Severity: sev,
			Message: fmt.Sprintf("kube-proxy runs in IPVS mode (%s), but %d rules of its iptables mode remain in %d chains of the %s backend (%s): %s; kube-proxy in IPVS mode does not remove them (kube-proxy --cleanup does, with kube-proxy stopped)",
				source, l.Rules, len(l.Chains), s.Backend, s.Family, what),
			Evidence: map[string]any{
				"proxyMode": "ipvs", "proxyModeSource": source, "family": string(s.Family), "backend": string(s.Backend),
				"leftoverRules": l.Rules, "leftoverChains": len(l.Chains), "chains": shown,
				"rejects": len(l.Rejects), "rejectRules": rejects, "hookedRejects": l.Hooked,
				"confirm": iptables.SaveCommand(s.Family, s.Backend) + " | grep -E 'KUBE-(SVC|SEP|EXT|FW|SVL|XLB)-|KUBE-NODEPORTS|KUBE-EXTERNAL-SERVICES|REJECT'",
			},
		})
	}
	return out
}

// ipvsModeLeftover is what the kernel holds of kube-proxy's IPVS mode
// while it runs in iptables or nftables mode.
type ipvsModeLeftover struct {
	// Virtual servers on Service addresses (managed CIDRs or the view's
	// Service IPs), sorted by key; Others counts the rest (not
	// kube-proxy's: keepalived, another balancer).
	Services []ipvs.VirtualServer
	Others   int
	// KubeIPVS0 is true when kube-proxy's dummy interface exists.
	KubeIPVS0 bool
}

// classifyIPVSModeLeftovers is the decision in iptables and nftables
// modes: nil when neither a virtual server of kube-proxy's address ranges
// nor kube-ipvs0 remains. isService may be nil (no cluster view).
func classifyIPVSModeLeftovers(vss []ipvs.VirtualServer, cidrs []netip.Prefix, isService func(netip.Addr) bool, kubeIPVS0 bool) *ipvsModeLeftover {
	out := &ipvsModeLeftover{KubeIPVS0: kubeIPVS0}
	for _, vs := range vss {
		ours := false
		if vs.FWMark == 0 {
			a := vs.Address.Unmap()
			for _, p := range cidrs {
				ours = ours || p.Contains(a)
			}
			ours = ours || (isService != nil && isService(a))
		}
		if ours {
			out.Services = append(out.Services, vs)
		} else {
			out.Others++
		}
	}
	if len(out.Services) == 0 && !kubeIPVS0 {
		return nil
	}
	sort.Slice(out.Services, func(i, j int) bool { return out.Services[i].Key() < out.Services[j].Key() })
	return out
}

// ipvsModeFinding is the one finding of an IPVS leftover.
func ipvsModeFinding(l *ipvsModeLeftover, mode kubeproxy.Mode, source string) finding.Finding {
	keys := make([]string, 0, len(l.Services))
	for i, vs := range l.Services {
		if i == 10 {
			break
		}
		keys = append(keys, vs.Key())
	}
	var parts []string
	if len(l.Services) > 0 {
		parts = append(parts, fmt.Sprintf("%d IPVS virtual servers on Service addresses", len(l.Services)))
	}
	if l.KubeIPVS0 {
		parts = append(parts, "its kube-ipvs0 dummy interface (Service IPs bound to it are local addresses of the node)")
	}
	return finding.Finding{
		Detector: "KubeProxyModeLeftovers",
		Target:   "ipvs/kube-proxy-leftovers",
		Severity: finding.Warning,
		Message: fmt.Sprintf("kube-proxy runs in %s mode (%s), but %s remain from its IPVS mode: they answer for Service ports %s's rules do not cover, with the backends of when they were written; remove them with kube-proxy --cleanup (kube-proxy stopped) or ipvsadm -D and ip link del kube-ipvs0",
			mode, source, strings.Join(parts, " and "), mode),
		Evidence: map[string]any{
			"proxyMode": string(mode), "proxyModeSource": source, "virtualServers": len(l.Services), "shown": keys,
			"otherVirtualServers": l.Others, "kubeIPVS0": l.KubeIPVS0,
			"confirm": "ipvsadm -Ln; ip addr show kube-ipvs0",
		},
	}
}

// ipvsLeftovers reads IPVS in iptables and nftables modes. IPVS that is
// not available here (no ip_vs module: nothing is loaded to ask) has no
// leftovers; why is returned for the judgement.
func (d *kubeProxyModeLeftovers) ipvsLeftovers(ctx context.Context, mode kubeproxy.Mode, source string) (*finding.Finding, string, error) {
	kubeIPVS0, _ := ipvs.KubeIPVSInterfacePresent(d.n.ProcRoot)
	var vss []ipvs.VirtualServer
	switch {
	case d.n.IPVS == nil:
		if !kubeIPVS0 {
			return nil, "IPVS not read here", nil
		}
	default:
		if a, ok := d.n.IPVS.(interface{ Available(context.Context) error }); ok {
			if err := a.Available(ctx); err != nil {
				if !kubeIPVS0 {
					return nil, "IPVS unavailable (ip_vs not loaded): no IPVS leftovers", nil
				}
				break
			}
		}
		var err error
		vss, err = d.n.IPVS.VirtualServers(ctx)
		if err != nil {
			return nil, "", ipvsErr("listing IPVS virtual servers", err)
		}
	}
	var isService func(netip.Addr) bool
	if d.n.Cluster != nil && clusterViewGate(d.n, "") == nil {
		isService = ipvs.NewDesired(d.n.Cluster, nil).IsServiceAddress
	}
	l := classifyIPVSModeLeftovers(vss, d.serviceCIDRs, isService, kubeIPVS0)
	if l == nil {
		return nil, fmt.Sprintf("no IPVS virtual server on Service addresses (%d others), no kube-ipvs0", len(vss)), nil
	}
	f := ipvsModeFinding(l, mode, source)
	return &f, "", nil
}
