//go:build linux

package ipvs

import (
	"github.com/remediate-dev/remediate/internal/netnstest"

	"context"
	"errors"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	mobyipvs "github.com/moby/ipvs"
	"net/netip"
)

func ipvsLoaded() bool {
	_, err := os.Stat("/proc/net/ip_vs")
	return err == nil
}

// newTestNetns creates a network namespace for the test and deletes it at
// the end; it returns its path.
func newTestNetns(t *testing.T) string {
	t.Helper()
	name := netnstest.New(t)
	return "/var/run/netns/" + name
}

// TestRealAdapterReportsUnavailable runs the real adapter against this
// kernel, which has no ip_vs: every call must fail with ErrUnavailable and a
// readable reason, never succeed silently.
func TestRealAdapterReportsUnavailable(t *testing.T) {
	ns := newTestNetns(t)
	if ipvsLoaded() {
		t.Skip("ip_vs is loaded on this kernel; this test covers kernels without it")
	}
	a := New(Options{ProcRoot: "/proc", NetNSPath: ns})
	defer a.Close(context.Background())
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	err := a.Available(ctx)
	if !errors.Is(err, ErrUnavailable) {
		t.Fatalf("Available = %v, want ErrUnavailable", err)
	}
	msg := err.Error()
	t.Logf("reason: %s", msg)
	if !strings.HasPrefix(msg, "IPVS unavailable: ") || !strings.Contains(msg, "/proc/net/ip_vs") || !strings.Contains(msg, `"IPVS"`) {
		t.Errorf("reason should name both checks: %q", msg)
	}
	checks := map[string]error{}
	_, checks["VirtualServers"] = a.VirtualServers(ctx)
	_, checks["RealServers"] = a.RealServers(ctx, dnsUDP)
	checks["DeleteVirtualServer"] = a.DeleteVirtualServer(ctx, dnsUDP)
	checks["DeleteRealServer"] = a.DeleteRealServer(ctx, dnsUDP, pod1)
	_, checks["Timeouts"] = a.Timeouts(ctx)
	checks["SetTimeouts"] = a.SetTimeouts(ctx, Timeouts{UDP: 30 * time.Second})
	checks["Connections"] = a.Connections(ctx, UDP, func(Conn) error { return nil })
	for m, err := range checks {
		if !errors.Is(err, ErrUnavailable) {
			t.Errorf("%s: err = %v, want ErrUnavailable", m, err)
		}
	}
	if a.h != nil {
		t.Error("no moby/ipvs handle may be opened when IPVS is unavailable")
	}
}

// TestMobyGetConfigPanicRecovered shows the trap the adapter guards
// against: without ip_vs, moby/ipvs.New succeeds and GetConfig panics;
// getConfig turns the panic into an error.
func TestMobyGetConfigPanicRecovered(t *testing.T) {
	ns := newTestNetns(t)
	if ipvsLoaded() {
		t.Skip("ip_vs is loaded; the panic happens only without it")
	}
	// moby/ipvs runs `modprobe -va ip_vs` once: make sure it cannot load
	// anything on this machine before letting it.
	if out, err := exec.Command("modprobe", "-n", "ip_vs").CombinedOutput(); err == nil {
		t.Skipf("ip_vs module is installable here (%s); not letting moby/ipvs load it", strings.TrimSpace(string(out)))
	}
	h, err := mobyipvs.New(ns)
	if err != nil {
		t.Skipf("moby/ipvs.New: %v", err)
	}
	defer h.Close()
	c, err := getConfig(h)
	if err == nil {
		t.Fatalf("GetConfig without ip_vs returned %+v and no error", c)
	}
	t.Logf("recovered: %v", err)
	// And the trap itself: moby's writes report success.
	if err := h.SetConfig(&mobyipvs.Config{TimeoutUDP: 30 * time.Second}); err != nil {
		t.Logf("SetConfig returned %v (moby/ipvs changed behaviour?)", err)
	} else {
		t.Logf("moby/ipvs SetConfig without ip_vs returned nil: the silent success the adapter's check prevents")
	}
}

// TestDoBoundsHungCalls shows that a call hung in the kernel does not hang
// its caller nor the callers after it, and that a panic becomes an error.
func TestDoBoundsHungCalls(t *testing.T) {
	a := New(Options{})
	a.h = &mobyipvs.Handle{} // skip the availability check; fn never uses it
	release := make(chan struct{})
	ctx1, cancel1 := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel1()
	err := a.do(ctx1, "hung", func(*mobyipvs.Handle) error { <-release; return nil })
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("hung call: err = %v", err)
	}
	ctx2, cancel2 := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel2()
	err = a.do(ctx2, "next", func(*mobyipvs.Handle) error { return nil })
	if !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), "previous IPVS call") {
		t.Fatalf("call behind a hung one: err = %v", err)
	}
	close(release)
	ctx3, cancel3 := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel3()
	if err := a.do(ctx3, "after", func(*mobyipvs.Handle) error { return nil }); err != nil {
		t.Fatalf("after release: %v", err)
	}
	err = a.do(ctx3, "panics", func(*mobyipvs.Handle) error { panic("index out of range") })
	if err == nil || !strings.Contains(err.Error(), "panicked") {
		t.Fatalf("panic: err = %v", err)
	}
	if err := a.do(ctx3, "after panic", func(*mobyipvs.Handle) error { return nil }); err != nil {
		t.Fatalf("the semaphore must be released after a panic: %v", err)
	}
}

func TestMobyServiceKey(t *testing.T) {
	s, err := mobyService(dnsUDP)
	if err != nil || s.AddressFamily != 2 || s.Protocol != 17 || s.Port != 53 || s.Address.String() != "10.96.0.10" || len(s.Address) != 4 {
		t.Fatalf("IPv4 UDP key = %+v, %v", s, err)
	}
	v6 := VirtualServer{Address: netipMust("fd00::a"), Protocol: SCTP, Port: 9}
	s, err = mobyService(v6)
	if err != nil || s.AddressFamily != 10 || s.Protocol != 132 || s.Address.String() != "fd00::a" {
		t.Fatalf("IPv6 SCTP key = %+v, %v", s, err)
	}
	if s, err := mobyService(VirtualServer{FWMark: 5}); err != nil || s.FWMark != 5 {
		t.Fatalf("fwmark key = %+v, %v", s, err)
	}
	if _, err := mobyService(VirtualServer{Address: netipMust("10.0.0.1"), Protocol: "ICMP", Port: 1}); err == nil {
		t.Fatal("unknown protocol must fail")
	}
	// The conversion back is the identity on the key.
	s, _ = mobyService(dnsUDP)
	if got := toVirtualServer(s); !got.Same(dnsUDP) {
		t.Fatalf("round trip = %+v", got)
	}
}

func netipMust(s string) netip.Addr { return netip.MustParseAddr(s) }

// TestGenlFamilyDump checks the generic-netlink half of the availability
// check on this kernel: it finds a family that always exists ("nlctrl")
// by dumping, and does not find IPVS.
func TestGenlFamilyDump(t *testing.T) {
	ns := newTestNetns(t)
	if err := genlFamilyExists(ns, "nlctrl"); err != nil {
		t.Fatalf("nlctrl: %v", err)
	}
	if ipvsLoaded() {
		t.Skip("ip_vs loaded")
	}
	if err := genlFamilyExists(ns, "IPVS"); err == nil || err.Error() != "not registered" {
		t.Fatalf("IPVS: %v", err)
	}
}
