package ipvs

import (
	"encoding/json"
	"net/netip"
	"reflect"
	"testing"
)

func TestRefs(t *testing.T) {
	vs := VirtualServer{Address: netip.MustParseAddr("10.96.0.10"), Protocol: UDP, Port: 53}
	rs := RealServer{Address: netip.MustParseAddr("10.244.1.5"), Port: 5353}
	v := VirtualRef{vs}
	if v.Target() != "ipvs-vs/UDP/10.96.0.10:53" {
		t.Fatalf("target %q", v.Target())
	}
	want := map[string]any{"vsProtocol": "UDP", "vsAddress": "10.96.0.10", "vsPort": 53}
	if !reflect.DeepEqual(v.Evidence(), want) {
		t.Fatalf("evidence %#v", v.Evidence())
	}
	r := RealRef{VS: vs, RS: rs}
	if r.Target() != "ipvs-rs/UDP/10.96.0.10:53/10.244.1.5:5353" {
		t.Fatalf("target %q", r.Target())
	}
	// Through a JSON round trip (the journal) and back.
	b, _ := json.Marshal(r.Evidence())
	var ev map[string]any
	if err := json.Unmarshal(b, &ev); err != nil {
		t.Fatal(err)
	}
	got, err := DecodeRealRef(ev)
	if err != nil || got.VS != vs || got.RS.AddrPort() != rs.AddrPort() {
		t.Fatalf("DecodeRealRef = %+v, %v", got, err)
	}
	for _, bad := range []map[string]any{
		{}, {"vsProtocol": "ICMP", "vsAddress": "10.96.0.10", "vsPort": 53},
		{"vsProtocol": "UDP", "vsAddress": "nope", "vsPort": 53},
		{"vsProtocol": "UDP", "vsAddress": "10.96.0.10", "vsPort": 70000},
	} {
		if _, err := DecodeVirtualRef(bad); err == nil {
			t.Errorf("DecodeVirtualRef(%v) accepted", bad)
		}
	}
	if _, err := DecodeRealRef(v.Evidence()); err == nil {
		t.Error("DecodeRealRef accepted a virtual server's evidence")
	}
}
