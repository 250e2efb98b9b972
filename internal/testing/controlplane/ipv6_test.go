package controlplane

import (
	"context"
	"net"
	"os/exec"
	"strings"
	"testing"
	"time"
)

func TestIsIPv6CIDR(t *testing.T) {
	for _, c := range []struct {
		cidr   string
		v6, ok bool
	}{
		{ServiceCIDR, false, true},
		{ServiceCIDR6, true, true},
		{"fd00::/108", true, true},
		{"::ffff:10.96.0.0/112", false, true}, // IPv4-mapped: an IPv4 range
		{"10.96.0.0", false, false},
		{"", false, false},
	} {
		v6, err := isIPv6CIDR(c.cidr)
		if v6 != c.v6 || (err == nil) != c.ok {
			t.Errorf("isIPv6CIDR(%q) = %v, %v; want %v, ok %v", c.cidr, v6, err, c.v6, c.ok)
		}
	}
}

// TestNetNSEnableIPv6 checks, on the real kernel and without the control
// plane's binaries, that EnableIPv6 makes Address6 usable at once (no
// duplicate address detection to wait for) inside the namespace, with an
// IPv6 default route, and nothing of it outside.
func TestNetNSEnableIPv6(t *testing.T) {
	requireRoot(t)
	if _, err := exec.LookPath("ip"); err != nil {
		skipOrFail(t, "needs the ip command (Debian package iproute2)")
	}
	ns := NewNetNS(t)
	if ns.Address6 != "" {
		t.Fatalf("Address6 %q before EnableIPv6", ns.Address6)
	}
	ns.EnableIPv6(t)
	if ns.Address6 != Address6ULA {
		t.Fatalf("Address6 = %q", ns.Address6)
	}
	l, err := ns.Listen("tcp", net.JoinHostPort(ns.Address6, "0"))
	if err != nil {
		t.Fatalf("listen on %s in the namespace: %v", ns.Address6, err)
	}
	defer l.Close()
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c, err := ns.DialContext(ctx, "tcp", l.Addr().String())
	if err != nil {
		diag, _ := exec.Command("sh", "-c", "ip -n "+ns.Name+" -6 addr; ip -n "+ns.Name+" -6 route get "+ns.Address6+"; ip -n "+ns.Name+" -6 route show table all; ip -n "+ns.Name+" -6 neigh").CombinedOutput()
		t.Fatalf("dial %s in the namespace: %v\n%s", l.Addr(), err, diag)
	}
	c.Close()
	out, err := exec.Command("ip", "-n", ns.Name, "-6", "route", "show", "default").CombinedOutput()
	if err != nil || !strings.Contains(string(out), "dev veth0") {
		t.Fatalf("no IPv6 default route in the namespace: %v: %s", err, out)
	}
	// The host's namespace has no such address.
	if out, err := exec.Command("ip", "-6", "addr", "show").CombinedOutput(); err != nil || strings.Contains(string(out), Address6ULA+"/") {
		t.Fatalf("host addresses: %v: %s", err, out)
	}
}
