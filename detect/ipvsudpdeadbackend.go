package detect

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"path/filepath"
	"sort"
	"strings"

	"github.com/remediate-dev/remediate/internal/boundedfile"
	"github.com/remediate-dev/remediate/internal/conntrack"
	"github.com/remediate-dev/remediate/internal/finding"
	"github.com/remediate-dev/remediate/internal/ipvs"
	"github.com/remediate-dev/remediate/internal/node"
	"github.com/remediate-dev/remediate/policy"
)

// IPVSUDPDeadBackendParams are the IPVSUDPDeadBackend thresholds.
type IPVSUDPDeadBackendParams struct {
	// RequireIPVSMode skips the detector unless kube-proxy runs in IPVS
	// mode: its /proxyMode says so or, when it cannot be asked, its
	// kube-ipvs0 interface exists (default true).
	RequireIPVSMode bool `yaml:"requireIPVSMode"`
	// MinConnections is how many entries pinned to one dead backend make
	// a finding (default 1).
	MinConnections int `yaml:"minConnections"`
	// MaxClients bounds the client addresses listed in the evidence
	// (default 20); the count is always complete.
	MaxClients int `yaml:"maxClients"`
	// MaxFindings bounds the findings of one run (default 50).
	MaxFindings int `yaml:"maxFindings"`
}

// SetDefaults sets the defaults of IPVSUDPDeadBackend (registry.Defaulter).
func (p *IPVSUDPDeadBackendParams) SetDefaults() {
	*p = IPVSUDPDeadBackendParams{RequireIPVSMode: true, MinConnections: 1, MaxClients: 20, MaxFindings: 50}
}

// Validate implements policy.Validator.
func (p *IPVSUDPDeadBackendParams) Validate() []policy.FieldError {
	var errs []policy.FieldError
	if p.MinConnections < 1 {
		errs = append(errs, policy.FieldError{Field: "minConnections", Msg: "must be at least 1"})
	}
	if p.MaxClients < 0 {
		errs = append(errs, policy.FieldError{Field: "maxClients", Msg: "must not be negative"})
	}
	return append(errs, ipvsMaxFindingsErr(p.MaxFindings)...)
}

func init() {
	Define("IPVSUDPDeadBackend",
		"UDP entries in the IPVS connection table pinned to a backend that is no longer a serving endpoint (e.g. DNS after a CoreDNS rollout)",
		newIPVSUDPDeadBackend, Targets(finding.KindConntrackBackend), UsesClusterView())
}

type ipvsUDPDeadBackend struct {
	p IPVSUDPDeadBackendParams
	n *node.Node
}

func newIPVSUDPDeadBackend(p *IPVSUDPDeadBackendParams, n *node.Node) (Detector, error) {
	return &ipvsUDPDeadBackend{p: *p, n: n}, nil
}

// DeadBackendTarget is the finding target for UDP entries pinned to a dead
// backend: "ipvs-conn/UDP/10.244.0.12:53".
func DeadBackendTarget(proto string, backend netip.AddrPort) string {
	return conntrack.BackendRef{Protocol: proto, Backend: conntrack.Backend{IP: backend.Addr(), Port: backend.Port()}}.Target()
}

type ipvsDeadBackend struct {
	backend   netip.AddrPort
	conns     int
	templates int
	clients   map[netip.Addr]bool
	vss       map[string]ipvs.VirtualServer
	services  map[string]bool
	reason    string
	// clientsTruncated: more distinct clients than ipvsMaxClientsTracked.
	clientsTruncated bool
}

// ipvsMaxClientsTracked bounds the distinct clients remembered per dead
// backend (memory); clientCount is then a lower bound.
const ipvsMaxClientsTracked = 10000

// Detect groups the UDP connection entries whose virtual address belongs
// to a Service by destination, and reports each destination that is not an
// endpoint of that Service or not serving. Entries for addresses that are
// not Services are ignored. A terminating endpoint that still serves is not
// dead. Entries pinned to a destination that is no real server any more are
// harmless when net.ipv4.vs.expire_nodest_conn is 1 (their next packet
// expires them and is scheduled anew) and are not reported.
func (d *ipvsUDPDeadBackend) Detect(ctx context.Context) ([]finding.Finding, error) {
	if err := ipvsPrecheck(ctx, d.n, d.p.RequireIPVSMode, true); err != nil {
		return nil, err
	}
	desired := ipvs.NewDesired(d.n.Cluster, nil)
	dead := map[netip.AddrPort]*ipvsDeadBackend{}
	// Streamed: only the entries pinned to dead backends are kept, and
	// per backend at most ipvsMaxClientsTracked distinct clients.
	err := d.n.IPVS.Connections(ctx, ipvs.UDP, func(c ipvs.Conn) error {
		vs := ipvs.VirtualServer{Address: c.Virtual.Addr(), Protocol: c.Protocol, Port: c.Virtual.Port()}
		fe, ok := desired.Lookup(vs)
		if !ok {
			return nil
		}
		class := fe.SP.Classify(c.Dest)
		if !ipvs.Dead(class) {
			return nil
		}
		dest := netip.AddrPortFrom(c.Dest.Addr().Unmap(), c.Dest.Port())
		b := dead[dest]
		if b == nil {
			b = &ipvsDeadBackend{backend: dest, clients: map[netip.Addr]bool{}, vss: map[string]ipvs.VirtualServer{}, services: map[string]bool{}, reason: class}
			dead[dest] = b
		}
		b.conns++
		if c.Template() {
			b.templates++
		}
		if len(b.clients) < ipvsMaxClientsTracked {
			b.clients[c.Client.Addr()] = true
		} else if !b.clients[c.Client.Addr()] {
			b.clientsTruncated = true
		}
		b.vss[vs.Key()] = vs
		b.services[fe.SP.ServiceName()] = true
		return nil
	})
	if err != nil {
		return nil, ipvsErr("reading the IPVS connection table", err)
	}
	list := make([]*ipvsDeadBackend, 0, len(dead))
	for _, b := range dead {
		if b.conns >= d.p.MinConnections {
			list = append(list, b)
		}
	}
	sort.Slice(list, func(i, j int) bool {
		if list[i].conns != list[j].conns {
			return list[i].conns > list[j].conns
		}
		return list[i].backend.String() < list[j].backend.String()
	})
	expireNodest := ipvsReadSysctl(d.n.ProcRoot, "net/ipv4/vs/expire_nodest_conn")
	var out []finding.Finding
	for _, b := range list {
		// Is the dead backend still a real server somewhere? If it is,
		// IPVSStaleRealServer/DeleteIPVSRealServer is the fix; if not,
		// the entries linger only until they expire (or, with
		// expire_nodest_conn=1, until their next packet).
		still := []string{}
		vsKeys := make([]string, 0, len(b.vss))
		for k, vs := range b.vss {
			vsKeys = append(vsKeys, k)
			rss, err := d.n.IPVS.RealServers(ctx, vs)
			if errors.Is(err, ipvs.ErrNotFound) {
				continue
			}
			if err != nil {
				return nil, ipvsErr("listing real servers of "+k, err)
			}
			for _, r := range rss {
				if r.AddrPort() == b.backend {
					still = append(still, k)
				}
			}
		}
		sort.Strings(vsKeys)
		sort.Strings(still)
		if len(still) == 0 && expireNodest == "1" {
			// No longer a real server anywhere, and the kernel expires
			// such entries on their next packet and schedules that
			// packet anew (measured in the test VM, see
			// ClearIPVSUDPAffinity): no client stays pinned.
			continue
		}
		hint := ""
		if len(still) > 0 {
			hint = "; still a real server of " + strings.Join(still, ", ")
		}
		if expireNodest == "0" {
			hint += "; net.ipv4.vs.expire_nodest_conn=0 keeps entries pinned even after the real server is deleted"
		}
		clients := ipvsSortedAddrs(b.clients)
		shown := clients
		if len(shown) > d.p.MaxClients {
			shown = shown[:d.p.MaxClients]
		}
		ev := map[string]any{
			"connections":             b.conns,
			"templates":               b.templates,
			"clientCount":             len(clients),
			"clientCountIsLowerBound": b.clientsTruncated,
			"clients":                 shown,
			"virtualServers":          vsKeys,
			"stillRealServerIn":       still,
			"expireNodestConn":        expireNodest,
			"services":                ipvsSortedKeys(b.services),
			"reason":                  b.reason,
		}
		ref := conntrack.BackendRef{Protocol: ipvs.UDP, Backend: conntrack.Backend{IP: b.backend.Addr(), Port: b.backend.Port()}}
		ref.PutEvidence(ev)
		out = append(out, finding.Finding{
			Detector: "IPVSUDPDeadBackend",
			Target:   ref.Target(),
			Severity: finding.Critical,
			Message: fmt.Sprintf("%d UDP IPVS entries from %d clients are pinned to %s (%s) behind %s%s",
				b.conns, len(clients), b.backend, b.reason, ipvsJoinKeys(b.services), hint),
			Evidence: ev,
			Subject:  finding.Subject{Refs: []finding.Ref{ref}},
		})
		if len(out) >= d.p.MaxFindings {
			break
		}
	}
	return out, nil
}

// ipvsReadSysctl reads <procRoot>/sys/<name> trimmed, or "" when it
// cannot be read (the value is evidence only).
func ipvsReadSysctl(procRoot, name string) string {
	b, err := boundedfile.Read(filepath.Join(ipvsProcRootOr(procRoot), "sys", filepath.FromSlash(name)), 4096)
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(b))
}

func ipvsSortedAddrs(m map[netip.Addr]bool) []string {
	as := make([]netip.Addr, 0, len(m))
	for a := range m {
		as = append(as, a)
	}
	sort.Slice(as, func(i, j int) bool { return as[i].Less(as[j]) })
	out := make([]string, len(as))
	for i, a := range as {
		out[i] = a.String()
	}
	return out
}

func ipvsSortedKeys(m map[string]bool) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

func ipvsJoinKeys(m map[string]bool) string {
	s := ""
	for i, k := range ipvsSortedKeys(m) {
		if i > 0 {
			s += ", "
		}
		s += k
	}
	return s
}
