package stale

import (
	"net/netip"
	"reflect"
	"testing"
	"time"

	"github.com/remediate-dev/remediate/internal/cluster"
	"github.com/remediate-dev/remediate/internal/cluster/clustertest"
	"github.com/remediate-dev/remediate/internal/conntrack"
	"github.com/remediate-dev/remediate/internal/dataplane"
)

var t0 = time.Date(2026, 11, 23, 12, 0, 0, 0, time.UTC)

// dnsService is kube-system/dns with ClusterIP 10.96.0.10, UDP and TCP 53,
// changed at `changed`.
func dnsService(changed time.Time) cluster.Service {
	return cluster.Service{Namespace: "kube-system", Name: "dns", ClusterIPs: []string{"10.96.0.10"}, Type: "ClusterIP",
		Ports:   []cluster.ServicePort{{Name: "dns", Protocol: "UDP", Port: 53}, {Name: "dns-tcp", Protocol: "TCP", Port: 53}},
		Created: changed.Add(-time.Hour), Changed: changed}
}

// ep is one endpoint address serving both ports of dnsService.
func ep(addr string, ready, serving, terminating bool, changed time.Time) []cluster.Endpoint {
	return []cluster.Endpoint{
		{Address: addr, Port: 53, Protocol: "UDP", PortName: "dns", Ready: ready, Serving: serving, Terminating: terminating, SliceChanged: changed},
		{Address: addr, Port: 53, Protocol: "TCP", PortName: "dns-tcp", Ready: ready, Serving: serving, Terminating: terminating, SliceChanged: changed},
	}
}

// svcFlow is a client -> vip flow DNATed to backend (backend == vip: not
// DNATed).
func svcFlow(proto uint8, client, vip, backend string) conntrack.Flow {
	c, v, b := netip.MustParseAddrPort(client), netip.MustParseAddrPort(vip), netip.MustParseAddrPort(backend)
	return conntrack.Flow{Proto: proto, OrigSrc: c, OrigDst: v, ReplySrc: b, ReplyDst: c}
}

// Classifying an entry allocates nothing unless it is stale: the scan's
// memory does not grow with the table.
func TestConntrackStaleObserveAllocs(t *testing.T) {
	view := clustertest.New(t0)
	old := t0.Add(-10 * time.Minute)
	view.SetService(dnsService(old), ep("10.244.2.7", true, true, false, old)...)
	ix := buildIndex(view, "node1", []dataplane.Family{dataplane.IPv4}, nil, nil, t0, 90*time.Second)
	live := svcFlow(conntrack.ProtoUDP, "10.0.0.5:40000", "10.96.0.10:53", "10.244.2.7:53")
	other := svcFlow(conntrack.ProtoUDP, "10.0.0.5:40000", "192.0.2.1:53", "192.0.2.1:53")
	stale := svcFlow(conntrack.ProtoUDP, "10.0.0.5:40000", "10.96.0.10:53", "10.244.1.5:53")
	ix.Observe(&stale) // the stale backend's record exists from now on
	if n := testing.AllocsPerRun(100, func() { ix.Observe(&live); ix.Observe(&other); ix.Observe(&stale) }); n != 0 {
		t.Errorf("observe allocates %.1f times per entry", n)
	}
	if b := ix.stale[backendKey{conntrack.ProtoUDP, netip.MustParseAddrPort("10.244.1.5:53")}]; b == nil || b.entries != 102 {
		t.Errorf("stale record %+v", b)
	}
}

// Remembered Service addresses: a vanished one keeps the first time it was
// missed; over the bound, the ones missing longest go first.
func TestRememberCTVIPs(t *testing.T) {
	a := VIP{netip.MustParseAddr("10.96.0.1"), 53, conntrack.ProtoUDP}
	b := VIP{netip.MustParseAddr("10.96.0.2"), 53, conntrack.ProtoUDP}
	c := VIP{netip.MustParseAddr("10.96.0.3"), 53, conntrack.ProtoUDP}
	t1, t2 := t0, t0.Add(time.Minute)
	ix := &Index{vips: map[VIP]*port{c: {service: "ns/c:dns"}}}
	known := map[VIP]Known{a: {Service: "ns/a:dns", MissingSince: t1}, b: {Service: "ns/b:dns"}}
	got := Remember(known, ix, t2, 10)
	if len(got) != 3 || got[a].MissingSince != t1 || got[b].MissingSince != t2 || !got[c].MissingSince.IsZero() {
		t.Fatalf("remembered %+v", got)
	}
	got = Remember(known, ix, t2, 2)
	if _, ok := got[a]; ok || len(got) != 2 {
		t.Fatalf("bounded to 2: %+v (the oldest missing, a, must go)", got)
	}
}

// TestRememberQuietCycleAllocatesNothing: a cycle where every Service
// address is known already (a quiet cluster) returns what was known, with
// no allocation (it rebuilt a map of every Service address each cycle);
// a Service renamed, added or gone still gives a new map.
func TestRememberQuietCycleAllocatesNothing(t *testing.T) {
	a := VIP{netip.MustParseAddr("10.96.0.1"), 53, conntrack.ProtoUDP}
	b := VIP{netip.MustParseAddr("10.96.0.2"), 53, conntrack.ProtoUDP}
	ix := &Index{vips: map[VIP]*port{a: {service: "ns/a:dns"}, b: {service: "ns/b:dns"}}}
	known := Remember(map[VIP]Known{}, ix, t0, 10)
	if n := testing.AllocsPerRun(100, func() { known = Remember(known, ix, t0, 10) }); n != 0 {
		t.Errorf("a quiet cycle allocates %.0f times", n)
	}
	if len(known) != 2 || known[a].Service != "ns/a:dns" || !known[b].MissingSince.IsZero() {
		t.Fatalf("known %+v", known)
	}
	c := VIP{netip.MustParseAddr("10.96.0.3"), 53, conntrack.ProtoUDP}
	t1 := t0.Add(time.Minute)
	for name, tc := range map[string]struct {
		ix   *Index
		want map[VIP]Known
	}{
		"renamed": {&Index{vips: map[VIP]*port{a: {service: "ns/a2:dns"}, b: {service: "ns/b:dns"}}},
			map[VIP]Known{a: {Service: "ns/a2:dns"}, b: {Service: "ns/b:dns"}}},
		"gone": {&Index{vips: map[VIP]*port{a: {service: "ns/a:dns"}}},
			map[VIP]Known{a: {Service: "ns/a:dns"}, b: {Service: "ns/b:dns", MissingSince: t1}}},
		"deleted": {&Index{vips: map[VIP]*port{a: {service: "ns/a:dns"}, b: {service: "ns/b:dns", deleted: true}}},
			map[VIP]Known{a: {Service: "ns/a:dns"}, b: {Service: "ns/b:dns", MissingSince: t1}}},
		"added": {&Index{vips: map[VIP]*port{a: {service: "ns/a:dns"}, b: {service: "ns/b:dns"}, c: {service: "ns/c:dns"}}},
			map[VIP]Known{a: {Service: "ns/a:dns"}, b: {Service: "ns/b:dns"}, c: {Service: "ns/c:dns"}}},
	} {
		if got := Remember(known, tc.ix, t1, 10); !reflect.DeepEqual(got, tc.want) || len(known) != 2 || !known[b].MissingSince.IsZero() {
			t.Errorf("%s: %+v, want %+v (known %+v untouched)", name, got, tc.want, known)
		}
	}
	if got := Remember(known, ix, t0, 1); len(got) != 2 {
		// Over the bound with nothing missing: none to drop, all kept.
		t.Errorf("bound 1: %+v", got)
	}
}
