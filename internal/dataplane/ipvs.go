package dataplane

import (
	"net/netip"

	"github.com/remediate-dev/remediate/internal/ipvs"
)

// IPVSService is one IPVS virtual server with its real servers.
type IPVSService struct {
	VS    ipvs.VirtualServer
	Reals []ipvs.RealServer
}

// FromIPVS reads kube-proxy's IPVS-mode state of one family into the
// model. IPVS carries no Service names: a virtual server is attributed to
// the desired Service port with the same address, protocol and port (a
// ClusterIP, external or load-balancer entry), else to the one with that
// protocol and NodePort (kube-proxy makes one NodePort virtual server per
// node address; they merge into one NodePort entry). Virtual servers the
// desired state does not know go to Unattributed (IPVSStaleVirtualServer
// reports them). Real servers of weight 0 are being drained by kube-proxy
// (graceful termination) and are not counted as programmed backends.
// Every entry's verdict is Forward: IPVS has no reject (compare with
// noVerdicts).
func FromIPVS(svcs []IPVSService, want *Desired) *State {
	st := newState(want.Family, "ipvs", len(want.Ports))
	type owner struct {
		name  PortName
		kind  Kind
		proto string
	}
	owners := make(map[EntryKey]owner, len(want.Ports)*2)
	for _, dp := range want.Ports {
		for _, e := range dp.Entries {
			owners[e.Key] = owner{dp.Name, e.Kind, dp.Protocol}
		}
	}
	for _, s := range svcs {
		if s.VS.FWMark != 0 || FamilyOf(s.VS.Address) != want.Family {
			continue
		}
		key := EntryKey{Addr: s.VS.Address.Unmap(), Protocol: s.VS.Protocol, Port: s.VS.Port}
		o, ok := owners[key]
		if !ok {
			np := EntryKey{Protocol: s.VS.Protocol, Port: s.VS.Port}
			if o, ok = owners[np]; ok && o.kind == NodePort {
				key = np
			} else {
				ok = false
			}
		}
		var bes []netip.AddrPort
		for _, r := range s.Reals {
			if r.Weight > 0 {
				bes = append(bes, r.AddrPort())
			}
		}
		e := Entry{Kind: o.kind, Key: key, Verdict: Forward, Backends: bes}
		if !ok {
			e.Kind = ""
			e.Backends = unionSorted(nil, bes)
			st.Unattributed[key] = e
			continue
		}
		st.port(o.name, o.proto).add(e)
	}
	st.Sort()
	return st
}
