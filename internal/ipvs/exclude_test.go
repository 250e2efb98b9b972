package ipvs

import (
	"net/netip"
	"testing"
)

func TestExcluded(t *testing.T) {
	excl := []netip.Prefix{netip.MustParsePrefix("10.96.200.0/24"), netip.MustParsePrefix("fd00:200::/64")}
	for _, tc := range []struct {
		addr string
		want string
	}{
		{"10.96.200.7", "10.96.200.0/24"},
		{"::ffff:10.96.200.7", "10.96.200.0/24"}, // v4-mapped, as netlink may give it
		{"10.96.201.7", ""},
		{"fd00:200::1", "fd00:200::/64"},
		{"fd00:201::1", ""},
	} {
		p, ok := Excluded(netip.MustParseAddr(tc.addr), excl)
		if ok != (tc.want != "") || (ok && p.String() != tc.want) {
			t.Errorf("%s: %v %v, want %q", tc.addr, p, ok, tc.want)
		}
	}
	if _, ok := Excluded(netip.MustParseAddr("10.96.200.7"), nil); ok {
		t.Error("excluded by no CIDR")
	}
}
