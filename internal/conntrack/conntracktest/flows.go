package conntracktest

import (
	"net/netip"

	"github.com/remediate-dev/remediate/internal/conntrack"
	"github.com/remediate-dev/remediate/internal/node"
)

// Spec describes the flows Flows makes. Addresses are "addr:port" (IPv6 in
// brackets); they must parse.
type Spec struct {
	Proto uint8
	// Client is the first client; each further flow's client port is one
	// more.
	Client string
	// Dst is the original destination (a Service address, say).
	Dst string
	// Reply is the reply source: the backend that answered a DNATed flow.
	// Empty: Dst (not DNATed).
	Reply string
	// Status and TCPState as in conntrack.Flow.
	Status   uint32
	TCPState uint8
}

// Flows returns n flows as s says, for the fake's table or Create.
func Flows(n int, s Spec) []conntrack.Flow {
	c, dst := netip.MustParseAddrPort(s.Client), netip.MustParseAddrPort(s.Dst)
	reply := dst
	if s.Reply != "" {
		reply = netip.MustParseAddrPort(s.Reply)
	}
	out := make([]conntrack.Flow, 0, n)
	for i := 0; i < n; i++ {
		cl := netip.AddrPortFrom(c.Addr(), c.Port()+uint16(i))
		out = append(out, conntrack.Flow{Proto: s.Proto, OrigSrc: cl, OrigDst: dst, ReplySrc: reply, ReplyDst: cl, Status: s.Status, TCPState: s.TCPState})
	}
	return out
}

// Node returns a node whose conntrack adapter is f or, when f is nil, one
// on which conntrack is unavailable because nf_conntrack is not loaded.
func Node(f *conntrack.Fake) *node.Node {
	n := &node.Node{}
	if f != nil {
		n.Conntrack = f
	} else {
		n.Unavailable = map[string]string{"conntrack": "nf_conntrack is not loaded"}
	}
	return n
}
