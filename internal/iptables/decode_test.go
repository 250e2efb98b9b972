package iptables

import (
	byteorder "encoding/binary"
	"errors"
	"slices"
	"strings"
	"testing"
)

// blobBuilder writes a legacy IPv4 entry table the way libiptc lays one
// out (tests only).
type blobBuilder struct {
	b    []byte
	info LegacyTableInfo
}

// entry appends one entry: ip header fields by offset, matches (each
// name, revision, data) and a target (name "" is the standard target with
// verdict).
type testMatch struct {
	name string
	rev  uint8
	data []byte
}

func (bb *blobBuilder) entry(ip map[int][]byte, matches []testMatch, target string, rev uint8, tdata []byte) int {
	off := len(bb.b)
	e := make([]byte, ipEntrySize)
	for o, v := range ip {
		copy(e[o:], v)
	}
	for _, m := range matches {
		size := extHdr + (len(m.data)+7)/8*8
		h := make([]byte, size)
		byteorder.NativeEndian.PutUint16(h, uint16(size))
		copy(h[2:], m.name)
		h[31] = m.rev
		copy(h[extHdr:], m.data)
		e = append(e, h...)
	}
	tOff := len(e)
	tsize := extHdr + (len(tdata)+7)/8*8
	th := make([]byte, tsize)
	byteorder.NativeEndian.PutUint16(th, uint16(tsize))
	copy(th[2:], target)
	th[31] = rev
	copy(th[extHdr:], tdata)
	e = append(e, th...)
	byteorder.NativeEndian.PutUint16(e[88:], uint16(tOff))
	byteorder.NativeEndian.PutUint16(e[90:], uint16(len(e)))
	bb.b = append(bb.b, e...)
	bb.info.NumEntries++
	return off
}

func verdict(v int32) []byte { return byteorder.NativeEndian.AppendUint32(nil, uint32(v)) }

func errorData(name string) []byte {
	d := make([]byte, 30)
	copy(d, name)
	return d
}

// sampleBlob is filter with INPUT (one rule jumping to KUBE-X, a comment
// and a source), policy DROP, and the user chain KUBE-X with one ACCEPT.
func sampleBlob() (LegacyTableInfo, []byte) {
	bb := &blobBuilder{info: LegacyTableInfo{Name: "filter", ValidHooks: 1 << 1}}
	comment := make([]byte, 256)
	copy(comment, "a \"b\"")
	jump := bb.entry(map[int][]byte{0: {10, 0, 0, 1}, 8: {255, 255, 255, 255}},
		[]testMatch{{"comment", 0, comment}}, "", 0, verdict(0))
	pol := bb.entry(nil, nil, "", 0, verdict(-1))
	bb.info.HookEntry[1], bb.info.Underflow[1] = 0, uint32(pol)
	bb.entry(nil, nil, "ERROR", 0, errorData("KUBE-X"))
	first := bb.entry(nil, nil, "", 0, verdict(-2))
	bb.entry(nil, nil, "", 0, verdict(-5))
	bb.entry(nil, nil, "ERROR", 0, errorData("ERROR"))
	byteorder.NativeEndian.PutUint32(bb.b[jump+ipEntrySize+extHdr+256+extHdr:], uint32(first))
	bb.info.Size = uint32(len(bb.b))
	return bb.info, bb.b
}

func TestDecodeBuiltBlob(t *testing.T) {
	info, blob := sampleBlob()
	rs, err := DecodeLegacy([]LegacyTableInfo{info}, [][]byte{blob})
	if err != nil {
		t.Fatal(err)
	}
	want := "*filter\n:INPUT DROP [0:0]\n:KUBE-X - [0:0]\n" +
		"-A INPUT -s 10.0.0.1/32 -m comment --comment \"a \\\"b\\\"\" -j KUBE-X\n" +
		"-A KUBE-X -j ACCEPT\nCOMMIT\n"
	if got := rs.String(); got != want {
		t.Fatalf("got\n%s\nwant\n%s", got, want)
	}
	if r := rs.Table("filter").Chain("INPUT").Rules[0]; r.Line != 5 || r.Target != "KUBE-X" {
		t.Errorf("rule line %d target %q, want 5 KUBE-X (as in the save's output)", r.Line, r.Target)
	}
}

// TestDecodeRejectsInconsistentEntries: a blob whose offsets, counts,
// hooks, jumps or extensions do not add up is not decodable, never a
// panic or a guess.
func TestDecodeRejectsInconsistentEntries(t *testing.T) {
	for name, mutate := range map[string]func(*LegacyTableInfo, []byte) []byte{
		"size":          func(i *LegacyTableInfo, b []byte) []byte { i.Size++; return b },
		"count":         func(i *LegacyTableInfo, b []byte) []byte { i.NumEntries--; return b },
		"truncated":     func(i *LegacyTableInfo, b []byte) []byte { i.Size -= 8; return b[:len(b)-8] },
		"next_offset":   func(i *LegacyTableInfo, b []byte) []byte { b[90]++; return b },
		"target_offset": func(i *LegacyTableInfo, b []byte) []byte { b[88] += 8; return b },
		"hook":          func(i *LegacyTableInfo, b []byte) []byte { i.HookEntry[1] = 8; return b },
		"underflow":     func(i *LegacyTableInfo, b []byte) []byte { i.Underflow[1] = 0; return b },
		"valid_hooks":   func(i *LegacyTableInfo, b []byte) []byte { i.ValidHooks |= 1; return b },
		"jump":          func(i *LegacyTableInfo, b []byte) []byte { b[ipEntrySize+extHdr+256+extHdr] += 8; return b },
		"match revision": func(i *LegacyTableInfo, b []byte) []byte {
			b[ipEntrySize+31] = 9
			return b
		},
		"match name": func(i *LegacyTableInfo, b []byte) []byte {
			copy(b[ipEntrySize+2:], "multiport")
			return b
		},
		"comment without NUL": func(i *LegacyTableInfo, b []byte) []byte {
			for k := range 256 {
				b[ipEntrySize+extHdr+k] = 'x'
			}
			return b
		},
	} {
		info, blob := sampleBlob()
		blob = mutate(&info, blob)
		if rs, err := DecodeLegacyTable(info, blob); !errors.Is(err, ErrNotDecodable) {
			t.Errorf("%s: err %v, want not decodable; decoded %v", name, err, rs)
		}
	}
}

func FuzzDecodeLegacy(f *testing.F) {
	info, blob := sampleBlob()
	enc := func(i LegacyTableInfo) []byte {
		b := byteorder.NativeEndian.AppendUint32(nil, i.ValidHooks)
		for h := range 5 {
			b = byteorder.NativeEndian.AppendUint32(b, i.HookEntry[h])
		}
		for h := range 5 {
			b = byteorder.NativeEndian.AppendUint32(b, i.Underflow[h])
		}
		return byteorder.NativeEndian.AppendUint32(b, i.NumEntries)
	}
	f.Add(enc(info), blob)
	f.Add(enc(info), blob[:len(blob)-64])
	f.Add([]byte{}, []byte{})
	f.Fuzz(func(t *testing.T, hdr, blob []byte) {
		if len(hdr) < 48 {
			hdr = append(slices.Clone(hdr), make([]byte, 48-len(hdr))...)
		}
		info := LegacyTableInfo{Name: "filter", ValidHooks: byteorder.NativeEndian.Uint32(hdr),
			NumEntries: byteorder.NativeEndian.Uint32(hdr[44:]), Size: uint32(len(blob))}
		for h := range 5 {
			info.HookEntry[h] = byteorder.NativeEndian.Uint32(hdr[4+4*h:])
			info.Underflow[h] = byteorder.NativeEndian.Uint32(hdr[24+4*h:])
		}
		rs, err := DecodeLegacy([]LegacyTableInfo{info}, [][]byte{blob})
		if err != nil {
			if !errors.Is(err, ErrNotDecodable) {
				t.Fatalf("error not wrapping ErrNotDecodable: %v", err)
			}
			return
		}
		// What decodes is what a save would print: its text parses
		// back to the same rules.
		text := rs.String()
		back, err := ParseString(text)
		if err != nil {
			t.Fatalf("decoded rules do not parse: %v\n%s", err, text)
		}
		if !equalRulesets(rs, back) {
			t.Fatalf("decoded rules do not survive a format and parse:\n%s", text)
		}
		if strings.Count(text, "\n") < 2 {
			t.Fatalf("decoded table without lines: %q", text)
		}
	})
}
