package conntrack

import (
	"encoding/json"
	"math/rand"
	"net/netip"
	"testing"
)

func flowTo(proto uint8, src, dst string, status uint32, state uint8) Flow {
	s, d := netip.MustParseAddrPort(src), netip.MustParseAddrPort(dst)
	return Flow{Proto: proto, OrigSrc: s, OrigDst: d, ReplySrc: d, ReplyDst: s, Status: status, TCPState: state}
}

func TestComposerClassesAndTop(t *testing.T) {
	c := NewComposer(2, 8)
	add := func(n int, f Flow) {
		for i := 0; i < n; i++ {
			c.Add(&f)
		}
	}
	add(50, flowTo(ProtoUDP, "10.1.0.1:1000", "10.96.0.10:53", StatusSeenReply, 0))
	add(10, flowTo(ProtoUDP, "10.1.0.2:1000", "10.96.0.10:53", 0, 0))
	add(20, flowTo(ProtoTCP, "10.1.0.3:1000", "10.96.0.1:443", StatusSeenReply|StatusAssured, TCPStateTimeWait))
	add(5, flowTo(ProtoTCP, "10.1.0.3:1001", "10.96.0.1:443", StatusSeenReply, TCPStateEstablished))
	add(1, flowTo(ProtoTCP, "10.1.0.3:1002", "10.96.0.1:443", 0, 42))
	add(3, flowTo(protoICMP, "[fd00::1]:0", "[fd00::2]:0", 0, 0))
	r := c.Result()
	if r.Total != 89 {
		t.Fatalf("total %d", r.Total)
	}
	want := map[Class]uint64{ClassUDPStream: 50, ClassUDPUnreplied: 10, ClassTCPTimeWait: 20, "tcp/ESTABLISHED": 5, "tcp/other": 1, "icmp": 3}
	if len(r.Classes) != len(want) {
		t.Errorf("classes %+v, want %v", r.Classes, want)
	}
	for cl, n := range want {
		if got := r.Count(cl); got != n {
			t.Errorf("%s: %d, want %d", cl, got, n)
		}
	}
	if r.Classes[0].Class != ClassUDPStream || r.Classes[1].Class != ClassTCPTimeWait {
		t.Errorf("classes not largest first: %+v", r.Classes)
	}
	if got := r.Share(ClassUDPStream); got < 0.56 || got > 0.57 {
		t.Errorf("udp/stream share %.3f", got)
	}
	if len(r.TopDestinations) != 2 || r.TopDestinations[0].Endpoint.String() != "udp/10.96.0.10:53" || r.TopDestinations[0].Count != 60 ||
		r.TopDestinations[1].Endpoint.String() != "tcp/10.96.0.1:443" || r.TopDestinations[1].Count != 26 {
		t.Errorf("top destinations %+v", r.TopDestinations)
	}
	if len(r.TopSources) != 2 || r.TopSources[0].Endpoint.String() != "10.1.0.1" || r.TopSources[0].Count != 50 ||
		r.TopSources[0].MaxOvercount != 0 || r.TopSources[1].Endpoint.String() != "10.1.0.3" {
		t.Errorf("top sources %+v", r.TopSources)
	}
	if s := r.Summary(); s != "udp/stream 56%, tcp/TIME_WAIT 22%, udp/unreplied 11%; top destination udp/10.96.0.10:53 (60 entries, 67%); top source 10.1.0.1 (50)" {
		t.Errorf("summary %q", s)
	}
}

// The space-saving guarantees hold on a skewed stream with far more keys
// than counters: every reported count brackets the truth, every key above
// N/m is kept, and the heaviest key is first.
func TestSpaceSavingBounds(t *testing.T) {
	rng := rand.New(rand.NewSource(1))
	const m, n = 16, 200_000
	s := newSpaceSaving(m)
	truth := map[Endpoint]uint64{}
	for i := 0; i < n; i++ {
		var k Endpoint
		switch r := rng.Intn(100); {
		case r < 40:
			k = Endpoint{Proto: ProtoUDP, Addr: netip.MustParseAddr("10.96.0.10"), Port: 53}
		case r < 55:
			k = Endpoint{Proto: ProtoTCP, Addr: netip.MustParseAddr("10.96.0.1"), Port: 443}
		default: // a long tail of distinct keys
			k = Endpoint{Proto: ProtoUDP, Addr: netip.AddrFrom4([4]byte{192, 0, byte(rng.Intn(256)), byte(rng.Intn(256))}), Port: 53}
		}
		truth[k]++
		s.add(k)
	}
	if len(s.heap) != m || len(s.index) != m || len(s.counters) != m {
		t.Fatalf("sketch holds %d counters (%d in the heap, %d indexed), want %d", len(s.counters), len(s.heap), len(s.index), m)
	}
	top := s.top(m)
	for _, h := range top {
		tr := truth[h.Endpoint]
		if h.Count < tr || h.Count-h.MaxOvercount > tr || h.MaxOvercount > n/m {
			t.Errorf("%s: count %d overcount %d, true %d (bound %d)", h.Endpoint, h.Count, h.MaxOvercount, tr, n/m)
		}
	}
	for k, tr := range truth {
		if tr > n/m {
			if _, ok := s.index[k]; !ok {
				t.Errorf("%s has %d > N/m entries but is not kept", k, tr)
			}
		}
	}
	if top[0].Endpoint.Port != 53 || top[0].Endpoint.Addr != netip.MustParseAddr("10.96.0.10") {
		t.Errorf("heaviest %s", top[0].Endpoint)
	}
	for i, c := range s.heap { // heap invariant and index consistency
		if s.counters[c].pos != int32(i) || s.index[s.counters[c].key] != c {
			t.Fatalf("counter %d at heap %d says pos %d, index %d", c, i, s.counters[c].pos, s.index[s.counters[c].key])
		}
		if l := 2*i + 1; l < len(s.heap) && s.less(l, i) {
			t.Fatalf("heap order broken at %d", i)
		}
	}
}

func TestCompositionEvidenceRoundTrip(t *testing.T) {
	c := NewComposer(3, 0)
	f := flowTo(ProtoUDP, "[fd00::1]:1", "[fd00::a]:53", StatusSeenReply, 0)
	c.Add(&f)
	f = flowTo(ProtoTCP, "10.0.0.1:1", "10.0.0.2:80", 0, TCPStateSynSent)
	c.Add(&f)
	comp := c.Result()
	ev := map[string]any{}
	comp.PutEvidence(ev)
	got, ok, err := DecodeComposition(ev)
	if err != nil || !ok || got.Total != 2 {
		t.Fatalf("direct: %+v %v %v", got, ok, err)
	}
	b, err := json.Marshal(ev)
	if err != nil {
		t.Fatal(err)
	}
	var back map[string]any
	if err := json.Unmarshal(b, &back); err != nil {
		t.Fatal(err)
	}
	got, ok, err = DecodeComposition(back)
	if err != nil || !ok {
		t.Fatalf("from JSON: %v %v (%s)", ok, err, b)
	}
	if got.Total != 2 || got.Count("tcp/SYN_SENT") != 1 || got.TopDestinations[0].Endpoint != comp.TopDestinations[0].Endpoint ||
		got.TopSources[1].Endpoint != comp.TopSources[1].Endpoint {
		t.Errorf("from JSON %+v, want %+v", got, comp)
	}
	if _, ok, err := DecodeComposition(map[string]any{}); ok || err != nil {
		t.Errorf("absent: %v %v", ok, err)
	}
	if _, _, err := DecodeComposition(map[string]any{EvidenceComposition: map[string]any{"topDestinations": []any{map[string]any{"endpoint": "udp/nope"}}}}); err == nil {
		t.Error("a bad endpoint decoded")
	}
}

func TestEndpointText(t *testing.T) {
	for _, s := range []string{"udp/10.96.0.10:53", "tcp/[fd00::1]:443", "icmp/10.0.0.1:0", "47/10.0.0.1:0", "10.1.2.3", "fd00::5"} {
		var e Endpoint
		if err := e.UnmarshalText([]byte(s)); err != nil {
			t.Errorf("%s: %v", s, err)
			continue
		}
		if e.String() != s {
			t.Errorf("%s round-trips to %s", s, e)
		}
	}
	for _, s := range []string{"", "udp/", "udp/10.0.0.1", "foo/10.0.0.1:1", "0/10.0.0.1:1", "300/10.0.0.1:1", "10.0.0.1:53"} {
		var e Endpoint
		if err := e.UnmarshalText([]byte(s)); err == nil {
			t.Errorf("%q accepted as %s", s, e)
		}
	}
}

// FuzzEndpointText: evidence read back from JSON is outside data; parsing
// never panics and what parses prints back to something that parses to
// the same endpoint.
func FuzzEndpointText(f *testing.F) {
	for _, s := range []string{"udp/10.96.0.10:53", "tcp/[fd00::1]:443", "10.1.2.3", "7/1.2.3.4:5", "udp/[fe80::1%eth0]:53"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		var e Endpoint
		if err := e.UnmarshalText([]byte(s)); err != nil {
			return
		}
		var again Endpoint
		if err := again.UnmarshalText([]byte(e.String())); err != nil || again != e {
			t.Fatalf("%q -> %s -> %v %v", s, e, again, err)
		}
	})
}

func TestTimeoutsRestoreCommand(t *testing.T) {
	if got := (Timeouts{UDPStream: 120e9, TCPTimeWait: 120e9}).RestoreCommand(); got !=
		"sysctl -w net.netfilter.nf_conntrack_udp_timeout_stream=120 net.netfilter.nf_conntrack_tcp_timeout_time_wait=120" {
		t.Errorf("restore %q", got)
	}
	if got := (Timeouts{}).RestoreCommand(); got != "" {
		t.Errorf("empty restore %q", got)
	}
}

// BenchmarkComposerAdd250k is the counting alone (no kernel) over 250k
// entries whose ~1000 sources overflow the sketch (every source a miss
// after the first 64: its worst case).
func BenchmarkComposerAdd250k(b *testing.B) {
	flows := make([]Flow, 250_000)
	for i := range flows {
		c := netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, 1, byte(i >> 16), byte(i >> 8)}), uint16(1024+i&0xff))
		flows[i] = Flow{Proto: ProtoUDP, OrigSrc: c, OrigDst: netip.MustParseAddrPort("10.96.0.10:53"), Status: StatusSeenReply}
	}
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		c := NewComposer(DefaultTopN, 0)
		for j := range flows {
			c.Add(&flows[j])
		}
		if r := c.Result(); r.Total != 250_000 {
			b.Fatal(r.Total)
		}
	}
}
