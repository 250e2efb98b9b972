package ipvs

import (
	"context"
	"errors"
	"net/netip"
	"testing"
	"time"
)

var (
	dnsUDP = VirtualServer{Address: netip.MustParseAddr("10.96.0.10"), Protocol: UDP, Port: 53}
	dnsTCP = VirtualServer{Address: netip.MustParseAddr("10.96.0.10"), Protocol: TCP, Port: 53}
	pod1   = RealServer{Address: netip.MustParseAddr("10.244.0.12"), Port: 53, Weight: 1}
)

func TestFakeKernelRules(t *testing.T) {
	ctx := context.Background()
	f := NewFake()
	if err := f.AddVirtualServer(dnsUDP); err != nil {
		t.Fatal(err)
	}
	if err := f.AddVirtualServer(dnsUDP); err == nil {
		t.Error("adding an existing virtual server must fail")
	}
	if err := f.AddRealServer(dnsTCP, pod1); !errors.Is(err, ErrNotFound) {
		t.Errorf("adding a real server to a missing service: %v", err)
	}
	if err := f.AddRealServer(dnsUDP, pod1); err != nil {
		t.Fatal(err)
	}
	if err := f.AddRealServer(dnsUDP, pod1); err == nil {
		t.Error("adding an existing real server must fail")
	}
	if err := f.DeleteVirtualServer(ctx, dnsTCP); !errors.Is(err, ErrNotFound) {
		t.Errorf("deleting a missing service: %v, want ErrNotFound", err)
	}
	other := pod1
	other.Port = 54
	if err := f.DeleteRealServer(ctx, dnsUDP, other); !errors.Is(err, ErrNotFound) {
		t.Errorf("deleting a missing real server: %v, want ErrNotFound", err)
	}
	if err := f.DeleteRealServer(ctx, dnsUDP, pod1); err != nil {
		t.Fatal(err)
	}
	rs, err := f.RealServers(ctx, dnsUDP)
	if err != nil || len(rs) != 0 {
		t.Fatalf("after delete: %v %v", rs, err)
	}
	f.AddConn(Conn{Protocol: UDP, Virtual: netip.AddrPortFrom(dnsUDP.Address, 53), Dest: pod1.AddrPort()})
	if err := f.DeleteVirtualServer(ctx, dnsUDP); err != nil {
		t.Fatal(err)
	}
	if vs, _ := f.VirtualServers(ctx); len(vs) != 0 {
		t.Fatalf("services left: %v", vs)
	}
	n := 0
	if err := f.Connections(ctx, UDP, func(Conn) error { n++; return nil }); err != nil || n != 1 {
		t.Fatalf("connection entries must outlive their service, as in the kernel: %d, %v", n, err)
	}
	stop := errors.New("stop")
	if err := f.Connections(ctx, "", func(Conn) error { return stop }); !errors.Is(err, stop) {
		t.Fatalf("callback error not returned: %v", err)
	}
}

func TestFakeTimeouts(t *testing.T) {
	ctx := context.Background()
	f := NewFake()
	got, err := f.Timeouts(ctx)
	if err != nil || got != DefaultTimeouts {
		t.Fatalf("defaults = %+v, %v", got, err)
	}
	for _, bad := range []Timeouts{
		{UDP: 500 * time.Millisecond},
		{UDP: 1500 * time.Millisecond},
		{TCP: -time.Second},
	} {
		if err := f.SetTimeouts(ctx, bad); err == nil {
			t.Errorf("SetTimeouts(%+v) must fail", bad)
		}
	}
	if err := f.SetTimeouts(ctx, Timeouts{UDP: time.Second}); err != nil {
		t.Fatal(err)
	}
	got, _ = f.Timeouts(ctx)
	want := DefaultTimeouts
	want.UDP = time.Second
	if got != want {
		t.Fatalf("zero fields must be unchanged: %+v, want %+v", got, want)
	}
}

func TestFakeUnavailableAndInjectedErrors(t *testing.T) {
	ctx := context.Background()
	f := NewFake()
	f.SetUnavailable("no ip_vs module")
	if _, err := f.VirtualServers(ctx); !errors.Is(err, ErrUnavailable) || err.Error() != "IPVS unavailable: no ip_vs module" {
		t.Fatalf("err = %v", err)
	}
	f.SetUnavailable("")
	boom := errors.New("boom")
	f.InjectError("Timeouts", boom)
	if _, err := f.Timeouts(ctx); !errors.Is(err, boom) {
		t.Fatalf("err = %v", err)
	}
	f.InjectError("Timeouts", nil)
	if _, err := f.Timeouts(ctx); err != nil {
		t.Fatal(err)
	}
	if f.Calls("Timeouts") != 2 {
		t.Fatalf("calls = %d", f.Calls("Timeouts"))
	}
}

func TestVirtualServerKey(t *testing.T) {
	for _, c := range []struct {
		vs   VirtualServer
		want string
	}{
		{dnsUDP, "UDP/10.96.0.10:53"},
		{VirtualServer{Address: netip.MustParseAddr("fd00::a"), Protocol: TCP, Port: 443}, "TCP/[fd00::a]:443"},
		{VirtualServer{FWMark: 7}, "FWM/7"},
	} {
		if got := c.vs.Key(); got != c.want {
			t.Errorf("Key = %q, want %q", got, c.want)
		}
	}
}
