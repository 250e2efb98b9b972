//go:build linux

package nftables

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"sort"
	"strconv"
	"strings"

	"github.com/cespare/xxhash/v2"
	"github.com/google/nftables/expr"
	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"
)

// Decoding of nf_tables netlink answers into the model. Everything here
// reads data from the kernel: malformed input is an error or an odd
// rendering, never a panic (FuzzDecodeNetlink).

// familyName is the family of an NFPROTO_ number.
func familyName(n byte) Family {
	switch n {
	case unix.NFPROTO_IPV4:
		return FamilyIP
	case unix.NFPROTO_IPV6:
		return FamilyIP6
	case unix.NFPROTO_INET:
		return FamilyInet
	case unix.NFPROTO_ARP:
		return FamilyARP
	case unix.NFPROTO_BRIDGE:
		return FamilyBridge
	case unix.NFPROTO_NETDEV:
		return FamilyNetdev
	}
	return Family(strconv.Itoa(int(n)))
}

// udataString returns the string of TLV type typ in nftnl user data (one
// byte type, one byte length, value; comments are NUL-terminated).
func udataString(b []byte, typ byte) (string, bool) {
	for len(b) >= 2 {
		t, l := b[0], int(b[1])
		if 2+l > len(b) {
			return "", false
		}
		if t == typ {
			return strings.TrimRight(string(b[2:2+l]), "\x00"), true
		}
		b = b[2+l:]
	}
	return "", false
}

func udataUint32(b []byte, typ byte) (uint32, bool) {
	for len(b) >= 2 {
		t, l := b[0], int(b[1])
		if 2+l > len(b) {
			return 0, false
		}
		if t == typ && l == 4 {
			return binary.NativeEndian.Uint32(b[2:6]), true
		}
		b = b[2+l:]
	}
	return 0, false
}

func decodeTable(fam byte, ad *netlink.AttributeDecoder) (*Table, error) {
	t := &Table{Family: familyName(fam), chains: map[string]*Chain{}, sets: map[string]*Set{}}
	for ad.Next() {
		switch ad.Type() {
		case unix.NFTA_TABLE_NAME:
			t.Name = ad.String()
		case attrTableHandle:
			t.Handle = ad.Uint64()
		case unix.NFTA_TABLE_FLAGS:
			f := ad.Uint32()
			for _, fl := range []struct {
				bit  uint32
				name string
			}{{1, "dormant"}, {2, "owner"}, {4, "persist"}} {
				if f&fl.bit != 0 {
					t.Flags = append(t.Flags, fl.name)
				}
			}
		case attrTableUserdata:
			t.Comment, _ = udataString(ad.Bytes(), 0)
		}
	}
	if err := ad.Err(); err != nil {
		return nil, err
	}
	if t.Name == "" {
		return nil, errors.New("table without name")
	}
	return t, nil
}

// hookName names hook number n of a family as nft does.
func hookName(f Family, n uint32) string {
	var names []string
	switch f {
	case FamilyNetdev:
		names = []string{"ingress", "egress"}
	case FamilyARP:
		names = []string{"input", "output", "forward"}
	default:
		names = []string{"prerouting", "input", "forward", "output", "postrouting", "ingress"}
	}
	if int(n) < len(names) {
		return names[n]
	}
	return strconv.Itoa(int(n))
}

func decodeChain(f Family, ad *netlink.AttributeDecoder) (*Chain, string, error) {
	c := &Chain{Family: f}
	var h *Hook
	policy := ""
	for ad.Next() {
		switch ad.Type() {
		case unix.NFTA_CHAIN_TABLE:
			c.Table = ad.String()
		case unix.NFTA_CHAIN_NAME:
			c.Name = ad.String()
		case unix.NFTA_CHAIN_HANDLE:
			c.Handle = ad.Uint64()
		case unix.NFTA_CHAIN_TYPE:
			if h == nil {
				h = &Hook{}
			}
			h.Type = ad.String()
		case unix.NFTA_CHAIN_POLICY:
			if ad.Uint32() == 0 {
				policy = "drop"
			} else {
				policy = "accept"
			}
		case unix.NFTA_CHAIN_HOOK:
			if h == nil {
				h = &Hook{}
			}
			hook := h
			ad.Nested(func(nd *netlink.AttributeDecoder) error {
				var dev string
				var devs []string
				for nd.Next() {
					switch nd.Type() {
					case unix.NFTA_HOOK_HOOKNUM:
						hook.Hook = hookName(f, nd.Uint32())
					case unix.NFTA_HOOK_PRIORITY:
						hook.Priority = int(int32(nd.Uint32()))
					case unix.NFTA_HOOK_DEV:
						dev = nd.String()
					case attrHookDevs:
						nd.Nested(func(dd *netlink.AttributeDecoder) error {
							for dd.Next() {
								devs = append(devs, dd.String())
							}
							return nil
						})
					}
				}
				// The kernel sends a single device both ways.
				if len(devs) == 0 && dev != "" {
					devs = []string{dev}
				}
				hook.Device = strings.Join(devs, ",")
				return nil
			})
		case attrChainUserdata:
			c.Comment, _ = udataString(ad.Bytes(), 0)
		}
	}
	if err := ad.Err(); err != nil {
		return nil, "", err
	}
	if c.Name == "" {
		return nil, "", fmt.Errorf("chain without name in table %s %s", f, c.Table)
	}
	if h != nil && h.Hook != "" {
		h.Policy = policy
		if h.Policy == "" {
			h.Policy = "accept"
		}
		c.Hook = h
	}
	return c, c.Table, nil
}

// nft's datatype numbers and names (src/datatype.h), and their sizes in
// bytes when fixed.
var datatypes = map[uint32]struct {
	name string
	size int
}{
	1: {"verdict", 4}, 2: {"nf_proto", 1}, 3: {"bitmask", 0}, 4: {"integer", 0}, 5: {"string", 0},
	6: {"ll_addr", 0}, 7: {"ipv4_addr", 4}, 8: {"ipv6_addr", 16}, 9: {"ether_addr", 6}, 10: {"ether_type", 2},
	11: {"arp_op", 2}, 12: {"inet_proto", 1}, 13: {"inet_service", 2}, 14: {"icmp_type", 1}, 15: {"tcp_flag", 1},
	17: {"mh_type", 1}, 18: {"time", 8}, 19: {"mark", 4}, 20: {"iface_index", 4}, 21: {"iface_type", 2},
	22: {"realm", 4}, 23: {"classid", 4}, 24: {"uid", 4}, 25: {"gid", 4}, 26: {"ct_state", 4},
	27: {"ct_dir", 1}, 28: {"ct_status", 4}, 29: {"icmpv6_type", 1}, 30: {"pkt_type", 1}, 31: {"icmp_code", 1},
	32: {"icmpv6_code", 1}, 33: {"icmpx_code", 1}, 34: {"devgroup", 4}, 35: {"dscp", 1}, 36: {"ecn", 1},
	37: {"fib_addrtype", 4}, 38: {"boolean", 1}, 40: {"ifname", 16}, 41: {"igmp_type", 1}, 45: {"cgroupsv2", 8},
}

const (
	typeBits        = 6
	dataTypeVerdict = 0xffffff00
	setAnonymous    = 0x1
	setConstant     = 0x2
	setInterval     = 0x4
	setMap          = 0x8
	setTimeout      = 0x10
	setEval         = 0x20
	udataSetKeyBO   = 0
	udataSetComment = 7
	byteorderHost   = 1
	elemIntervalEnd = 0x1
)

func typeName(id uint32) string {
	if d, ok := datatypes[id]; ok {
		return d.name
	}
	return "type" + strconv.Itoa(int(id))
}

// setMeta is what element decoding needs to know about its set; kept in
// Set (unexported) while listing.
type setMeta struct {
	keyTypes  []uint32
	keyLens   []int
	keyLen    int
	dataType  uint32
	hostKey   bool
	interval  bool
	constant  bool
	intervals []intervalElem
	// raw are the keys of Elements as read, for sorting.
	raw [][]byte
}

// hostOrder reports whether nft keeps values of datatype t in host byte
// order.
func hostOrder(t uint32) bool {
	switch t {
	case 19, 26, 28, 37, 24, 25, 20, 34:
		return true
	}
	return false
}

// keyLess compares two keys as numbers, little-endian (le) or big-endian;
// a shorter key is the smaller.
func keyLess(a, b []byte, le bool) bool {
	if len(a) != len(b) {
		return len(a) < len(b)
	}
	if !le {
		return bytes.Compare(a, b) < 0
	}
	for i := len(a) - 1; i >= 0; i-- {
		if a[i] != b[i] {
			return a[i] < b[i]
		}
	}
	return false
}

type intervalElem struct {
	key []byte
	end bool
	el  Element
}

func decodeSet(f Family, ad *netlink.AttributeDecoder) (s *Set, table string, anonymous bool, err error) {
	s = &Set{Family: f, meta: &setMeta{}}
	var flags, keyType uint32
	var udata []byte
	for ad.Next() {
		switch ad.Type() {
		case unix.NFTA_SET_TABLE:
			s.Table = ad.String()
		case unix.NFTA_SET_NAME:
			s.Name = ad.String()
		case attrSetHandle:
			s.Handle = ad.Uint64()
		case unix.NFTA_SET_FLAGS:
			flags = ad.Uint32()
		case unix.NFTA_SET_KEY_TYPE:
			keyType = ad.Uint32()
		case unix.NFTA_SET_KEY_LEN:
			s.meta.keyLen = int(ad.Uint32())
		case unix.NFTA_SET_DATA_TYPE:
			s.meta.dataType = ad.Uint32()
		case unix.NFTA_SET_USERDATA:
			udata = ad.Bytes()
		case unix.NFTA_SET_DESC:
			ad.Nested(func(nd *netlink.AttributeDecoder) error {
				for nd.Next() {
					if nd.Type() != attrSetDescConcat {
						continue
					}
					nd.Nested(func(cd *netlink.AttributeDecoder) error {
						for cd.Next() {
							cd.Nested(func(fd *netlink.AttributeDecoder) error {
								for fd.Next() {
									if fd.Type() == attrSetFieldLen {
										s.meta.keyLens = append(s.meta.keyLens, int(fd.Uint32()))
									}
								}
								return nil
							})
						}
						return nil
					})
				}
				return nil
			})
		}
	}
	if err := ad.Err(); err != nil {
		return nil, "", false, err
	}
	if s.Name == "" {
		return nil, "", false, fmt.Errorf("set without name in table %s %s", f, s.Table)
	}
	// A concatenation's type packs one 6-bit type per component, the
	// first component highest.
	for t, n := keyType, 0; n < 8; n++ {
		s.meta.keyTypes = append([]uint32{t & (1<<typeBits - 1)}, s.meta.keyTypes...)
		t >>= typeBits
		if t == 0 {
			break
		}
	}
	for _, t := range s.meta.keyTypes {
		s.KeyType = append(s.KeyType, typeName(t))
	}
	s.IsMap = flags&setMap != 0
	if s.IsMap {
		if s.meta.dataType == dataTypeVerdict {
			s.ValueType = "verdict"
		} else {
			s.ValueType = typeName(s.meta.dataType)
		}
	}
	for _, fl := range []struct {
		bit  uint32
		name string
	}{{setConstant, "constant"}, {setInterval, "interval"}, {setTimeout, "timeout"}, {setEval, "dynamic"}} {
		if flags&fl.bit != 0 {
			s.Flags = append(s.Flags, fl.name)
		}
	}
	s.meta.interval = flags&setInterval != 0
	s.meta.constant = flags&setConstant != 0
	s.Comment, _ = udataString(udata, udataSetComment)
	if bo, ok := udataUint32(udata, udataSetKeyBO); ok && bo == byteorderHost {
		s.meta.hostKey = true
	}
	s.Elements = []Element{}
	return s, s.Table, flags&setAnonymous != 0, nil
}

// decodeElements appends the elements of one NEWSETELEM answer to s and
// returns how many it read.
func decodeElements(s *Set, ad *netlink.AttributeDecoder) (int, error) {
	n := 0
	for ad.Next() {
		if ad.Type() != unix.NFTA_SET_ELEM_LIST_ELEMENTS {
			continue
		}
		ad.Nested(func(ld *netlink.AttributeDecoder) error {
			for ld.Next() {
				ld.Nested(func(ed *netlink.AttributeDecoder) error {
					n++
					var key, keyEnd []byte
					var flags uint32
					var el Element
					for ed.Next() {
						switch ed.Type() {
						case unix.NFTA_SET_ELEM_KEY:
							key = dataValue(ed)
						case attrSetElemKeyEnd:
							keyEnd = dataValue(ed)
						case unix.NFTA_SET_ELEM_FLAGS:
							flags = ed.Uint32()
						case unix.NFTA_SET_ELEM_DATA:
							ed.Nested(func(dd *netlink.AttributeDecoder) error {
								for dd.Next() {
									switch dd.Type() {
									case unix.NFTA_DATA_VALUE:
										el.Value = renderData(dd.Bytes(), s.meta.dataType, false)
									case unix.NFTA_DATA_VERDICT:
										v := decodeVerdict(dd)
										el.Verdict = &v
									}
								}
								return nil
							})
						case unix.NFTA_SET_ELEM_USERDATA:
							el.Comment, _ = udataString(ed.Bytes(), 0)
						}
					}
					if s.meta.interval || keyEnd != nil {
						if keyEnd != nil {
							// A concatenation's range: start and end in one element.
							el.Key = renderKey(s, key)
							if end := renderKey(s, keyEnd); !equalStrings(end, el.Key) {
								for i := range el.Key {
									if i < len(end) && end[i] != el.Key[i] {
										el.Key[i] += "-" + end[i]
									}
								}
							}
							s.Elements = append(s.Elements, el)
							return nil
						}
						s.meta.intervals = append(s.meta.intervals, intervalElem{key: key, end: flags&elemIntervalEnd != 0, el: el})
						return nil
					}
					el.Key = renderKey(s, key)
					s.Elements = append(s.Elements, el)
					s.meta.raw = append(s.meta.raw, key)
					return nil
				})
			}
			return nil
		})
	}
	return n, ad.Err()
}

func equalStrings(a, b []string) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// dataValue reads a nested NFTA_DATA_VALUE.
func dataValue(ad *netlink.AttributeDecoder) []byte {
	var out []byte
	ad.Nested(func(nd *netlink.AttributeDecoder) error {
		for nd.Next() {
			if nd.Type() == unix.NFTA_DATA_VALUE {
				out = nd.Bytes()
			}
		}
		return nil
	})
	return out
}

// decodeVerdict reads NFTA_DATA_VERDICT's nested code and chain.
func decodeVerdict(ad *netlink.AttributeDecoder) Verdict {
	var code int32
	var chain string
	ad.Nested(func(nd *netlink.AttributeDecoder) error {
		for nd.Next() {
			switch nd.Type() {
			case unix.NFTA_VERDICT_CODE:
				code = int32(nd.Uint32())
			case unix.NFTA_VERDICT_CHAIN:
				chain = nd.String()
			}
		}
		return nil
	})
	return verdictFromCode(int64(code), chain)
}

func verdictFromCode(code int64, chain string) Verdict {
	switch code {
	case 0: // NF_DROP
		return Verdict{Kind: Drop}
	case 1: // NF_ACCEPT
		return Verdict{Kind: Accept}
	case 3: // NF_QUEUE
		return Verdict{Kind: Queue}
	case unix.NFT_CONTINUE:
		return Verdict{Kind: Continue}
	case unix.NFT_JUMP:
		return Verdict{Kind: Jump, Target: chain}
	case unix.NFT_GOTO:
		return Verdict{Kind: Goto, Target: chain}
	case unix.NFT_RETURN:
		return Verdict{Kind: Return}
	}
	return Verdict{Kind: VerdictKind("verdict" + strconv.FormatInt(code, 10))}
}

// finishElements pairs the start and end elements of an interval set into
// prefixes ("10.0.0.0/8") and ranges ("1-5"), as nft prints them.
func (s *Set) finishElements() {
	m := s.meta
	defer func() { s.meta = nil }()
	// nft lists elements sorted by their key's value: a single key of a
	// network-order type as a big-endian number, host-order types and
	// concatenations (the key data as a whole) as little-endian.
	if m != nil && len(m.raw) == len(s.Elements) && len(s.Elements) > 1 {
		le := len(m.keyTypes) > 1 || m.hostKey || (len(m.keyTypes) == 1 && hostOrder(m.keyTypes[0]))
		idx := make([]int, len(s.Elements))
		for i := range idx {
			idx[i] = i
		}
		sort.SliceStable(idx, func(a, b int) bool { return keyLess(m.raw[idx[a]], m.raw[idx[b]], le) })
		els := make([]Element, len(idx))
		for i, j := range idx {
			els[i] = s.Elements[j]
		}
		s.Elements = els
	}
	if m == nil || len(m.intervals) == 0 {
		return
	}
	// The kernel dumps an interval set highest first, each end before its
	// start; walk it lowest first.
	iv := m.intervals
	for i, j := 0, len(iv)-1; i < j; i, j = i+1, j-1 {
		iv[i], iv[j] = iv[j], iv[i]
	}
	for i := 0; i < len(iv); i++ {
		if iv[i].end {
			continue
		}
		el := iv[i].el
		el.Key = renderKey(s, iv[i].key)
		if i+1 < len(iv) && iv[i+1].end && len(el.Key) == 1 {
			el.Key[0] = renderInterval(s, iv[i].key, iv[i+1].key)
			i++
		} else if i+1 >= len(iv) && len(el.Key) == 1 && len(m.keyTypes) == 1 {
			// open-ended: up to the maximum value.
			end := make([]byte, len(iv[i].key))
			for k := range end {
				end[k] = 0xff
			}
			el.Key[0] = renderIntervalInclusive(s, iv[i].key, end)
		}
		s.Elements = append(s.Elements, el)
	}
	m.intervals = nil
}

// renderInterval renders [start, end) as a prefix when it is one, else as
// an inclusive range.
func renderInterval(s *Set, start, end []byte) string {
	last := append([]byte(nil), end...)
	for k := len(last) - 1; k >= 0; k-- {
		if last[k] > 0 {
			last[k]--
			break
		}
		last[k] = 0xff
	}
	return renderIntervalInclusive(s, start, last)
}

func renderIntervalInclusive(s *Set, start, last []byte) string {
	t := uint32(0)
	if len(s.meta.keyTypes) == 1 {
		t = s.meta.keyTypes[0]
	}
	if len(start) == len(last) && (t == 7 || t == 8) {
		// A prefix: start and last differ in trailing bits only, start's
		// are all 0, last's all 1.
		bits := len(start) * 8
		plen := 0
		for plen < bits && bitAt(start, plen) == bitAt(last, plen) {
			plen++
		}
		ok := true
		for b := plen; b < bits; b++ {
			if bitAt(start, b) != 0 || bitAt(last, b) != 1 {
				ok = false
				break
			}
		}
		if ok {
			if plen == bits {
				return renderData(start, t, false)
			}
			return renderData(start, t, false) + "/" + strconv.Itoa(plen)
		}
	}
	a, b := renderData(start, t, s.meta.hostKey), renderData(last, t, s.meta.hostKey)
	if a == b {
		return a
	}
	return a + "-" + b
}

func bitAt(b []byte, i int) byte { return (b[i/8] >> (7 - i%8)) & 1 }

// renderKey splits an element key into its components and renders each by
// its type.
func renderKey(s *Set, key []byte) []string {
	m := s.meta
	if len(m.keyTypes) <= 1 {
		t := uint32(0)
		if len(m.keyTypes) == 1 {
			t = m.keyTypes[0]
		}
		return []string{renderData(key, t, m.hostKey)}
	}
	out := make([]string, 0, len(m.keyTypes))
	off := 0
	for i, t := range m.keyTypes {
		l := 0
		if i < len(m.keyLens) {
			l = m.keyLens[i]
		} else if d, ok := datatypes[t]; ok {
			l = d.size
		}
		if l <= 0 || off+l > len(key) {
			out = append(out, renderData(key[min(off, len(key)):], 0, false))
			return out
		}
		out = append(out, renderData(key[off:off+l], t, false))
		off += (l + 3) &^ 3
	}
	return out
}

// protoNames are nft's names of inet_proto values.
var protoNames = map[byte]string{1: "icmp", 2: "igmp", 6: "tcp", 17: "udp", 33: "dccp", 41: "ipv6", 47: "gre", 50: "esp", 51: "ah", 58: "ipv6-icmp", 132: "sctp", 136: "udplite"}

// renderData renders a value of datatype t as nft -j does (numbers in
// decimal, addresses as text, protocol names).
func renderData(b []byte, t uint32, host bool) string {
	switch t {
	case 7:
		if len(b) == 4 {
			return net.IP(b).String()
		}
	case 8:
		if len(b) == 16 {
			return net.IP(b).String()
		}
	case 12:
		if len(b) >= 1 {
			if n, ok := protoNames[b[0]]; ok {
				return n
			}
			return strconv.Itoa(int(b[0]))
		}
	case 13:
		if len(b) == 2 {
			return strconv.Itoa(int(binary.BigEndian.Uint16(b)))
		}
	case 40, 5:
		return strings.TrimRight(string(b), "\x00")
	case 37:
		if len(b) == 4 {
			names := []string{"unspec", "unicast", "local", "broadcast", "anycast", "multicast", "blackhole", "unreachable", "prohibit"}
			if v := binary.NativeEndian.Uint32(b); int(v) < len(names) {
				return names[v]
			}
		}
		host = true
	case 19, 26, 28, 24, 25, 20, 34:
		host = true
	case 2:
		if len(b) == 1 {
			switch b[0] {
			case unix.NFPROTO_IPV4:
				return "ipv4"
			case unix.NFPROTO_IPV6:
				return "ipv6"
			}
		}
	case 9:
		if len(b) == 6 {
			return net.HardwareAddr(b).String()
		}
	case 10:
		if len(b) == 2 {
			if n, ok := map[uint16]string{0x0800: "ip", 0x0806: "arp", 0x86dd: "ip6", 0x8100: "8021q", 0x88a8: "8021ad"}[binary.BigEndian.Uint16(b)]; ok {
				return n
			}
		}
	case 21:
		if len(b) == 2 && binary.NativeEndian.Uint16(b) == 1 {
			return "ether"
		}
		host = true
	}
	return renderInt(b, host)
}

// renderInt renders up to 8 bytes as a decimal number (host or network
// byte order), longer values in hex.
func renderInt(b []byte, host bool) string {
	if len(b) == 0 || len(b) > 8 {
		return fmt.Sprintf("0x%x", b)
	}
	var v uint64
	if host {
		for i := len(b) - 1; i >= 0; i-- {
			v = v<<8 | uint64(b[i])
		}
	} else {
		for _, c := range b {
			v = v<<8 | uint64(c)
		}
	}
	return strconv.FormatUint(v, 10)
}

// exprOf returns a zero expression of the library's type for name, nil for
// an expression it does not model.
func exprOf(name string) expr.Any {
	switch name {
	case "ct":
		return &expr.Ct{}
	case "range":
		return &expr.Range{}
	case "meta":
		return &expr.Meta{}
	case "cmp":
		return &expr.Cmp{}
	case "counter":
		return &expr.Counter{}
	case "objref":
		return &expr.Objref{}
	case "payload":
		return &expr.Payload{}
	case "lookup":
		return &expr.Lookup{}
	case "immediate":
		return &expr.Immediate{}
	case "bitwise":
		return &expr.Bitwise{}
	case "redir":
		return &expr.Redir{}
	case "nat":
		return &expr.NAT{}
	case "limit":
		return &expr.Limit{}
	case "quota":
		return &expr.Quota{}
	case "dynset":
		return &expr.Dynset{}
	case "log":
		return &expr.Log{}
	case "reject":
		return &expr.Reject{}
	case "masq":
		return &expr.Masq{}
	case "fib":
		return &expr.Fib{}
	case "numgen":
		return &expr.Numgen{}
	}
	return nil
}

// opaque is an expression the library or this package does not decode:
// only its name is known.
type opaque struct{ name string }

// decodeExprs decodes NFTA_RULE_EXPRESSIONS: a list of {name, data}.
func decodeExprs(fam byte, b []byte) (out []any, err error) {
	ad, err := netlink.NewAttributeDecoder(b)
	if err != nil {
		return nil, err
	}
	ad.ByteOrder = binary.BigEndian
	for ad.Next() {
		ad.Nested(func(ed *netlink.AttributeDecoder) error {
			var name string
			var data []byte
			for ed.Next() {
				switch ed.Type() {
				case unix.NFTA_EXPR_NAME:
					name = ed.String()
				case unix.NFTA_EXPR_DATA:
					data = ed.Bytes()
				}
			}
			out = append(out, decodeExpr(fam, name, data))
			return nil
		})
	}
	return out, ad.Err()
}

// decodeExpr decodes one expression with the library, recovering from a
// panic in it (malformed data) as an opaque expression.
func decodeExpr(fam byte, name string, data []byte) (e any) {
	defer func() {
		if recover() != nil {
			e = opaque{name: name}
		}
	}()
	if name == "ct" {
		// The library's Ct ignores NFTA_CT_SREG ("ct mark set ..."):
		// read it here.
		return decodeCt(data)
	}
	x := exprOf(name)
	if x == nil {
		return opaque{name: name}
	}
	if err := expr.Unmarshal(fam, data, x); err != nil {
		return opaque{name: name}
	}
	// A verdict is an immediate writing to the verdict register.
	if imm, ok := x.(*expr.Immediate); ok && imm.Register == unix.NFT_REG_VERDICT && len(imm.Data) == 0 {
		v := &expr.Verdict{}
		if err := expr.Unmarshal(fam, data, v); err != nil {
			return opaque{name: name}
		}
		return v
	}
	return x
}

// decodeCt reads a ct expression: a load (dreg) or a set (sreg).
func decodeCt(data []byte) any {
	ad, err := netlink.NewAttributeDecoder(data)
	if err != nil {
		return opaque{name: "ct"}
	}
	ad.ByteOrder = binary.BigEndian
	e := &expr.Ct{}
	for ad.Next() {
		switch ad.Type() {
		case unix.NFTA_CT_KEY:
			e.Key = expr.CtKey(ad.Uint32())
		case unix.NFTA_CT_DREG:
			e.Register = ad.Uint32()
		case unix.NFTA_CT_SREG:
			e.Register, e.SourceRegister = ad.Uint32(), true
		case unix.NFTA_CT_DIRECTION:
			e.Direction = uint32(ad.Uint8())
		}
	}
	if ad.Err() != nil {
		return opaque{name: "ct"}
	}
	return e
}

// decodeRule decodes one NEWRULE answer; anon holds the table's anonymous
// sets (with their elements) by name. A rule the cache holds with the same
// expression bytes, comment and anonymous sets is returned from it (the
// kernel never reuses a rule handle within a table; a rule replaced in
// place has new bytes or new anonymous sets).
func decodeRule(f Family, ad *netlink.AttributeDecoder, anon map[string]*Set, cache *anonCache, seen map[ruleKey]bool) (chain, table string, r *Rule, err error) {
	var handle uint64
	var udata, exprBytes []byte
	for ad.Next() {
		switch ad.Type() {
		case unix.NFTA_RULE_TABLE:
			table = ad.String()
		case unix.NFTA_RULE_CHAIN:
			chain = ad.String()
		case unix.NFTA_RULE_HANDLE:
			handle = ad.Uint64()
		case unix.NFTA_RULE_USERDATA:
			udata = ad.Bytes()
		case unix.NFTA_RULE_EXPRESSIONS:
			exprBytes = ad.Bytes()
		}
	}
	if err := ad.Err(); err != nil {
		return "", "", nil, err
	}
	d := xxhash.New()
	_, _ = d.Write(exprBytes)
	_, _ = d.Write([]byte{0})
	_, _ = d.Write(udata)
	sum := d.Sum64()
	key := ruleKey{fam: f, table: table, chain: chain, handle: handle}
	if seen != nil {
		seen[key] = true
	}
	if e, ok := cache.rule(key); ok && e.sum == sum && e.refsMatch(anon) {
		return chain, table, e.rule, nil
	}
	r = &Rule{Handle: handle}
	r.Comment, _ = udataString(udata, 0)
	exprs, err := decodeExprs(familyNumber(f), exprBytes)
	if err != nil {
		return "", "", nil, fmt.Errorf("rule expressions: %w", err)
	}
	refs := delinearize(f, r, exprs, anon)
	cache.putRule(key, ruleEntry{sum: sum, rule: r, refs: refs})
	return chain, table, r, nil
}
