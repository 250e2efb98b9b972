package conntrack

import (
	"net/netip"
	"os"
	"path/filepath"
	"testing"
)

// messages splits a datagram into (header, payload) pairs.
func messages(t testing.TB, b []byte) (hs []nlHeader, ps [][]byte) {
	for len(b) > 0 {
		h, p, rest, err := nextMessage(b)
		if err != nil {
			t.Fatalf("nextMessage: %v", err)
		}
		hs, ps, b = append(hs, h), append(ps, p), rest
	}
	return hs, ps
}

func readFixture(t testing.TB, name string) []byte {
	b, err := os.ReadFile(filepath.Join("testdata", name))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// The captured kernel dump (filtered on reply source 10.0.1.1, UDP) decodes
// into the flows the capture test created, all matching the backend.
func TestDecodeRealDumpV4(t *testing.T) {
	hs, ps := messages(t, readFixture(t, "dump-udp-reply-src-v4.bin"))
	b := Backend{IP: deadIP}
	n := 0
	for i, h := range hs {
		if h.Type>>8 != subsysCTNetlink {
			continue
		}
		if h.Flags&nlmFDumpFiltered == 0 {
			t.Errorf("message %d not flagged NLM_F_DUMP_FILTERED", i)
		}
		var f Flow
		if err := decodeFlow(ps[i], &f); err != nil {
			t.Fatalf("message %d: %v", i, err)
		}
		if !b.Matches(&f) || f.ID == 0 || f.OrigDst.Addr().Is6() {
			t.Errorf("message %d decoded to unexpected %s", i, f)
		}
		n++
	}
	if n == 0 {
		t.Fatal("no entries in the captured dump")
	}
}

func TestDecodeRealDumpV6(t *testing.T) {
	hs, ps := messages(t, readFixture(t, "dump-udp-v6.bin"))
	want := netip.MustParseAddr("fd00:1::1")
	n := 0
	for i, h := range hs {
		if h.Type>>8 != subsysCTNetlink {
			continue
		}
		var f Flow
		if err := decodeFlow(ps[i], &f); err != nil {
			t.Fatal(err)
		}
		if f.ReplySrc.Addr() != want || f.ReplySrc.Port() != 53 || f.Proto != ProtoUDP {
			t.Errorf("decoded %s", f)
		}
		n++
	}
	if n != 3 {
		t.Fatalf("decoded %d v6 entries, want 3", n)
	}
}

func TestDecodeRealStats(t *testing.T) {
	hs, ps := messages(t, readFixture(t, "stats-cpu.bin"))
	var st Stats
	for i, h := range hs {
		if h.Type == msgType(ctMsgGetStatsCPU) {
			if err := decodeStatsCPU(ps[i], &st); err != nil {
				t.Fatal(err)
			}
		}
	}
	if st.CPUs < 1 {
		t.Fatalf("no CPU records: %+v", st)
	}
	_, ps = messages(t, readFixture(t, "stats-global.bin"))
	u, err := decodeStatsGlobal(ps[0])
	if err != nil {
		t.Fatal(err)
	}
	if u.Count != 70 || u.Max == 0 {
		t.Fatalf("global stats = %+v, want 70 entries (the capture's table) and a max", u)
	}
}

// Encoding a create request and decoding its payload gives the same flow:
// the tuple encoding is the kernel's dump encoding.
func TestEncodeDecodeRoundTrip(t *testing.T) {
	for _, f := range []Flow{
		{Proto: ProtoUDP, OrigSrc: netip.MustParseAddrPort("10.0.0.1:1234"), OrigDst: netip.MustParseAddrPort("10.96.0.10:53"),
			ReplySrc: netip.MustParseAddrPort("10.0.1.1:53"), ReplyDst: netip.MustParseAddrPort("10.0.0.1:1234"), Zone: 7},
		{Proto: ProtoTCP, OrigSrc: netip.MustParseAddrPort("[fd00::1]:1"), OrigDst: netip.MustParseAddrPort("[fd00::2]:65535"),
			ReplySrc: netip.MustParseAddrPort("[fd00::3]:2"), ReplyDst: netip.MustParseAddrPort("[fd00::1]:1")},
		{Proto: ProtoTCP, OrigSrc: netip.MustParseAddrPort("10.0.0.1:40000"), OrigDst: netip.MustParseAddrPort("10.96.0.1:443"),
			ReplySrc: netip.MustParseAddrPort("10.0.1.9:6443"), ReplyDst: netip.MustParseAddrPort("10.0.0.1:40000"),
			Status: StatusSeenReply | StatusAssured, TCPState: TCPStateTimeWait},
		{Proto: ProtoUDP, OrigSrc: netip.MustParseAddrPort("10.0.0.1:5000"), OrigDst: netip.MustParseAddrPort("10.96.0.10:53"),
			ReplySrc: netip.MustParseAddrPort("10.0.1.1:53"), ReplyDst: netip.MustParseAddrPort("10.0.0.1:5000"), Status: StatusSeenReply},
	} {
		var e encoder
		e.createRequest(1, 0, &f, 30)
		_, ps := messages(t, e.b)
		var got Flow
		if err := decodeFlow(ps[0], &got); err != nil {
			t.Fatal(err)
		}
		if got != f {
			t.Errorf("round trip:\n got %s\nwant %s", got, f)
		}
	}
}

func TestDecodeRejectsMalformed(t *testing.T) {
	f := Flow{Proto: ProtoUDP, OrigSrc: netip.MustParseAddrPort("10.0.0.1:1"), OrigDst: netip.MustParseAddrPort("10.0.0.2:2"),
		ReplySrc: netip.MustParseAddrPort("10.0.0.2:2"), ReplyDst: netip.MustParseAddrPort("10.0.0.1:1")}
	var e encoder
	e.createRequest(1, 0, &f, 30)
	payload := e.b[nlmsgHdrLen:]
	var got Flow
	for cut := 0; cut < len(payload); cut++ {
		// Every strict prefix lacks something: it must fail, not panic
		// (a cut exactly between attributes loses the reply tuple or more).
		if err := decodeFlow(payload[:cut], &got); err == nil && cut < len(payload)-8 {
			t.Errorf("prefix of %d/%d bytes decoded without error: %s", cut, len(payload), got)
		}
	}
	// An attribute claiming more bytes than present.
	bad := append([]byte(nil), payload...)
	bad[nfgenHdrLen] = 0xff
	if err := decodeFlow(bad, &got); err == nil {
		t.Error("oversized attribute length accepted")
	}
	if _, _, _, err := nextMessage([]byte{1, 2, 3}); err == nil {
		t.Error("short header accepted")
	}
}

func TestBackendMatchesAndValidate(t *testing.T) {
	udp := Flow{Proto: ProtoUDP, ReplySrc: netip.MustParseAddrPort("10.0.1.1:53")}
	tcp := udp
	tcp.Proto = ProtoTCP
	for _, tc := range []struct {
		b    Backend
		f    Flow
		want bool
	}{
		{Backend{IP: deadIP}, udp, true},
		{Backend{IP: deadIP, Port: 53}, udp, true},
		{Backend{IP: deadIP, Port: 54}, udp, false},
		{Backend{IP: deadIP}, tcp, false},
		{Backend{IP: aliveIP}, udp, false},
		{Backend{IP: netip.MustParseAddr("::ffff:10.0.1.1")}, udp, true},
	} {
		if got := tc.b.Matches(&tc.f); got != tc.want {
			t.Errorf("%s matches %s = %v, want %v", tc.b, tc.f, got, tc.want)
		}
	}
	for _, b := range []Backend{{}, {IP: netip.MustParseAddr("0.0.0.0")}, {IP: netip.MustParseAddr("::")}, {IP: netip.MustParseAddr("224.0.0.1")}} {
		if b.Validate() == nil {
			t.Errorf("Validate(%v) accepted", b)
		}
	}
}

func fuzzSeeds(f *testing.F) {
	for _, name := range []string{"dump-udp-reply-src-v4.bin", "dump-udp-v6.bin", "stats-cpu.bin", "stats-global.bin"} {
		b, err := os.ReadFile(filepath.Join("testdata", name))
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Add([]byte{})
	f.Add([]byte{16, 0, 0, 0, 3, 0, 2, 0, 1, 0, 0, 0, 0, 0, 0, 0})
}

// FuzzDecodeDatagram feeds arbitrary datagrams through the same path the
// dump loop uses: split into messages, decode entries and statistics. It
// must never panic, and a decoded flow must survive re-encoding.
func FuzzDecodeDatagram(f *testing.F) {
	fuzzSeeds(f)
	f.Fuzz(func(t *testing.T, b []byte) {
		for len(b) > 0 {
			h, payload, rest, err := nextMessage(b)
			if err != nil {
				return
			}
			b = rest
			_, _ = errnoOf(payload)
			_, _ = errorSeq(payload)
			var st Stats
			_ = decodeStatsCPU(payload, &st)
			_, _ = decodeStatsGlobal(payload)
			var fl Flow
			if decodeFlow(payload, &fl) != nil {
				continue
			}
			_ = h
			var e encoder
			e.createRequest(1, 0, &fl, 1)
			_, p2, _, err := nextMessage(e.b)
			if err != nil {
				t.Fatalf("re-encoded message does not split: %v", err)
			}
			var again Flow
			if err := decodeFlow(p2, &again); err != nil {
				t.Fatalf("re-encoded %s does not decode: %v", fl, err)
			}
			again.ID, again.Zone = fl.ID, fl.Zone // not in a create request unless set
			if again.Proto != fl.Proto || again.OrigSrc != fl.OrigSrc || again.ReplySrc != fl.ReplySrc {
				t.Fatalf("round trip changed %s into %s", fl, again)
			}
		}
	})
}

func TestKernelFilterWorks(t *testing.T) {
	for rel, want := range map[string]bool{
		"6.18.44-fc-v657":   true,
		"5.16.0":            true,
		"10.1":              true,
		"5.15.0-91-generic": false,
		"5.10.83":           false,
		"4.19.0":            false,
		"garbage":           false,
		"":                  false,
	} {
		if got := kernelFilterWorks(rel); got != want {
			t.Errorf("kernelFilterWorks(%q) = %v, want %v", rel, got, want)
		}
	}
}
