//go:build linux

// Package conntracktest helps other packages test against the real kernel
// conntrack table: a network namespace owned by the test and entries created
// in it over netlink (with github.com/ti-mo/conntrack, an implementation
// independent of the adapter under test). On any OS (flows.go): flows and a
// node for tests with the fake (conntrack.Fake).
package conntracktest

import (
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"sync/atomic"
	"testing"

	"github.com/mdlayher/netlink"
	ticonntrack "github.com/ti-mo/conntrack"

	"github.com/remediate-dev/remediate/internal/conntrack"
)

var counter atomic.Int32

// NetNS creates a network namespace that is deleted when the test ends and
// returns an open file descriptor of it. It skips the test when not root,
// without iproute2, or without nf_conntrack.
func NetNS(tb testing.TB) int {
	tb.Helper()
	if os.Geteuid() != 0 {
		tb.Skip("needs root: creates a network namespace and conntrack entries in it")
	}
	if err := conntrack.Available("/proc"); err != nil {
		tb.Skipf("needs nf_conntrack: %v", err)
	}
	if _, err := exec.LookPath("ip"); err != nil {
		tb.Skip("needs iproute2 (ip)")
	}
	name := fmt.Sprintf("rmd-ctt-%d-%d", os.Getpid(), counter.Add(1))
	if out, err := exec.Command("ip", "netns", "add", name).CombinedOutput(); err != nil {
		tb.Fatalf("ip netns add %s: %v: %s", name, err, out)
	}
	f, err := os.Open(filepath.Join("/run/netns", name))
	if err != nil {
		_ = exec.Command("ip", "netns", "del", name).Run()
		tb.Fatalf("open netns: %v", err)
	}
	tb.Cleanup(func() {
		f.Close()
		if out, err := exec.Command("ip", "netns", "del", name).CombinedOutput(); err != nil {
			tb.Errorf("ip netns del %s: %v: %s", name, err, out)
		}
	})
	return int(f.Fd())
}

const statusConfirmed = 1 << 3 // IPS_CONFIRMED

// Create creates the flows in the namespace netnsFD with a 300 s timeout,
// with their status bits (SEEN_REPLY, ASSURED) and TCP state when set.
func Create(tb testing.TB, netnsFD int, flows ...conntrack.Flow) {
	tb.Helper()
	c, err := ticonntrack.Dial(&netlink.Config{NetNS: netnsFD})
	if err != nil {
		tb.Fatalf("conntrack dial: %v", err)
	}
	defer c.Close()
	for _, f := range flows {
		var t ticonntrack.Flow
		t.Timeout = 300
		t.TupleOrig.IP.SourceAddress = f.OrigSrc.Addr()
		t.TupleOrig.IP.DestinationAddress = f.OrigDst.Addr()
		t.TupleOrig.Proto.Protocol = f.Proto
		t.TupleOrig.Proto.SourcePort = f.OrigSrc.Port()
		t.TupleOrig.Proto.DestinationPort = f.OrigDst.Port()
		t.TupleReply.IP.SourceAddress = f.ReplySrc.Addr()
		t.TupleReply.IP.DestinationAddress = f.ReplyDst.Addr()
		t.TupleReply.Proto.Protocol = f.Proto
		t.TupleReply.Proto.SourcePort = f.ReplySrc.Port()
		t.TupleReply.Proto.DestinationPort = f.ReplyDst.Port()
		if f.Status != 0 {
			// The kernel only lets ctnetlink set SEEN_REPLY and ASSURED,
			// and refuses a status without CONFIRMED (the new entry
			// already has it).
			t.Status = ticonntrack.Status(f.Status | statusConfirmed)
		}
		if f.Proto == conntrack.ProtoTCP && f.TCPState != 0 {
			t.ProtoInfo.TCP = &ticonntrack.ProtoInfoTCP{State: f.TCPState}
		}
		if err := c.Create(t); err != nil {
			tb.Fatalf("create %s: %v", f, err)
		}
	}
}

// Table lists the namespace's entries (small tables only: ti-mo's Dump
// holds them all in memory).
func Table(tb testing.TB, netnsFD int) []conntrack.Flow {
	tb.Helper()
	c, err := ticonntrack.Dial(&netlink.Config{NetNS: netnsFD})
	if err != nil {
		tb.Fatalf("conntrack dial: %v", err)
	}
	defer c.Close()
	flows, err := c.Dump(nil)
	if err != nil {
		tb.Fatalf("conntrack dump: %v", err)
	}
	out := make([]conntrack.Flow, 0, len(flows))
	for _, t := range flows {
		out = append(out, conntrack.Flow{
			Proto:    t.TupleOrig.Proto.Protocol,
			OrigSrc:  addrPort(t.TupleOrig.IP.SourceAddress, t.TupleOrig.Proto.SourcePort),
			OrigDst:  addrPort(t.TupleOrig.IP.DestinationAddress, t.TupleOrig.Proto.DestinationPort),
			ReplySrc: addrPort(t.TupleReply.IP.SourceAddress, t.TupleReply.Proto.SourcePort),
			ReplyDst: addrPort(t.TupleReply.IP.DestinationAddress, t.TupleReply.Proto.DestinationPort),
			Zone:     t.Zone,
			ID:       t.ID,
		})
	}
	return out
}

func addrPort(a netip.Addr, p uint16) netip.AddrPort { return netip.AddrPortFrom(a, p) }
