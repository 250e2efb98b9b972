package ipvs

import (
	"fmt"
	"net/netip"

	"github.com/remediate-dev/remediate/internal/finding"
)

// Typed references to what the IPVS findings are about, each with its one
// encoding: the finding target and the evidence keys the IPVS actions read
// back.

// TimeoutsTarget is the finding target for IPVS's global timeouts
// (finding.KindIPVSTimeouts).
const TimeoutsTarget = "ipvs/timeouts"

// Evidence keys of a virtual server and a real server.
const (
	EvidenceVSProtocol = "vsProtocol"
	EvidenceVSAddress  = "vsAddress"
	EvidenceVSPort     = "vsPort"
	EvidenceRSAddress  = "rsAddress"
	EvidenceRSPort     = "rsPort"
)

// VirtualRef is the typed reference to a virtual server
// (finding.KindIPVSVirtualServer): target "ipvs-vs/UDP/10.96.0.10:53",
// evidence vsProtocol, vsAddress, vsPort.
type VirtualRef struct{ VS VirtualServer }

// Kind is finding.KindIPVSVirtualServer.
func (VirtualRef) Kind() finding.Kind { return finding.KindIPVSVirtualServer }

// Target encodes the reference as a finding target.
func (r VirtualRef) Target() string { return "ipvs-vs/" + r.VS.Key() }

// Evidence encodes the reference as a fresh evidence map; a detector adds
// its own keys to it.
func (r VirtualRef) Evidence() map[string]any {
	return map[string]any{
		EvidenceVSProtocol: r.VS.Protocol,
		EvidenceVSAddress:  r.VS.Address.String(),
		EvidenceVSPort:     int(r.VS.Port),
	}
}

// DecodeVirtualRef reads the virtual server back from a finding's evidence.
func DecodeVirtualRef(ev map[string]any) (VirtualRef, error) {
	proto, err := finding.EvidenceString(ev, EvidenceVSProtocol)
	if err != nil {
		return VirtualRef{}, err
	}
	if proto != TCP && proto != UDP && proto != SCTP {
		return VirtualRef{}, fmt.Errorf("evidence vsProtocol %q is not TCP, UDP or SCTP", proto)
	}
	addr, err := evidenceAddr(ev, EvidenceVSAddress)
	if err != nil {
		return VirtualRef{}, err
	}
	port, err := finding.EvidencePort(ev, EvidenceVSPort)
	if err != nil {
		return VirtualRef{}, err
	}
	return VirtualRef{VirtualServer{Address: addr, Protocol: proto, Port: port}}, nil
}

// RealRef is the typed reference to a real server of a virtual server
// (finding.KindIPVSRealServer): target
// "ipvs-rs/UDP/10.96.0.10:53/10.244.1.5:53", evidence the virtual
// server's keys plus rsAddress, rsPort.
type RealRef struct {
	VS VirtualServer
	RS RealServer
}

// Kind is finding.KindIPVSRealServer.
func (RealRef) Kind() finding.Kind { return finding.KindIPVSRealServer }

// Target encodes the reference as a finding target.
func (r RealRef) Target() string { return "ipvs-rs/" + r.VS.Key() + "/" + r.RS.AddrPort().String() }

// Evidence encodes the reference as a fresh evidence map.
func (r RealRef) Evidence() map[string]any {
	ev := VirtualRef{r.VS}.Evidence()
	ev[EvidenceRSAddress] = r.RS.Address.String()
	ev[EvidenceRSPort] = int(r.RS.Port)
	return ev
}

// DecodeRealRef reads the virtual and real server back from evidence.
func DecodeRealRef(ev map[string]any) (RealRef, error) {
	v, err := DecodeVirtualRef(ev)
	if err != nil {
		return RealRef{}, err
	}
	addr, err := evidenceAddr(ev, EvidenceRSAddress)
	if err != nil {
		return RealRef{}, err
	}
	port, err := finding.EvidencePort(ev, EvidenceRSPort)
	if err != nil {
		return RealRef{}, err
	}
	return RealRef{VS: v.VS, RS: RealServer{Address: addr, Port: port}}, nil
}

func evidenceAddr(ev map[string]any, key string) (netip.Addr, error) {
	s, err := finding.EvidenceString(ev, key)
	if err != nil {
		return netip.Addr{}, err
	}
	a, err := netip.ParseAddr(s)
	if err != nil {
		return netip.Addr{}, fmt.Errorf("evidence %s: %w", key, err)
	}
	return a.Unmap(), nil
}
