package conntrack

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
)

// ctnetlink wire constants (include/uapi/linux/netfilter/nfnetlink*.h).
const (
	nlmsgHdrLen  = 16
	nfgenHdrLen  = 4
	nlaHdrLen    = 4
	nlaFNested   = 0x8000
	nlaTypeMask  = 0x3fff // strips NLA_F_NESTED and NLA_F_NET_BYTEORDER
	nlmsgNoop    = 0x1
	nlmsgError   = 0x2
	nlmsgDone    = 0x3
	nlmsgOverrun = 0x4

	nlmFRequest      = 0x1
	nlmFMulti        = 0x2
	nlmFAck          = 0x4
	nlmFDumpIntr     = 0x10
	nlmFDumpFiltered = 0x20
	nlmFDump         = 0x300 // NLM_F_ROOT|NLM_F_MATCH
	nlmFExcl         = 0x200
	nlmFCreate       = 0x400

	subsysCTNetlink = 1

	ctMsgNew         = 0
	ctMsgGet         = 1
	ctMsgDelete      = 2
	ctMsgGetStatsCPU = 4
	ctMsgGetStats    = 5

	ctaTupleOrig  = 1
	ctaTupleReply = 2
	ctaStatus     = 3
	ctaProtoinfo  = 4
	ctaTimeout    = 7
	ctaID         = 12
	ctaZone       = 18
	ctaFilter     = 25

	ctaTupleIP    = 1
	ctaTupleProto = 2

	ctaIPv4Src = 1
	ctaIPv4Dst = 2
	ctaIPv6Src = 3
	ctaIPv6Dst = 4

	ctaProtoNum     = 1
	ctaProtoSrcPort = 2
	ctaProtoDstPort = 3

	ctaProtoinfoTCP      = 1 // in CTA_PROTOINFO
	ctaProtoinfoTCPState = 1 // in CTA_PROTOINFO_TCP

	ctaFilterOrigFlags  = 1
	ctaFilterReplyFlags = 2

	filterFIPSrc        = 1 << 0
	filterFProtoNum     = 1 << 3
	filterFProtoSrcPort = 1 << 4

	// enum ctattr_stats_cpu
	ctaStatsFound         = 2
	ctaStatsInvalid       = 4
	ctaStatsInsert        = 8
	ctaStatsInsertFailed  = 9
	ctaStatsDrop          = 10
	ctaStatsEarlyDrop     = 11
	ctaStatsError         = 12
	ctaStatsSearchRestart = 13
	// enum ctattr_stats_global
	ctaStatsGlobalEntries    = 1
	ctaStatsGlobalMaxEntries = 2

	afInet  = 2
	afInet6 = 10
)

func msgType(m uint16) uint16 { return subsysCTNetlink<<8 | m }

// familyOf returns the nfgen family of an address.
func familyOf(a netip.Addr) uint8 {
	if a.Is4() {
		return afInet
	}
	return afInet6
}

// encoder appends netlink messages to a reusable buffer.
type encoder struct {
	b      []byte
	nested []int // offsets of open nested attributes
}

func (e *encoder) reset() { e.b = e.b[:0]; e.nested = e.nested[:0] }

// begin starts a message; end must follow.
func (e *encoder) begin(typ, flags uint16, seq, pid uint32, family uint8) int {
	off := len(e.b)
	e.b = binary.NativeEndian.AppendUint32(e.b, 0) // length, patched by end
	e.b = binary.NativeEndian.AppendUint16(e.b, typ)
	e.b = binary.NativeEndian.AppendUint16(e.b, flags)
	e.b = binary.NativeEndian.AppendUint32(e.b, seq)
	e.b = binary.NativeEndian.AppendUint32(e.b, pid)
	e.b = append(e.b, family, 0, 0, 0) // nfgenmsg: family, version 0, res_id 0
	return off
}

func (e *encoder) end(off int) {
	binary.NativeEndian.PutUint32(e.b[off:], uint32(len(e.b)-off))
}

func (e *encoder) attr(typ uint16, payload ...byte) {
	e.b = binary.NativeEndian.AppendUint16(e.b, uint16(nlaHdrLen+len(payload)))
	e.b = binary.NativeEndian.AppendUint16(e.b, typ)
	e.b = append(e.b, payload...)
	for len(e.b)%4 != 0 {
		e.b = append(e.b, 0)
	}
}

func (e *encoder) u8(typ uint16, v uint8) { e.attr(typ, v) }
func (e *encoder) be16(typ uint16, v uint16) {
	e.attr(typ, byte(v>>8), byte(v))
}
func (e *encoder) be32(typ uint16, v uint32) {
	e.attr(typ, byte(v>>24), byte(v>>16), byte(v>>8), byte(v))
}

func (e *encoder) open(typ uint16) {
	e.nested = append(e.nested, len(e.b))
	e.b = binary.NativeEndian.AppendUint16(e.b, 0)
	e.b = binary.NativeEndian.AppendUint16(e.b, typ|nlaFNested)
}

func (e *encoder) close() {
	off := e.nested[len(e.nested)-1]
	e.nested = e.nested[:len(e.nested)-1]
	binary.NativeEndian.PutUint16(e.b[off:], uint16(len(e.b)-off))
}

func (e *encoder) ip(src, dst netip.Addr) {
	e.open(ctaTupleIP)
	if src.IsValid() {
		if s := src; s.Is4() {
			a := s.As4()
			e.attr(ctaIPv4Src, a[:]...)
		} else {
			a := s.As16()
			e.attr(ctaIPv6Src, a[:]...)
		}
	}
	if dst.IsValid() {
		if d := dst; d.Is4() {
			a := d.As4()
			e.attr(ctaIPv4Dst, a[:]...)
		} else {
			a := d.As16()
			e.attr(ctaIPv6Dst, a[:]...)
		}
	}
	e.close()
}

// tuple encodes a full tuple (both addresses, protocol and ports).
func (e *encoder) tuple(typ uint16, proto uint8, src, dst netip.AddrPort) {
	e.open(typ)
	e.ip(src.Addr(), dst.Addr())
	e.open(ctaTupleProto)
	e.u8(ctaProtoNum, proto)
	e.be16(ctaProtoSrcPort, src.Port())
	e.be16(ctaProtoDstPort, dst.Port())
	e.close()
	e.close()
}

// dumpRequest encodes a dump of the backend's address family. With
// kernelFilter the kernel only returns entries whose reply tuple has
// protocol UDP, source b.IP (IPv4 only, see below) and (if set) source port
// b.Port; without, every entry of the family (the caller filters).
func (e *encoder) dumpRequest(seq, pid uint32, b Backend, kernelFilter bool) {
	ip := b.IP.Unmap()
	fam := familyOf(ip)
	off := e.begin(msgType(ctMsgGet), nlmFRequest|nlmFDump, seq, pid, fam)
	if !kernelFilter {
		e.end(off)
		return
	}
	e.open(ctaTupleReply)
	flags := uint32(filterFProtoNum)
	if fam == afInet {
		// Linux (through 6.18 at least) inverts the IPv6 address
		// comparison of CTA_FILTER (ctnetlink_filter_match_tuple tests
		// !ipv6_addr_cmp(), i.e. "equal" means "skip"): an IPv6 address
		// filter returns every entry EXCEPT the wanted ones. IPv6 dumps
		// therefore filter by family, protocol and port in the kernel and
		// compare the address in user space.
		e.ip(ip, netip.Addr{})
		flags |= filterFIPSrc
	}
	e.open(ctaTupleProto)
	e.u8(ctaProtoNum, ProtoUDP)
	if b.Port != 0 {
		e.be16(ctaProtoSrcPort, b.Port)
		flags |= filterFProtoSrcPort
	}
	e.close()
	e.close()
	e.open(ctaFilter)
	e.attr(ctaFilterReplyFlags, binary.NativeEndian.AppendUint32(nil, flags)...)
	e.close()
	e.end(off)
}

// dumpProtoRequest encodes a dump of one address family. With
// kernelFilter the kernel only returns the entries whose original tuple
// has protocol proto (CTA_FILTER_ORIG_FLAGS, no address: unaffected by the
// IPv6 address inversion); without, every entry of the family.
func (e *encoder) dumpProtoRequest(seq, pid uint32, fam, proto uint8, kernelFilter bool) {
	off := e.begin(msgType(ctMsgGet), nlmFRequest|nlmFDump, seq, pid, fam)
	if kernelFilter {
		e.open(ctaTupleOrig)
		e.open(ctaTupleProto)
		e.u8(ctaProtoNum, proto)
		e.close()
		e.close()
		e.open(ctaFilter)
		e.attr(ctaFilterOrigFlags, binary.NativeEndian.AppendUint32(nil, uint32(filterFProtoNum))...)
		e.close()
	}
	e.end(off)
}

// dumpAllRequest encodes an unfiltered dump of every address family
// (AF_UNSPEC: the kernel walks the whole table of the namespace once).
func (e *encoder) dumpAllRequest(seq, pid uint32) {
	off := e.begin(msgType(ctMsgGet), nlmFRequest|nlmFDump, seq, pid, 0)
	e.end(off)
}

// deleteRequest encodes the deletion of exactly the entry f (by original
// tuple, zone and CTA_ID). Without ack the kernel only answers on error.
func (e *encoder) deleteRequest(seq, pid uint32, f *Flow, ack bool) {
	flags := uint16(nlmFRequest)
	if ack {
		flags |= nlmFAck
	}
	off := e.begin(msgType(ctMsgDelete), flags, seq, pid, familyOf(f.OrigSrc.Addr()))
	e.tuple(ctaTupleOrig, f.Proto, f.OrigSrc, f.OrigDst)
	if f.Zone != 0 {
		e.be16(ctaZone, f.Zone)
	}
	if f.ID != 0 {
		e.be32(ctaID, f.ID)
	}
	e.end(off)
}

// createRequest encodes the creation of an entry with the given tuples and
// timeout (seconds, must be > 0), its status bits and TCP state when set
// (the kernel only lets ctnetlink set SEEN_REPLY and ASSURED, never clear
// them). Used by tests to build large tables fast.
func (e *encoder) createRequest(seq, pid uint32, f *Flow, timeout uint32) {
	off := e.begin(msgType(ctMsgNew), nlmFRequest|nlmFAck|nlmFCreate|nlmFExcl, seq, pid, familyOf(f.OrigSrc.Addr()))
	e.tuple(ctaTupleOrig, f.Proto, f.OrigSrc, f.OrigDst)
	e.tuple(ctaTupleReply, f.Proto, f.ReplySrc, f.ReplyDst)
	e.be32(ctaTimeout, timeout)
	if f.Status != 0 {
		e.be32(ctaStatus, f.Status)
	}
	if f.Proto == ProtoTCP && f.TCPState != 0 {
		e.open(ctaProtoinfo)
		e.open(ctaProtoinfoTCP)
		e.u8(ctaProtoinfoTCPState, f.TCPState)
		e.close()
		e.close()
	}
	if f.Zone != 0 {
		e.be16(ctaZone, f.Zone)
	}
	e.end(off)
}

// statsRequest encodes a stats query (per-CPU dump or global).
func (e *encoder) statsRequest(seq, pid uint32, msg uint16) {
	off := e.begin(msgType(msg), nlmFRequest|nlmFDump, seq, pid, 0)
	e.end(off)
}

// kernelFilterWorks reports whether a kernel release (uname -r) has a
// working reply-tuple CTA_FILTER: added in 5.8, but until "netfilter:
// ctnetlink: fix filtering with CTA_TUPLE_REPLY" (5.16, backported to some
// 5.10/5.15 stable releases) the reply tuple was parsed with the original
// tuple's flags and matched nothing. Older kernels get an unfiltered
// (still streamed) dump.
func kernelFilterWorks(release string) bool {
	var major, minor int
	if _, err := fmt.Sscanf(release, "%d.%d", &major, &minor); err != nil {
		return false
	}
	return major > 5 || major == 5 && minor >= 16
}

// Errors from the decoder.
var (
	errShort    = errors.New("conntrack: truncated netlink data")
	errBadAttr  = errors.New("conntrack: malformed netlink attribute")
	errNoTuples = errors.New("conntrack: entry without original and reply tuples")
)

// nlHeader is a decoded nlmsghdr.
type nlHeader struct {
	Len   uint32
	Type  uint16
	Flags uint16
	Seq   uint32
	PID   uint32
}

// nextMessage splits the first netlink message off b. It returns the header,
// the payload (after the nlmsghdr) and the rest of b.
func nextMessage(b []byte) (h nlHeader, payload, rest []byte, err error) {
	if len(b) < nlmsgHdrLen {
		return h, nil, nil, errShort
	}
	h.Len = binary.NativeEndian.Uint32(b[0:4])
	h.Type = binary.NativeEndian.Uint16(b[4:6])
	h.Flags = binary.NativeEndian.Uint16(b[6:8])
	h.Seq = binary.NativeEndian.Uint32(b[8:12])
	h.PID = binary.NativeEndian.Uint32(b[12:16])
	if h.Len < nlmsgHdrLen || int(h.Len) > len(b) {
		return h, nil, nil, fmt.Errorf("%w: message length %d, %d bytes available", errShort, h.Len, len(b))
	}
	payload = b[nlmsgHdrLen:h.Len]
	next := align4(int(h.Len))
	if next > len(b) {
		next = len(b)
	}
	return h, payload, b[next:], nil
}

// errnoOf decodes the int32 error of an NLMSG_ERROR or NLMSG_DONE payload
// (negative errno, 0 = ack/success).
func errnoOf(payload []byte) (int32, error) {
	if len(payload) < 4 {
		return 0, errShort
	}
	return int32(binary.NativeEndian.Uint32(payload[:4])), nil
}

// errorSeq returns the sequence number of the request an NLMSG_ERROR
// answers (from the echoed request header).
func errorSeq(payload []byte) (uint32, bool) {
	if len(payload) < 4+nlmsgHdrLen {
		return 0, false
	}
	return binary.NativeEndian.Uint32(payload[4+8 : 4+12]), true
}

func align4(n int) int { return (n + 3) &^ 3 }

// attrs iterates over netlink attributes without allocating.
type attrs struct {
	b   []byte
	typ uint16
	val []byte
	err error
}

func (a *attrs) next() bool {
	if a.err != nil || len(a.b) == 0 {
		return false
	}
	if len(a.b) < nlaHdrLen {
		a.err = errBadAttr
		return false
	}
	l := int(binary.NativeEndian.Uint16(a.b[0:2]))
	if l < nlaHdrLen || l > len(a.b) {
		a.err = errBadAttr
		return false
	}
	a.typ = binary.NativeEndian.Uint16(a.b[2:4]) & nlaTypeMask
	a.val = a.b[nlaHdrLen:l]
	n := align4(l)
	if n > len(a.b) {
		n = len(a.b)
	}
	a.b = a.b[n:]
	return true
}

// decodeFlow decodes one ctnetlink entry message payload (nfgenmsg plus
// attributes) into f, without allocating. Only the fields of Flow are
// read; everything else is skipped.
func decodeFlow(payload []byte, f *Flow) error {
	*f = Flow{}
	if len(payload) < nfgenHdrLen {
		return errShort
	}
	var haveOrig, haveReply bool
	a := attrs{b: payload[nfgenHdrLen:]}
	for a.next() {
		switch a.typ {
		case ctaTupleOrig:
			var proto uint8
			var err error
			proto, f.OrigSrc, f.OrigDst, err = decodeTuple(a.val)
			if err != nil {
				return fmt.Errorf("original tuple: %w", err)
			}
			f.Proto = proto
			haveOrig = true
		case ctaTupleReply:
			var err error
			_, f.ReplySrc, f.ReplyDst, err = decodeTuple(a.val)
			if err != nil {
				return fmt.Errorf("reply tuple: %w", err)
			}
			haveReply = true
		case ctaID:
			if len(a.val) != 4 {
				return errBadAttr
			}
			f.ID = binary.BigEndian.Uint32(a.val)
		case ctaStatus:
			if len(a.val) != 4 {
				return errBadAttr
			}
			f.Status = binary.BigEndian.Uint32(a.val)
		case ctaProtoinfo:
			st, err := decodeTCPState(a.val)
			if err != nil {
				return fmt.Errorf("protocol info: %w", err)
			}
			f.TCPState = st
		case ctaZone:
			if len(a.val) != 2 {
				return errBadAttr
			}
			f.Zone = binary.BigEndian.Uint16(a.val)
		}
	}
	if a.err != nil {
		return a.err
	}
	if !haveOrig || !haveReply {
		return errNoTuples
	}
	return nil
}

// decodeTCPState reads CTA_PROTOINFO_TCP_STATE from a CTA_PROTOINFO
// payload; other protocols' info (SCTP, DCCP) is skipped (0).
func decodeTCPState(b []byte) (uint8, error) {
	a := attrs{b: b}
	for a.next() {
		if a.typ != ctaProtoinfoTCP {
			continue
		}
		in := attrs{b: a.val}
		for in.next() {
			if in.typ == ctaProtoinfoTCPState {
				if len(in.val) != 1 {
					return 0, errBadAttr
				}
				return in.val[0], nil
			}
		}
		if in.err != nil {
			return 0, in.err
		}
	}
	return 0, a.err
}

func decodeTuple(b []byte) (proto uint8, src, dst netip.AddrPort, err error) {
	var sip, dip netip.Addr
	var sport, dport uint16
	a := attrs{b: b}
	for a.next() {
		switch a.typ {
		case ctaTupleIP:
			in := attrs{b: a.val}
			for in.next() {
				switch in.typ {
				case ctaIPv4Src, ctaIPv4Dst:
					if len(in.val) != 4 {
						return 0, src, dst, errBadAttr
					}
					ip := netip.AddrFrom4([4]byte(in.val))
					if in.typ == ctaIPv4Src {
						sip = ip
					} else {
						dip = ip
					}
				case ctaIPv6Src, ctaIPv6Dst:
					if len(in.val) != 16 {
						return 0, src, dst, errBadAttr
					}
					ip := netip.AddrFrom16([16]byte(in.val))
					if in.typ == ctaIPv6Src {
						sip = ip
					} else {
						dip = ip
					}
				}
			}
			if in.err != nil {
				return 0, src, dst, in.err
			}
		case ctaTupleProto:
			in := attrs{b: a.val}
			for in.next() {
				switch in.typ {
				case ctaProtoNum:
					if len(in.val) != 1 {
						return 0, src, dst, errBadAttr
					}
					proto = in.val[0]
				case ctaProtoSrcPort, ctaProtoDstPort:
					if len(in.val) != 2 {
						return 0, src, dst, errBadAttr
					}
					p := binary.BigEndian.Uint16(in.val)
					if in.typ == ctaProtoSrcPort {
						sport = p
					} else {
						dport = p
					}
				}
			}
			if in.err != nil {
				return 0, src, dst, in.err
			}
		}
	}
	if a.err != nil {
		return 0, src, dst, a.err
	}
	if !sip.IsValid() || !dip.IsValid() {
		return 0, src, dst, fmt.Errorf("%w: tuple without addresses", errBadAttr)
	}
	return proto, netip.AddrPortFrom(sip, sport), netip.AddrPortFrom(dip, dport), nil
}

// decodeStatsCPU adds one per-CPU stats message payload into s.
func decodeStatsCPU(payload []byte, s *Stats) error {
	if len(payload) < nfgenHdrLen {
		return errShort
	}
	a := attrs{b: payload[nfgenHdrLen:]}
	for a.next() {
		if len(a.val) != 4 {
			continue // unknown or future attribute of another size
		}
		v := uint64(binary.BigEndian.Uint32(a.val))
		switch a.typ {
		case ctaStatsFound:
			s.Found += v
		case ctaStatsInvalid:
			s.Invalid += v
		case ctaStatsInsert:
			s.Insert += v
		case ctaStatsInsertFailed:
			s.InsertFailed += v
		case ctaStatsDrop:
			s.Drop += v
		case ctaStatsEarlyDrop:
			s.EarlyDrop += v
		case ctaStatsError:
			s.Error += v
		case ctaStatsSearchRestart:
			s.SearchRestart += v
		}
	}
	if a.err != nil {
		return a.err
	}
	s.CPUs++
	return nil
}

// decodeStatsGlobal decodes the global stats message payload.
func decodeStatsGlobal(payload []byte) (u Usage, err error) {
	if len(payload) < nfgenHdrLen {
		return u, errShort
	}
	var haveCount bool
	a := attrs{b: payload[nfgenHdrLen:]}
	for a.next() {
		if len(a.val) != 4 {
			continue
		}
		switch a.typ {
		case ctaStatsGlobalEntries:
			u.Count = uint64(binary.BigEndian.Uint32(a.val))
			haveCount = true
		case ctaStatsGlobalMaxEntries:
			u.Max = uint64(binary.BigEndian.Uint32(a.val))
		}
	}
	if a.err != nil {
		return u, a.err
	}
	if !haveCount {
		return u, fmt.Errorf("%w: global stats without entry count", errBadAttr)
	}
	return u, nil
}
