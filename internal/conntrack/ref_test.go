package conntrack

import (
	"net/netip"
	"reflect"
	"testing"
)

func TestBackendRef(t *testing.T) {
	r := BackendRef{Protocol: "UDP", Backend: Backend{IP: netip.MustParseAddr("10.244.0.12"), Port: 53}}
	if r.Target() != "ipvs-conn/UDP/10.244.0.12:53" {
		t.Fatalf("target %q", r.Target())
	}
	ev := map[string]any{"other": 1}
	r.PutEvidence(ev)
	want := map[string]any{"other": 1, "backendIP": "10.244.0.12", "backendPort": 53, "protocol": "UDP"}
	if !reflect.DeepEqual(ev, want) {
		t.Fatalf("evidence %#v", ev)
	}
	if got, err := DecodeBackendRef(ev); err != nil || got != r {
		t.Fatalf("DecodeBackendRef = %+v, %v", got, err)
	}
	if got, err := DecodeBackendRef(map[string]any{"backendIP": "10.0.0.1", "protocol": "udp"}); err != nil || got.Protocol != "UDP" || got.Backend.Port != 0 {
		t.Fatalf("no port = %+v, %v", got, err)
	}
	for _, bad := range []map[string]any{{}, {"backendIP": 1}, {"backendIP": "10.0.0.1", "protocol": ""}, {"backendIP": "10.0.0.1", "backendPort": -1}} {
		if _, err := DecodeBackendRef(bad); err == nil {
			t.Errorf("DecodeBackendRef(%v) accepted", bad)
		}
	}
}
