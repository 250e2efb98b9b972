package conntrack

import (
	"fmt"
	"net/netip"
	"strings"

	"github.com/remediate-dev/remediate/internal/finding"
)

// Targets of the conntrack table findings (finding.KindConntrackTable).
const (
	// TableTarget is the finding about the table filling up or dropping.
	TableTarget = "conntrack/table"
	// DriftTarget is the finding "nf_conntrack_max is lower than what
	// remediate last set" (kube-proxy or a reboot reset it).
	DriftTarget = "conntrack/max-drift"
)

// Evidence keys of the table findings that RaiseConntrackMax reads.
const (
	// EvidenceMax is nf_conntrack_max when the finding was made.
	EvidenceMax = "max"
	// EvidenceLastSetMax is the value remediate last set (drift findings).
	EvidenceLastSetMax = "lastSetMax"
)

// TableRef is the typed reference to the conntrack table
// (finding.KindConntrackTable, targets TableTarget and DriftTarget): what
// RaiseConntrackMax and SetConntrackTimeouts act on. The detector also
// writes these facts into the evidence (EvidenceMax, EvidenceLastSetMax,
// PutEvidence) for people; actions read them here.
type TableRef struct {
	// Max is nf_conntrack_max when the finding was made.
	Max uint64
	// LastSetMax is the value remediate last set (drift findings); 0
	// when not known.
	LastSetMax uint64
	// Composition is the breakdown of the table's entries; nil when the
	// detector took none.
	Composition *Composition
}

// Kind is finding.KindConntrackTable.
func (TableRef) Kind() finding.Kind { return finding.KindConntrackTable }

// Evidence keys of a backend (BackendRef).
const (
	EvidenceBackendIP   = "backendIP"
	EvidenceBackendPort = "backendPort"
	EvidenceProtocol    = "protocol"
)

// BackendRef is the typed reference to the conntrack entries of one
// backend (finding.KindConntrackBackend): target
// "ipvs-conn/UDP/10.244.1.5:53", evidence backendIP, backendPort (absent
// or 0: every port) and protocol (optional).
type BackendRef struct {
	// Protocol is "UDP", "TCP", ... or "" when the finding did not say.
	Protocol string
	Backend  Backend
}

// Kind is finding.KindConntrackBackend.
func (BackendRef) Kind() finding.Kind { return finding.KindConntrackBackend }

// Target encodes the reference as a finding target.
func (r BackendRef) Target() string {
	return "ipvs-conn/" + r.Protocol + "/" + netip.AddrPortFrom(r.Backend.IP, r.Backend.Port).String()
}

// PutEvidence writes the reference's evidence keys into ev.
func (r BackendRef) PutEvidence(ev map[string]any) {
	ev[EvidenceBackendIP] = r.Backend.IP.String()
	ev[EvidenceBackendPort] = int(r.Backend.Port)
	if r.Protocol != "" {
		ev[EvidenceProtocol] = r.Protocol
	}
}

// DecodeBackendRef reads the backend back from a finding's evidence. The
// protocol is upper-cased; the backend is validated.
func DecodeBackendRef(ev map[string]any) (BackendRef, error) {
	var r BackendRef
	if proto, ok := ev[EvidenceProtocol]; ok {
		s, isStr := proto.(string)
		if !isStr || s == "" {
			return r, fmt.Errorf("evidence %q = %v is not a protocol name", EvidenceProtocol, proto)
		}
		r.Protocol = strings.ToUpper(s)
	}
	s, err := finding.EvidenceString(ev, EvidenceBackendIP)
	if err != nil {
		return r, err
	}
	ip, err := netip.ParseAddr(s)
	if err != nil {
		return r, fmt.Errorf("evidence %q: %w", EvidenceBackendIP, err)
	}
	r.Backend.IP = ip.Unmap()
	if _, present := ev[EvidenceBackendPort]; present {
		port, err := finding.EvidenceInt(ev, EvidenceBackendPort)
		if err != nil || port < 0 || port > 65535 {
			return r, fmt.Errorf("evidence %q = %v is not a port", EvidenceBackendPort, ev[EvidenceBackendPort])
		}
		r.Backend.Port = uint16(port)
	}
	return r, r.Backend.Validate()
}
