package ipvs

import "net/netip"

// Excluded reports whether addr lies inside one of kube-proxy's
// ipvs.excludeCIDRs, and which one. kube-proxy's IPVS proxier skips such
// virtual servers in its cleanup (cleanLegacyService: isIPInExcludeCIDRs),
// so they belong to someone else (kubernetes/kubernetes#134147): nothing
// here reports or deletes them either.
func Excluded(addr netip.Addr, excludeCIDRs []netip.Prefix) (netip.Prefix, bool) {
	addr = addr.Unmap()
	for _, p := range excludeCIDRs {
		if p.Contains(addr) {
			return p, true
		}
	}
	return netip.Prefix{}, false
}
