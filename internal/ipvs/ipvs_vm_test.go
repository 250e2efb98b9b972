//go:build linux

package ipvs

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/remediate-dev/remediate/internal/testing/vm"
)

// The TestVM* tests run only inside the IPVS test VM (make test-vm): a real
// kernel with ip_vs, the guest's root namespace as the node.

func vmCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func newVMAdapter(t *testing.T) *Handle {
	a := New(Options{ProcRoot: "/proc"})
	t.Cleanup(func() { _ = a.Close(context.Background()) })
	return a
}

// TestVMAdapterServers: virtual and real servers created by ipvsadm (as
// kube-proxy would) are listed by the adapter with the kernel's values,
// and its deletes remove exactly what they name, for TCP and UDP, IPv4 and
// IPv6; deleting what is gone is ErrNotFound.
func TestVMAdapterServers(t *testing.T) {
	vm.Require(t)
	ctx := vmCtx(t)
	a := newVMAdapter(t)
	if err := a.Available(ctx); err != nil {
		t.Fatalf("Available: %v", err)
	}
	for _, fam := range []struct {
		vip      string
		rs1, rs2 string
	}{{"10.96.0.10", "10.244.0.12", "10.244.1.21"}, {"fd00:96::10", "fd00:244::12", "fd00:244::21"}} {
		for _, proto := range []string{TCP, UDP} {
			t.Run(proto+"/"+fam.vip, func(t *testing.T) {
				vs := VirtualServer{Address: netip.MustParseAddr(fam.vip), Protocol: proto, Port: 53}
				other := VirtualServer{Address: netip.MustParseAddr(fam.vip), Protocol: proto, Port: 54}
				r1 := netip.AddrPortFrom(netip.MustParseAddr(fam.rs1), 5353)
				r2 := netip.AddrPortFrom(netip.MustParseAddr(fam.rs2), 5353)
				vm.IPVSService(t, proto, netip.AddrPortFrom(vs.Address, 53), r1, r2)
				vm.IPVSService(t, proto, netip.AddrPortFrom(other.Address, 54), r1)
				t.Cleanup(func() { vm.Sh(t, "ipvsadm", "-C") })

				vss, err := a.VirtualServers(ctx)
				if err != nil {
					t.Fatal(err)
				}
				var got []string
				for _, v := range vss {
					got = append(got, v.Key()+" "+v.Scheduler)
				}
				want := []string{vs.Key() + " rr", other.Key() + " rr"}
				if strings.Join(sortedCopy(got), ",") != strings.Join(sortedCopy(want), ",") {
					t.Fatalf("VirtualServers = %v, want %v", got, want)
				}
				rss, err := a.RealServers(ctx, vs)
				if err != nil {
					t.Fatal(err)
				}
				if len(rss) != 2 || !hasAddrPort(rss, r1) || !hasAddrPort(rss, r2) || rss[0].Weight != 1 {
					t.Fatalf("RealServers = %+v, want %s and %s weight 1", rss, r1, r2)
				}
				// IPv4-mapped input names the same IPv4 server.
				if vs.Address.Is4() {
					mapped := vs
					mapped.Address = netip.AddrFrom16(vs.Address.As16())
					if rs, err := a.RealServers(ctx, mapped); err != nil || len(rs) != 2 {
						t.Fatalf("RealServers(%s as IPv4-mapped) = %v, %v", vs.Key(), rs, err)
					}
				}

				if err := a.DeleteRealServer(ctx, vs, RealServer{Address: r1.Addr(), Port: r1.Port()}); err != nil {
					t.Fatal(err)
				}
				out := vm.Sh(t, "ipvsadm", "-Ln")
				if strings.Count(out, ipvsadmAddr(r1)) != 1 || strings.Count(out, ipvsadmAddr(r2)) != 1 {
					t.Fatalf("after deleting %s from %s only (the other service keeps it):\n%s", r1, vs.Key(), out)
				}
				err = a.DeleteRealServer(ctx, vs, RealServer{Address: r1.Addr(), Port: r1.Port()})
				if !errors.Is(err, ErrNotFound) {
					t.Fatalf("deleting it again: %v, want ErrNotFound", err)
				}
				if err := a.DeleteVirtualServer(ctx, vs); err != nil {
					t.Fatal(err)
				}
				vss, _ = a.VirtualServers(ctx)
				if len(vss) != 1 || !vss[0].Same(other) {
					t.Fatalf("after deleting %s: %v", vs.Key(), vss)
				}
				if err := a.DeleteVirtualServer(ctx, vs); !errors.Is(err, ErrNotFound) {
					t.Fatalf("deleting it again: %v, want ErrNotFound", err)
				}
				if err := a.DeleteRealServer(ctx, vs, RealServer{Address: r2.Addr(), Port: r2.Port()}); !errors.Is(err, ErrNotFound) {
					t.Fatalf("real server of a deleted virtual server: %v, want ErrNotFound", err)
				}
				if _, err := a.RealServers(ctx, vs); !errors.Is(err, ErrNotFound) {
					t.Fatalf("RealServers of a deleted virtual server: %v, want ErrNotFound", err)
				}
			})
		}
	}
}

func sortedCopy(s []string) []string {
	c := append([]string(nil), s...)
	for i := range c {
		for j := i + 1; j < len(c); j++ {
			if c[j] < c[i] {
				c[i], c[j] = c[j], c[i]
			}
		}
	}
	return c
}

func hasAddrPort(rss []RealServer, ap netip.AddrPort) bool {
	for _, r := range rss {
		if r.AddrPort() == ap {
			return true
		}
	}
	return false
}

// ipvsadmAddr is how ipvsadm -Ln prints an address:port.
func ipvsadmAddr(ap netip.AddrPort) string {
	if ap.Addr().Is6() {
		return fmt.Sprintf("[%s]:%d", ap.Addr(), ap.Port())
	}
	return ap.String()
}

// TestVMAdapterTimeouts: the adapter reads the kernel's defaults, sets
// only the non-zero fields, and ipvsadm sees the same values.
func TestVMAdapterTimeouts(t *testing.T) {
	vm.Require(t)
	ctx := vmCtx(t)
	a := newVMAdapter(t)
	got, err := a.Timeouts(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if got != (Timeouts{TCP: 900 * time.Second, TCPFin: 120 * time.Second, UDP: 300 * time.Second}) {
		t.Fatalf("Timeouts = %+v, want the kernel's 900/120/300", got)
	}
	if err := a.SetTimeouts(ctx, Timeouts{UDP: 30 * time.Second}); err != nil {
		t.Fatal(err)
	}
	if got, _ := a.Timeouts(ctx); got != (Timeouts{TCP: 900 * time.Second, TCPFin: 120 * time.Second, UDP: 30 * time.Second}) {
		t.Fatalf("after setting UDP only: %+v", got)
	}
	if out := vm.Sh(t, "ipvsadm", "-L", "--timeout"); !strings.Contains(out, "900 120 30") {
		t.Fatalf("ipvsadm sees %q", out)
	}
	if err := a.SetTimeouts(ctx, Timeouts{TCP: 600 * time.Second, TCPFin: 60 * time.Second}); err != nil {
		t.Fatal(err)
	}
	if out := vm.Sh(t, "ipvsadm", "-L", "--timeout"); !strings.Contains(out, "600 60 30") {
		t.Fatalf("ipvsadm sees %q", out)
	}
	// Refused before the kernel: below the minimum, fractions.
	for _, bad := range []Timeouts{{UDP: 500 * time.Millisecond}, {TCP: 1500 * time.Millisecond}} {
		if err := a.SetTimeouts(ctx, bad); err == nil {
			t.Errorf("SetTimeouts(%+v) accepted", bad)
		}
	}
	if got, _ := a.Timeouts(ctx); got.UDP != 30*time.Second || got.TCP != 600*time.Second {
		t.Fatalf("a refused set changed the kernel: %+v", got)
	}
}

// TestVMConnTable: real TCP and UDP connections through IPVS NAT services
// (IPv4 and IPv6) appear in /proc/net/ip_vs_conn, parsed with the right
// client, virtual, destination, state and expiry, and agree with
// `ipvsadm -Lnc`.
func TestVMConnTable(t *testing.T) {
	vm.Require(t)
	ctx := vmCtx(t)
	vip4, vip6 := vm.VIPDNS, vm.VIPDNS6
	lab := vm.SharedLab(t)
	client, b1 := lab.Hosts["client"], lab.Hosts["b1"]
	vm.Serve(t, b1, 5353)
	a := newVMAdapter(t)

	type flow struct {
		proto  string
		client netip.AddrPort
		vip    netip.AddrPort
		dest   netip.AddrPort
	}
	var flows []flow
	for _, v := range []struct{ vip, src, dst netip.Addr }{{vip4, client.V4, b1.V4}, {vip6, client.V6, b1.V6}} {
		vipUDP, vipTCP := netip.AddrPortFrom(v.vip, 53), netip.AddrPortFrom(v.vip, 80)
		dst := netip.AddrPortFrom(v.dst, 5353)
		vm.IPVSService(t, UDP, vipUDP, dst)
		vm.IPVSService(t, TCP, vipTCP, dst)
		port := vm.ClientPort()
		u := vm.NewUDPClient(t, client, port, vipUDP)
		if got, err := u.Query(3 * time.Second); err != nil || got != "b1" {
			t.Fatalf("UDP query to %s: %q, %v", vipUDP, got, err)
		}
		name, c := vm.TCPConnect(t, client, vipTCP)
		if name != "b1" {
			t.Fatalf("TCP to %s answered by %q", vipTCP, name)
		}
		tcpSrc := netip.MustParseAddrPort(c.LocalAddr().String())
		flows = append(flows,
			flow{UDP, netip.AddrPortFrom(v.src, uint16(port)), vipUDP, dst},
			flow{TCP, netip.AddrPortFrom(tcpSrc.Addr().Unmap(), tcpSrc.Port()), vipTCP, dst})
	}

	conns, err := ReadConns(ctx, "/proc", "")
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("ipvsadm -Lnc:\n%s", vm.Sh(t, "ipvsadm", "-Lnc"))
	for _, f := range flows {
		var found *Conn
		for i, c := range conns {
			if c.Protocol == f.proto && c.Client == f.client && c.Virtual == f.vip {
				found = &conns[i]
			}
		}
		if found == nil {
			t.Errorf("%s %s -> %s: not in the parsed table %+v", f.proto, f.client, f.vip, conns)
			continue
		}
		if found.Dest != f.dest {
			t.Errorf("%s %s: dest %s, want %s", f.proto, f.client, found.Dest, f.dest)
		}
		wantState, maxExp := "UDP", 300*time.Second
		if f.proto == TCP {
			wantState, maxExp = "ESTABLISHED", 900*time.Second
		}
		if found.State != wantState || found.Expires <= 0 || found.Expires > maxExp || found.Template() {
			t.Errorf("%s %s: state %q expires %s template %v", f.proto, f.client, found.State, found.Expires, found.Template())
		}
	}
	// The adapter's streaming walk with a protocol filter sees the same.
	n := 0
	if err := a.Connections(ctx, UDP, func(c Conn) error {
		if c.Protocol != UDP {
			t.Errorf("UDP filter passed %+v", c)
		}
		n++
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if n != 2 {
		t.Errorf("UDP entries = %d, want 2 (one per family)", n)
	}
	// ipvsadm agrees on the number of entries.
	lines := 0
	for _, l := range strings.Split(vm.Sh(t, "ipvsadm", "-Lnc"), "\n") {
		if strings.HasPrefix(l, "TCP ") || strings.HasPrefix(l, "UDP ") {
			lines++
		}
	}
	if lines != len(conns) {
		t.Errorf("ipvsadm -Lnc lists %d entries, parsed %d", lines, len(conns))
	}
}
