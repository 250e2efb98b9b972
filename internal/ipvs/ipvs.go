// Package ipvs is the daemon's seam to the kernel's IP Virtual Server
// tables, which kube-proxy programs in IPVS mode: virtual servers (one per
// Service frontend), their real servers (the endpoints), the global
// timeouts, and the IPVS connection table (/proc/net/ip_vs_conn).
//
// Interface is small and goroutine-safe. The real adapter (New, Linux only)
// wraps github.com/moby/ipvs behind a mutex, checks that IPVS exists in the
// kernel before its first use and reports ErrUnavailable otherwise (moby/ipvs
// silently succeeds or panics without the ip_vs module), and bounds every
// kernel call by the caller's context. Fake is a stateful in-memory
// implementation that enforces the kernel's rules, for tests.
//
// Traps of github.com/moby/ipvs v1.1.0 that the real adapter works around:
//   - New runs `modprobe -va ip_vs` and resolves the "IPVS" netlink family
//     once per process; without ip_vs the family stays 0 for the life of
//     the process, writes (SetConfig, DelService) then return nil and do
//     nothing, GetServices returns an empty list, and GetConfig panics.
//     The adapter checks availability first and only then calls New.
//   - Resolving a generic netlink family by name makes the kernel load its
//     module (ip_vs has MODULE_ALIAS_GENL_FAMILY since 5.16), so the
//     availability check dumps the family list instead.
//   - Its receive loop retries forever on the socket's receive timeout, so
//     a lost reply hangs the call: every call runs in its own goroutine
//     and the caller waits only until its context is done.
//   - Handles are not goroutine-safe: one call at a time (a semaphore, so
//     waiting for it also honours the context).
package ipvs

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"time"
)

// ErrUnavailable is wrapped by every error that means "IPVS cannot be used
// on this node" (no ip_vs module, no permission to reach it). Callers turn
// it into a skip, not a failure: errors.Is(err, ErrUnavailable).
var ErrUnavailable = errors.New("IPVS unavailable")

// ErrNotFound is wrapped when a virtual or real server to delete does not
// exist (the kernel's ESRCH / ENOENT).
var ErrNotFound = errors.New("not found")

// Unavailable returns an error wrapping ErrUnavailable with a reason:
// "IPVS unavailable: <reason>".
func Unavailable(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrUnavailable, fmt.Sprintf(format, args...))
}

// Protocols as kube-proxy programs them.
const (
	TCP  = "TCP"
	UDP  = "UDP"
	SCTP = "SCTP"
)

// MinUDPTimeout is the lowest UDP timeout the kernel accepts.
const MinUDPTimeout = time.Second

// VirtualServer is an IPVS service: a frontend address, port and protocol
// (kube-proxy never uses firewall marks, but other software may).
type VirtualServer struct {
	Address   netip.Addr `json:"address"`
	Protocol  string     `json:"protocol"` // TCP, UDP, SCTP
	Port      uint16     `json:"port"`
	FWMark    uint32     `json:"fwmark,omitempty"`
	Scheduler string     `json:"scheduler,omitempty"`
}

// Key is the virtual server's identity, "UDP/10.96.0.10:53" or
// "TCP/[fd00::a]:443" ("FWM/<mark>" for a firewall-mark service).
func (v VirtualServer) Key() string {
	if v.FWMark != 0 {
		return fmt.Sprintf("FWM/%d", v.FWMark)
	}
	return v.Protocol + "/" + netip.AddrPortFrom(v.Address, v.Port).String()
}

// Same reports whether v and o are the same virtual server (identity only).
func (v VirtualServer) Same(o VirtualServer) bool {
	return v.FWMark == o.FWMark && v.Protocol == o.Protocol && v.Port == o.Port &&
		v.Address.Unmap() == o.Address.Unmap()
}

// RealServer is a destination of a virtual server.
type RealServer struct {
	Address netip.Addr `json:"address"`
	Port    uint16     `json:"port"`
	// Weight 0 means kube-proxy is draining it (graceful termination).
	Weight int `json:"weight"`
	// ActiveConns and InactiveConns are the kernel's connection counters.
	ActiveConns   int `json:"activeConns"`
	InactiveConns int `json:"inactiveConns"`
}

// AddrPort is the real server's address:port.
func (r RealServer) AddrPort() netip.AddrPort { return netip.AddrPortFrom(r.Address.Unmap(), r.Port) }

// Timeouts are IPVS's global connection timeouts, whole seconds. In
// SetTimeouts a zero field means "leave unchanged".
type Timeouts struct {
	TCP    time.Duration `json:"tcp"`
	TCPFin time.Duration `json:"tcpFin"`
	UDP    time.Duration `json:"udp"`
}

// Interface is the IPVS seam. Implementations are goroutine-safe and honour
// ctx's deadline. Every method returns an error wrapping ErrUnavailable when
// IPVS does not exist on the node.
type Interface interface {
	// VirtualServers lists every virtual server.
	VirtualServers(ctx context.Context) ([]VirtualServer, error)
	// RealServers lists the destinations of vs; ErrNotFound when vs does
	// not exist.
	RealServers(ctx context.Context, vs VirtualServer) ([]RealServer, error)
	// DeleteVirtualServer deletes vs (and its destinations); ErrNotFound
	// when it does not exist.
	DeleteVirtualServer(ctx context.Context, vs VirtualServer) error
	// DeleteRealServer deletes rs from vs; ErrNotFound when either does
	// not exist.
	DeleteRealServer(ctx context.Context, vs VirtualServer, rs RealServer) error
	// Timeouts returns the current global timeouts.
	Timeouts(ctx context.Context) (Timeouts, error)
	// SetTimeouts sets the non-zero fields of t; values must be whole
	// seconds and a non-zero UDP timeout must be at least MinUDPTimeout.
	SetTimeouts(ctx context.Context, t Timeouts) error
	// Connections streams the entries of the IPVS connection table whose
	// protocol is proto ("" for every protocol) to fn, without holding
	// the table in memory (it can have millions of entries). An error
	// from fn stops the walk and is returned.
	Connections(ctx context.Context, proto string, fn func(Conn) error) error
}

// ValidateTimeouts checks t the way the kernel and ipvsadm do.
func ValidateTimeouts(t Timeouts) error {
	for _, f := range []struct {
		name string
		d    time.Duration
	}{{"tcp", t.TCP}, {"tcpFin", t.TCPFin}, {"udp", t.UDP}} {
		if f.d < 0 {
			return fmt.Errorf("%s timeout %s is negative", f.name, f.d)
		}
		if f.d%time.Second != 0 {
			return fmt.Errorf("%s timeout %s is not a whole number of seconds", f.name, f.d)
		}
		if f.d > time.Duration(1<<31-1)*time.Second {
			return fmt.Errorf("%s timeout %s is too large", f.name, f.d)
		}
	}
	if t.UDP != 0 && t.UDP < MinUDPTimeout {
		return fmt.Errorf("udp timeout %s is below the kernel minimum of %s", t.UDP, MinUDPTimeout)
	}
	return nil
}
