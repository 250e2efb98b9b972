//go:build linux

package nftables

import (
	"encoding/binary"
	"testing"

	"github.com/google/nftables/expr"
	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"
)

// TestDelinearizeOddRules: expressions in orders and shapes nft does not
// write (reads of registers nothing loaded, compares without a load,
// lookups of sets that are not there, NAT from empty registers, unknown
// and undecodable expressions, bad bitwise lengths, odd verdict codes) are
// rendered somehow and never panic; a statement this package does not
// model makes the rule Conditional, as parse.go does.
func TestDelinearizeOddRules(t *testing.T) {
	rules := [][]any{
		nil,
		{&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{1, 2}}},
		{&expr.Cmp{Op: 99, Register: 7, Data: nil}},
		{&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4, Mask: []byte{1}, Xor: []byte{1, 2, 3}}},
		{&expr.Meta{Key: expr.MetaKeyMARK, Register: 1}, &expr.Bitwise{SourceRegister: 1, DestRegister: 1, Mask: nil, Xor: nil}, &expr.Cmp{Register: 1}},
		{&expr.Lookup{SourceRegister: 9, SetName: "nope", IsDestRegSet: true, DestRegister: 0}},
		{&expr.Lookup{SourceRegister: 1, SetName: "__map0", IsDestRegSet: true, DestRegister: 1}, &expr.NAT{Type: expr.NATTypeDestNAT, RegAddrMin: 1, RegProtoMin: 2, RegAddrMax: 3, RegProtoMax: 4}},
		{&expr.NAT{Type: expr.NATTypeSourceNAT, Family: unix.NFPROTO_IPV6, RegAddrMin: 5}},
		{&expr.Immediate{Register: 1, Data: []byte{1}}, &expr.NAT{Type: expr.NATTypeDestNAT, Family: unix.NFPROTO_IPV4, RegAddrMin: 1}},
		{&expr.Verdict{Kind: 12345}},
		{&expr.Verdict{Kind: expr.VerdictJump}},
		{&expr.Payload{Base: 7, Offset: 1 << 30, Len: 0, DestRegister: 1}, &expr.Range{Register: 1, FromData: []byte{1, 2, 3, 4, 5, 6, 7, 8, 9}, ToData: nil}},
		{&expr.Payload{OperationType: expr.PayloadWrite, Base: expr.PayloadBaseNetworkHeader, Offset: 1, Len: 1, SourceRegister: 3}},
		{&expr.Ct{Key: 99, Register: 1}, &expr.Cmp{Register: 1, Data: []byte{0xff, 0xff, 0xff, 0xff}}},
		{&expr.Ct{Key: expr.CtKeySTATE, Register: 1}, &expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4, Mask: []byte{0xff, 0xff, 0xff, 0xff}, Xor: []byte{0, 0, 0, 0}}, &expr.Cmp{Op: expr.CmpOpNeq, Register: 1, Data: []byte{0, 0, 0, 0}}},
		{&expr.Fib{Register: 1}, &expr.Numgen{Register: 2, Modulus: 0}, &expr.Cmp{Register: 2, Data: []byte{0xff}}},
		{opaque{name: "tproxy"}, &expr.Verdict{Kind: expr.VerdictDrop}},
		{opaque{name: ""}},
		{struct{}{}},
		{&expr.Masq{ToPorts: true, RegProtoMin: 9}, &expr.Redir{RegisterProtoMin: 9}, &expr.Dynset{SetName: "x"}, &expr.Objref{Type: 9}, &expr.Quota{}, &expr.Limit{Unit: 99}},
	}
	anon := map[string]*Set{"__map0": {Name: "__map0", Elements: []Element{{Key: nil}}}}
	for _, exprs := range rules {
		for _, f := range []Family{FamilyIP, FamilyIP6, FamilyInet, FamilyNetdev, Family("7")} {
			delinearize(f, &Rule{}, exprs, anon)
		}
	}
	// An unknown statement before a drop: conditional, so not an
	// unconditional refusal.
	r := &Rule{}
	delinearize(FamilyIP, r, []any{opaque{name: "tproxy"}, &expr.Verdict{Kind: expr.VerdictDrop}}, nil)
	if !r.Conditional || r.UnconditionalRefusal() || r.Verdict == nil || r.Verdict.Kind != Drop {
		t.Errorf("unknown statement then drop: %+v", r)
	}
	// A bare drop is an unconditional refusal; a counter does not change that.
	r = &Rule{}
	delinearize(FamilyIP, r, []any{&expr.Counter{}, &expr.Verdict{Kind: expr.VerdictDrop}}, nil)
	if !r.UnconditionalRefusal() || r.Text != "counter drop" {
		t.Errorf("counter drop: %+v", r)
	}
	// Undecodable expression data is an opaque expression, not a panic.
	if e := decodeExpr(unix.NFPROTO_IPV4, "payload", []byte{0xff, 0xff, 0xff}); e == nil {
		t.Error("nil expression")
	}
	if _, ok := decodeExpr(unix.NFPROTO_IPV4, "no-such-expr", nil).(opaque); !ok {
		t.Error("an unknown expression is not opaque")
	}
}

// fuzzSeeds are netlink attribute streams of the shapes the decoders read.
func fuzzSeeds(t testing.TB) [][]byte {
	attrs := func(a ...netlink.Attribute) []byte {
		b, err := netlink.MarshalAttributes(a)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	be32 := func(v uint32) []byte { return binary.BigEndian.AppendUint32(nil, v) }
	var exprs []netlink.Attribute
	for _, e := range []expr.Any{
		&expr.Payload{Base: expr.PayloadBaseNetworkHeader, Offset: 16, Len: 4, DestRegister: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{10, 96, 0, 1}},
		&expr.Immediate{Register: 1, Data: []byte{10, 0, 0, 1}},
		&expr.NAT{Type: expr.NATTypeDestNAT, Family: unix.NFPROTO_IPV4, RegAddrMin: 1},
		&expr.Lookup{SourceRegister: 1, SetName: "__map0", IsDestRegSet: true},
		&expr.Verdict{Kind: expr.VerdictGoto, Chain: "x"},
	} {
		b, err := expr.Marshal(unix.NFPROTO_IPV4, e)
		if err != nil {
			t.Fatal(err)
		}
		exprs = append(exprs, netlink.Attribute{Type: unix.NLA_F_NESTED | unix.NFTA_LIST_ELEM, Data: b})
	}
	rule := attrs(netlink.Attribute{Type: unix.NFTA_RULE_TABLE, Data: cstr("t")}, netlink.Attribute{Type: unix.NFTA_RULE_CHAIN, Data: cstr("c")},
		netlink.Attribute{Type: unix.NFTA_RULE_HANDLE, Data: binary.BigEndian.AppendUint64(nil, 3)},
		netlink.Attribute{Type: unix.NLA_F_NESTED | unix.NFTA_RULE_EXPRESSIONS, Data: attrs(exprs...)},
		netlink.Attribute{Type: unix.NFTA_RULE_USERDATA, Data: []byte{0, 3, 'h', 'i', 0}})
	chain := attrs(netlink.Attribute{Type: unix.NFTA_CHAIN_TABLE, Data: cstr("t")}, netlink.Attribute{Type: unix.NFTA_CHAIN_NAME, Data: cstr("c")},
		netlink.Attribute{Type: unix.NLA_F_NESTED | unix.NFTA_CHAIN_HOOK, Data: attrs(netlink.Attribute{Type: unix.NFTA_HOOK_HOOKNUM, Data: be32(0)},
			netlink.Attribute{Type: unix.NFTA_HOOK_PRIORITY, Data: be32(0xffffff9c)})},
		netlink.Attribute{Type: unix.NFTA_CHAIN_TYPE, Data: cstr("nat")}, netlink.Attribute{Type: unix.NFTA_CHAIN_POLICY, Data: be32(1)})
	set := attrs(netlink.Attribute{Type: unix.NFTA_SET_TABLE, Data: cstr("t")}, netlink.Attribute{Type: unix.NFTA_SET_NAME, Data: cstr("service-ips")},
		netlink.Attribute{Type: unix.NFTA_SET_FLAGS, Data: be32(setMap)}, netlink.Attribute{Type: unix.NFTA_SET_KEY_TYPE, Data: be32(7<<12 | 12<<6 | 13)},
		netlink.Attribute{Type: unix.NFTA_SET_KEY_LEN, Data: be32(12)}, netlink.Attribute{Type: unix.NFTA_SET_DATA_TYPE, Data: be32(dataTypeVerdict)})
	verdict := attrs(netlink.Attribute{Type: unix.NFTA_VERDICT_CODE, Data: be32(uint32(0xfffffffc))}, netlink.Attribute{Type: unix.NFTA_VERDICT_CHAIN, Data: cstr("svc")})
	data := attrs(netlink.Attribute{Type: unix.NLA_F_NESTED | unix.NFTA_DATA_VERDICT, Data: verdict})
	key := attrs(netlink.Attribute{Type: unix.NFTA_DATA_VALUE, Data: []byte{10, 96, 0, 1, 6, 0, 0, 0, 1, 187, 0, 0}})
	one := attrs(netlink.Attribute{Type: unix.NLA_F_NESTED | unix.NFTA_SET_ELEM_KEY, Data: key}, netlink.Attribute{Type: unix.NLA_F_NESTED | unix.NFTA_SET_ELEM_DATA, Data: data},
		netlink.Attribute{Type: unix.NFTA_SET_ELEM_USERDATA, Data: []byte{0, 2, 'x', 0}})
	list := attrs(netlink.Attribute{Type: unix.NLA_F_NESTED | unix.NFTA_LIST_ELEM, Data: one})
	elem := attrs(netlink.Attribute{Type: unix.NLA_F_NESTED | unix.NFTA_SET_ELEM_LIST_ELEMENTS, Data: list})
	return [][]byte{rule, chain, set, elem, attrs(netlink.Attribute{Type: unix.NFTA_TABLE_NAME, Data: cstr("t")}), nil}
}

// FuzzDecodeNetlink: whatever the kernel (or a corrupted answer) sends,
// the table, chain, set, element and rule decoders return values or
// errors, never panic.
func FuzzDecodeNetlink(f *testing.F) {
	for _, s := range fuzzSeeds(f) {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		dec := func() *netlink.AttributeDecoder {
			ad, err := netlink.NewAttributeDecoder(b)
			if err != nil {
				return nil
			}
			ad.ByteOrder = binary.BigEndian
			return ad
		}
		if ad := dec(); ad != nil {
			_, _ = decodeTable(unix.NFPROTO_INET, ad)
		}
		if ad := dec(); ad != nil {
			_, _, _ = decodeChain(FamilyNetdev, ad)
		}
		var set *Set
		if ad := dec(); ad != nil {
			set, _, _, _ = decodeSet(FamilyIP, ad)
		}
		// Elements into the decoded set (if it decoded) and into
		// kube-proxy's service-ips shape, an interval set and a host-order
		// integer set.
		sets := []*Set{
			{Name: "a", meta: &setMeta{keyTypes: []uint32{7, 12, 13}, dataType: dataTypeVerdict}},
			{Name: "b", meta: &setMeta{keyTypes: []uint32{7}, interval: true}},
			{Name: "c", meta: &setMeta{keyTypes: []uint32{4}, hostKey: true, dataType: 7}},
		}
		if set != nil {
			sets = append(sets, set)
		}
		anon := map[string]*Set{}
		for _, s := range sets {
			if ad := dec(); ad != nil {
				_, _ = decodeElements(s, ad)
			}
			s.finishElements()
			anon[s.Name] = s
		}
		anon["__map0"] = sets[0]
		if ad := dec(); ad != nil {
			_, _, _, _ = decodeRule(FamilyIP, ad, anon, &anonCache{}, map[ruleKey]bool{})
		}
		_, _ = decodeExprs(unix.NFPROTO_INET, b)
	})
}
