//go:build linux

package nftables

import (
	"strconv"
	"strings"

	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"
)

// delinearize turns a rule's kernel expressions (register loads, compares,
// lookups, immediates, NAT, verdicts) back into the statements nft -j
// prints, filling r the way parse.go's rule() does from the JSON: Matches,
// Verdict, VMap, NAT, Statements, Conditional and Text. It covers what
// kube-proxy, CNI portmap and common firewalls write (payload and meta
// matches, prefixes, ct state, fib, numgen vmaps, named and anonymous
// set lookups, dnat/snat/masquerade/redirect, mark mangling); anything
// else becomes a statement named after its expression that makes the
// rule Conditional (as parse.go treats unknown statements), rendered by
// name only.
//
// It returns the anonymous sets the rule reads, by name, with their
// handles.
func delinearize(f Family, r *Rule, exprs []any, anon map[string]*Set) map[string]uint64 {
	d := &delin{f: f, regs: map[uint32]*regVal{}, anon: anon}
	for _, e := range exprs {
		d.step(e)
	}
	r.Statements = make([]string, 0, len(d.stmts))
	texts := make([]string, 0, len(d.stmts))
	for _, s := range d.stmts {
		r.Statements = append(r.Statements, s.kind)
		texts = append(texts, s.text)
		switch {
		case s.match != nil:
			r.Matches = append(r.Matches, *s.match)
			r.Conditional = true
		case s.verdict != nil:
			r.Verdict = s.verdict
		case s.vmap != nil:
			r.VMap = s.vmap
			r.Conditional = true
		case s.nat != nil:
			r.NAT = s.nat
		case !unconditionalStatements[s.kind]:
			r.Conditional = true
		}
	}
	r.Text = strings.Join(texts, " ")
	return d.refs
}

// regVal is what a register holds: a loaded expression (rendered, with
// its datatype) or a constant.
type regVal struct {
	text  string
	typ   uint32
	host  bool
	konst []byte
	// prefix is the length of an address mask applied to it (ip daddr
	// 10.96.0.0/16), 0 for none.
	prefix int
	// pad is the full length of an address of which only the first
	// bytes are loaded (nft compiles ip daddr 10.96.0.0/16 to a 2-byte
	// compare); 0 otherwise.
	pad int
	// bitmask is the mask applied to a flags value (ct state new).
	bitmask []byte
	// l4 is a transport header field nft names after the protocol
	// matched before it ("th dport" after "meta l4proto tcp" is "tcp
	// dport").
	l4 bool
}

type stmt struct {
	kind, text string
	match      *Match
	verdict    *Verdict
	vmap       *VMap
	nat        *NAT
}

type delin struct {
	f     Family
	regs  map[uint32]*regVal
	loads []uint32 // 32-bit register of each load, in order
	stmts []stmt
	anon  map[string]*Set
	refs  map[string]uint64
}

// reg32 numbers a register in 32-bit units: NFT_REG_1..4 are 16 bytes,
// each the start of four NFT_REG32_ registers (8..23).
func reg32(r uint32) uint32 {
	if r >= 1 && r <= 4 {
		return 8 + (r-1)*4
	}
	return r
}

func (d *delin) load(r uint32, v *regVal) {
	r = reg32(r)
	d.regs[r] = v
	d.loads = append(d.loads, r)
}

func (d *delin) reg(r uint32) *regVal {
	if v := d.regs[reg32(r)]; v != nil {
		return v
	}
	return &regVal{text: "reg" + strconv.Itoa(int(r))}
}

// key renders what a lookup reads from register r on: one loaded
// expression, or the concatenation loaded into r and the registers after.
func (d *delin) key(r uint32) string {
	r = reg32(r)
	start := -1
	for i, l := range d.loads {
		if l == r {
			start = i
		}
	}
	if start < 0 {
		return d.reg(r).text
	}
	parts := []string{}
	for _, l := range d.loads[start:] {
		if l >= r {
			parts = append(parts, d.regs[l].text)
		}
	}
	return strings.Join(parts, " . ")
}

func (d *delin) add(s stmt) { d.stmts = append(d.stmts, s) }

func (d *delin) step(e any) {
	switch x := e.(type) {
	case *expr.Payload:
		if x.OperationType == expr.PayloadWrite {
			d.add(stmt{kind: "mangle", text: payloadName(d.f, x, "").text + " set " + d.reg(x.SourceRegister).text})
			return
		}
		d.load(x.DestRegister, d.payload(x))
	case *expr.Meta:
		name, typ := metaKey(x.Key)
		if x.SourceRegister {
			d.add(stmt{kind: "mangle", text: "meta " + name + " set " + d.value(x.Register, typ)})
			return
		}
		d.load(x.Register, &regVal{text: "meta " + name, typ: typ})
	case *expr.Ct:
		name, typ := ctKey(x.Key)
		if x.SourceRegister {
			d.add(stmt{kind: "mangle", text: "ct " + name + " set " + d.value(x.Register, typ)})
			return
		}
		d.load(x.Register, &regVal{text: "ct " + name, typ: typ})
	case *expr.Fib:
		var flags []string
		for _, fl := range []struct {
			on   bool
			name string
		}{{x.FlagSADDR, "saddr"}, {x.FlagDADDR, "daddr"}, {x.FlagMARK, "mark"}, {x.FlagIIF, "iif"}, {x.FlagOIF, "oif"}} {
			if fl.on {
				flags = append(flags, fl.name)
			}
		}
		res, typ := "oif", uint32(20)
		switch {
		case x.ResultOIFNAME:
			res, typ = "oifname", 40
		case x.ResultADDRTYPE:
			res, typ = "type", 37
		}
		d.load(x.Register, &regVal{text: "fib " + strings.Join(flags, " . ") + " " + res, typ: typ})
	case *expr.Numgen:
		mode := "inc"
		if x.Type == unix.NFT_NG_RANDOM {
			mode = "random"
		}
		s := "numgen " + mode + " mod " + strconv.FormatUint(uint64(x.Modulus), 10)
		if x.Offset != 0 {
			s += " offset " + strconv.FormatUint(uint64(x.Offset), 10)
		}
		d.load(x.Register, &regVal{text: s, typ: 4, host: true})
	case *expr.Immediate:
		d.regs[reg32(x.Register)] = &regVal{konst: x.Data, text: renderInt(x.Data, false)}
	case *expr.Bitwise:
		d.bitwise(x)
	case *expr.Cmp:
		d.cmp(x.Op, d.reg(x.Register), x.Data)
	case *expr.Range:
		v := d.reg(x.Register)
		op := "=="
		if x.Op == expr.CmpOpNeq {
			op = "!="
		}
		right := renderData(x.FromData, v.typ, v.host) + "-" + renderData(x.ToData, v.typ, v.host)
		d.addMatch(Match{Op: op, Left: v.text, Right: right})
	case *expr.Lookup:
		d.lookup(x)
	case *expr.Verdict:
		v := verdictFromCode(int64(x.Kind), x.Chain)
		d.add(stmt{kind: string(v.Kind), text: v.String(), verdict: &v})
	case *expr.Reject:
		v := Verdict{Kind: Reject}
		d.add(stmt{kind: "reject", text: "reject", verdict: &v})
	case *expr.NAT:
		n := &NAT{Kind: "dnat"}
		if x.Type == expr.NATTypeSourceNAT {
			n.Kind = "snat"
		}
		typ := uint32(7)
		if x.Family == unix.NFPROTO_IPV6 {
			typ = 8
		}
		if d.f == FamilyInet {
			n.Family = "ip"
			if typ == 8 {
				n.Family = "ip6"
			}
		}
		if x.RegAddrMin != 0 {
			n.Addr = d.value(x.RegAddrMin, typ)
			if x.RegAddrMax != 0 && x.RegAddrMax != x.RegAddrMin {
				n.Addr += "-" + d.value(x.RegAddrMax, typ)
			}
		}
		if x.RegProtoMin != 0 {
			n.Port = d.value(x.RegProtoMin, 13)
			if x.RegProtoMax != 0 && x.RegProtoMax != x.RegProtoMin {
				n.Port += "-" + d.value(x.RegProtoMax, 13)
			}
		}
		d.add(stmt{kind: n.Kind, text: natText(n), nat: n})
	case *expr.Masq:
		n := &NAT{Kind: "masquerade"}
		if x.ToPorts && x.RegProtoMin != 0 {
			n.Port = d.value(x.RegProtoMin, 13)
		}
		d.add(stmt{kind: n.Kind, text: natText(n), nat: n})
	case *expr.Redir:
		n := &NAT{Kind: "redirect"}
		if x.RegisterProtoMin != 0 {
			n.Port = d.value(x.RegisterProtoMin, 13)
		}
		d.add(stmt{kind: n.Kind, text: natText(n), nat: n})
	case *expr.Counter:
		d.add(stmt{kind: "counter", text: "counter"})
	case *expr.Log:
		text := "log"
		if len(x.Data) > 0 {
			text += " prefix " + strings.TrimRight(string(x.Data), "\x00")
		}
		d.add(stmt{kind: "log", text: text})
	case *expr.Limit:
		// nft -j's fields, sorted as parse.go renders them.
		units := map[expr.LimitTime]string{expr.LimitTimeSecond: "second", expr.LimitTimeMinute: "minute", expr.LimitTimeHour: "hour", expr.LimitTimeDay: "day", expr.LimitTimeWeek: "week"}
		text := "limit burst " + strconv.FormatUint(uint64(x.Burst), 10)
		if x.Over {
			text += " inv true"
		}
		text += " per " + units[x.Unit] + " rate " + strconv.FormatUint(x.Rate, 10)
		d.add(stmt{kind: "limit", text: text})
	case *expr.Quota:
		d.add(stmt{kind: "quota", text: "quota"})
	case *expr.Dynset:
		d.add(stmt{kind: "set", text: "set @" + x.SetName})
	case *expr.Objref:
		kind := "objref"
		switch x.Type {
		case 1:
			kind = "counter"
		case 2:
			kind = "quota"
		case 4:
			kind = "limit"
		}
		d.add(stmt{kind: kind, text: kind + " name " + x.Name})
	case opaque:
		switch x.name {
		case "notrack":
			d.add(stmt{kind: "notrack", text: "notrack"})
		case "match", "target":
			d.add(stmt{kind: "xt", text: "xt " + x.name})
		default:
			d.add(stmt{kind: x.name, text: x.name})
		}
	default:
		d.add(stmt{kind: "?", text: "?"})
	}
}

// value renders what register r holds as a value of type typ (a constant
// by its type, a loaded expression by its text).
func (d *delin) value(r, typ uint32) string {
	v := d.reg(r)
	if v.konst != nil {
		return renderData(v.konst, typ, false)
	}
	return v.text
}

func (d *delin) bitwise(x *expr.Bitwise) {
	src := d.reg(x.SourceRegister)
	v := *src
	allZero := func(b []byte) bool {
		for _, c := range b {
			if c != 0 {
				return false
			}
		}
		return true
	}
	allOnes := func(b []byte) bool {
		for _, c := range b {
			if c != 0xff {
				return false
			}
		}
		return true
	}
	inverse := len(x.Mask) == len(x.Xor)
	for i := range x.Mask {
		if inverse && x.Mask[i] != ^x.Xor[i] {
			inverse = false
		}
	}
	switch {
	case allZero(x.Xor) && (v.typ == 7 || v.typ == 8) && prefixLen(x.Mask) >= 0:
		v.prefix = prefixLen(x.Mask)
	case allZero(x.Xor) && (v.typ == 26 || v.typ == 28):
		v.bitmask = x.Mask
	case allZero(x.Xor):
		v.text += " & " + renderData(x.Mask, v.typ, v.host)
	case inverse:
		v.text += " | " + renderData(x.Xor, v.typ, v.host)
	case allOnes(x.Mask):
		v.text += " ^ " + renderData(x.Xor, v.typ, v.host)
	default:
		v.text = "(" + v.text + " & " + renderData(x.Mask, v.typ, v.host) + ") ^ " + renderData(x.Xor, v.typ, v.host)
	}
	r := reg32(x.DestRegister)
	d.regs[r] = &v
}

// prefixLen is the length of a network mask (1s then 0s), -1 otherwise.
func prefixLen(m []byte) int {
	n, zero := 0, false
	for i := 0; i < len(m)*8; i++ {
		if bitAt(m, i) == 1 {
			if zero {
				return -1
			}
			n++
		} else {
			zero = true
		}
	}
	return n
}

var cmpOps = map[expr.CmpOp]string{expr.CmpOpEq: "==", expr.CmpOpNeq: "!=", expr.CmpOpLt: "<", expr.CmpOpLte: "<=", expr.CmpOpGt: ">", expr.CmpOpGte: ">="}

func (d *delin) cmp(op expr.CmpOp, v *regVal, data []byte) {
	m := Match{Op: cmpOps[op], Left: v.text}
	if m.Op == "" {
		m.Op = "?"
	}
	switch {
	case v.prefix > 0 && v.pad > len(data):
		full := make([]byte, v.pad)
		copy(full, data)
		m.Right = renderData(full, v.typ, false) + "/" + strconv.Itoa(v.prefix)
	case v.prefix > 0:
		m.Right = renderData(data, v.typ, false) + "/" + strconv.Itoa(v.prefix)
	case v.bitmask != nil:
		names := flagNames(v.typ, v.bitmask)
		if op == expr.CmpOpNeq && isZero(data) {
			m.Op = "in"
		}
		if !isZero(data) {
			names = flagNames(v.typ, data)
		}
		if len(names) == 1 {
			m.Right = names[0]
		} else {
			m.Right = "{ " + strings.Join(names, ", ") + " }"
		}
	default:
		m.Right = renderData(data, v.typ, v.host)
	}
	// nft prints "th dport >= 1000 th dport <= 2000" as a range.
	if m.Op == "<=" && len(d.stmts) > 0 {
		if prev := d.stmts[len(d.stmts)-1].match; prev != nil && prev.Op == ">=" && prev.Left == m.Left {
			d.stmts = d.stmts[:len(d.stmts)-1]
			m = Match{Op: "==", Left: m.Left, Right: prev.Right + "-" + m.Right}
		}
	}
	d.addMatch(m)
}

// payload names a payload load, dropping the protocol match just before
// it that nft treats as its dependency: "meta l4proto tcp" before a
// transport field ("th dport" becomes "tcp dport") and, in inet, netdev
// and bridge tables, "meta nfproto ipv4" (or "meta protocol ip") before
// a network header field (which says ip or ip6).
func (d *delin) payload(p *expr.Payload) *regVal {
	var prev *Match
	if n := len(d.stmts); n > 0 {
		prev = d.stmts[n-1].match
	}
	switch p.Base {
	case expr.PayloadBaseTransportHeader:
		v := payloadName(d.f, p, "")
		if prev != nil && prev.Op == "==" && (prev.Left == "meta l4proto" || prev.Left == "ip protocol" || prev.Left == "ip6 nexthdr") {
			switch prev.Right {
			case "tcp", "udp", "sctp", "dccp", "udplite":
				if strings.HasPrefix(v.text, "th ") {
					v.text = prev.Right + strings.TrimPrefix(v.text, "th")
				}
				d.stmts = d.stmts[:len(d.stmts)-1]
			}
		}
		return v
	case expr.PayloadBaseNetworkHeader:
		l3 := ""
		if prev != nil && prev.Op == "==" && (prev.Left == "meta nfproto" || prev.Left == "meta protocol") {
			switch prev.Right {
			case "ipv4", "ip", "2048":
				l3 = "ip"
			case "ipv6", "ip6", "34525":
				l3 = "ip6"
			}
			if l3 != "" {
				d.stmts = d.stmts[:len(d.stmts)-1]
			}
		}
		return payloadName(d.f, p, l3)
	case expr.PayloadBaseLLHeader:
		if prev != nil && prev.Op == "==" && prev.Left == "meta iiftype" && prev.Right == "ether" {
			d.stmts = d.stmts[:len(d.stmts)-1]
		}
	}
	return payloadName(d.f, p, "")
}

func isZero(b []byte) bool {
	for _, c := range b {
		if c != 0 {
			return false
		}
	}
	return true
}

// flagNames names the bits of a ct state or ct status value (host byte
// order).
func flagNames(typ uint32, b []byte) []string {
	var v uint64
	for i := len(b) - 1; i >= 0; i-- {
		v = v<<8 | uint64(b[i])
	}
	var names []string
	var table []struct {
		bit  uint64
		name string
	}
	if typ == 26 {
		table = []struct {
			bit  uint64
			name string
		}{{1, "invalid"}, {2, "established"}, {4, "related"}, {8, "new"}, {64, "untracked"}}
	} else {
		table = []struct {
			bit  uint64
			name string
		}{{1, "expected"}, {2, "seen-reply"}, {4, "assured"}, {8, "confirmed"}, {16, "snat"}, {32, "dnat"}, {512, "dying"}}
	}
	for _, t := range table {
		if v&t.bit != 0 {
			names = append(names, t.name)
			v &^= t.bit
		}
	}
	if v != 0 || len(names) == 0 {
		names = append(names, strconv.FormatUint(v, 10))
	}
	return names
}

func (d *delin) addMatch(m Match) {
	text := m.Left + " " + m.Right
	if m.Op != "==" && m.Op != "in" {
		text = m.Left + " " + m.Op + " " + m.Right
	}
	d.add(stmt{kind: "match", text: text, match: &m})
}

func (d *delin) lookup(x *expr.Lookup) {
	key := d.key(x.SourceRegister)
	set := d.anon[x.SetName]
	right := "@" + x.SetName
	if set != nil {
		if d.refs == nil {
			d.refs = map[string]uint64{}
		}
		d.refs[x.SetName] = set.Handle
		parts := make([]string, 0, len(set.Elements))
		for _, e := range set.Elements {
			p := strings.Join(e.Key, " . ")
			if e.Verdict != nil {
				p += " : " + e.Verdict.String()
			} else if e.Value != "" {
				p += " : " + e.Value
			}
			parts = append(parts, p)
		}
		right = "{ " + strings.Join(parts, ", ") + " }"
	}
	switch {
	case x.IsDestRegSet && x.DestRegister == unix.NFT_REG_VERDICT:
		vm := &VMap{Key: key}
		if set != nil {
			vm.Elements = set.Elements // shared, read-only (as the whole Ruleset)
		} else {
			vm.Map = x.SetName
		}
		d.add(stmt{kind: "vmap", text: key + " vmap " + right, vmap: vm})
	case x.IsDestRegSet:
		d.regs[reg32(x.DestRegister)] = &regVal{text: key + " map " + right}
	default:
		op := "=="
		if x.Invert {
			op = "!="
		}
		d.addMatch(Match{Op: op, Left: key, Right: right})
	}
	d.loads = d.loads[:0]
}

// payloadName names a payload load as nft does ("ip daddr", "th dport"),
// with its datatype; unknown offsets render as "@nh,OFFSET,LEN" in bits.
func payloadName(f Family, p *expr.Payload, l3 string) *regVal {
	off, l := p.Offset, p.Len
	switch p.Base {
	case expr.PayloadBaseNetworkHeader:
		v6 := f == FamilyIP6 || (f != FamilyIP && l == 16)
		if l3 != "" {
			v6 = l3 == "ip6"
		}
		if !v6 {
			switch {
			case off == 12 && l == 4:
				return &regVal{text: "ip saddr", typ: 7}
			case off == 16 && l == 4:
				return &regVal{text: "ip daddr", typ: 7}
			case off == 9 && l == 1:
				return &regVal{text: "ip protocol", typ: 12}
			case (off == 12 || off == 16) && l < 4 && l > 0:
				return &regVal{text: map[uint32]string{12: "ip saddr", 16: "ip daddr"}[off], typ: 7, prefix: int(l * 8), pad: 4}
			}
		} else {
			switch {
			case off == 8 && l == 16:
				return &regVal{text: "ip6 saddr", typ: 8}
			case off == 24 && l == 16:
				return &regVal{text: "ip6 daddr", typ: 8}
			case off == 6 && l == 1:
				return &regVal{text: "ip6 nexthdr", typ: 12}
			case (off == 8 || off == 24) && l < 16 && l > 0:
				return &regVal{text: map[uint32]string{8: "ip6 saddr", 24: "ip6 daddr"}[off], typ: 8, prefix: int(l * 8), pad: 16}
			}
		}
		return &regVal{text: "@nh," + strconv.Itoa(int(off*8)) + "," + strconv.Itoa(int(l*8))}
	case expr.PayloadBaseTransportHeader:
		switch {
		case off == 0 && l == 2:
			return &regVal{text: "th sport", typ: 13, l4: true}
		case off == 2 && l == 2:
			return &regVal{text: "th dport", typ: 13, l4: true}
		}
		return &regVal{text: "@th," + strconv.Itoa(int(off*8)) + "," + strconv.Itoa(int(l*8))}
	}
	switch {
	case off == 12 && l == 2:
		return &regVal{text: "ether type", typ: 10}
	case off == 0 && l == 6:
		return &regVal{text: "ether daddr", typ: 9}
	case off == 6 && l == 6:
		return &regVal{text: "ether saddr", typ: 9}
	}
	return &regVal{text: "@ll," + strconv.Itoa(int(off*8)) + "," + strconv.Itoa(int(l*8))}
}

// metaKey names a meta key as nft does, with its datatype.
func metaKey(k expr.MetaKey) (string, uint32) {
	switch k {
	case expr.MetaKeyMARK:
		return "mark", 19
	case expr.MetaKeyL4PROTO:
		return "l4proto", 12
	case expr.MetaKeyNFPROTO:
		return "nfproto", 2
	case expr.MetaKeyIIFNAME:
		return "iifname", 40
	case expr.MetaKeyOIFNAME:
		return "oifname", 40
	case expr.MetaKeyIIF:
		return "iif", 20
	case expr.MetaKeyOIF:
		return "oif", 20
	case expr.MetaKeyPROTOCOL:
		return "protocol", 10
	case expr.MetaKeySKUID:
		return "skuid", 24
	case expr.MetaKeySKGID:
		return "skgid", 25
	case expr.MetaKeyPKTTYPE:
		return "pkttype", 30
	case expr.MetaKeyLEN:
		return "length", 4
	case expr.MetaKeyIIFTYPE:
		return "iiftype", 21
	case expr.MetaKeyOIFTYPE:
		return "oiftype", 21
	}
	return "key" + strconv.Itoa(int(k)), 4
}

// ctKey names a ct key as nft does, with its datatype.
func ctKey(k expr.CtKey) (string, uint32) {
	switch k {
	case expr.CtKeySTATE:
		return "state", 26
	case expr.CtKeySTATUS:
		return "status", 28
	case expr.CtKeyMARK:
		return "mark", 19
	case expr.CtKeyDIRECTION:
		return "direction", 27
	case expr.CtKeyZONE:
		return "zone", 4
	}
	return "key" + strconv.Itoa(int(k)), 4
}
