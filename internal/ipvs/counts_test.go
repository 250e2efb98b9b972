package ipvs

import (
	"net/netip"
	"testing"
	"time"
)

func TestCountTracker(t *testing.T) {
	var c countTracker
	if _, ok := c.counts(); ok {
		t.Fatal("counts before any listing")
	}
	a := VirtualServer{Address: netip.MustParseAddr("10.96.0.10"), Protocol: "UDP", Port: 53}
	b := VirtualServer{Address: netip.MustParseAddr("10.96.0.1"), Protocol: "TCP", Port: 443}
	now := time.Unix(100, 0)
	c.reals(a, 9) // before a listing names it: not counted
	c.virtuals([]VirtualServer{a, b}, now)
	c.reals(a, 2)
	c.reals(b, 3)
	if got, ok := c.counts(); !ok || got.Virtual != 2 || got.Real != 5 || !got.At.Equal(now) {
		t.Fatalf("%+v %v", got, ok)
	}
	// b is gone: its real servers no longer count; a keeps its last count.
	c.virtuals([]VirtualServer{a}, now.Add(time.Second))
	c.reals(b, 7)
	if got, _ := c.counts(); got.Virtual != 1 || got.Real != 2 {
		t.Fatalf("after b vanished: %+v", got)
	}
}
