package ipvs

import (
	"context"
	"fmt"
	"sort"
	"sync"
	"time"
)

// Fake is a stateful in-memory IPVS for tests. It enforces the kernel's
// rules: adding an existing virtual or real server fails (EEXIST), deleting
// a missing one fails with ErrNotFound (ESRCH/ENOENT), timeouts must be
// whole seconds and a UDP timeout at least 1 s, and zero timeout fields
// leave the current value unchanged. Deleting a virtual server removes its
// real servers but, as in the kernel, not its entries in the connection
// table (they expire on their own).
type Fake struct {
	mu       sync.Mutex
	services []*fakeService
	timeouts Timeouts
	conns    []Conn
	// unavailable, when set, makes every call fail with ErrUnavailable.
	unavailable string
	errs        map[string]error
	calls       map[string]int
}

type fakeService struct {
	vs    VirtualServer
	dests []RealServer
}

var _ Interface = (*Fake)(nil)

// DefaultTimeouts are the kernel's defaults (ipvsadm -L --timeout:
// 900 120 300).
var DefaultTimeouts = Timeouts{TCP: 900 * time.Second, TCPFin: 120 * time.Second, UDP: 300 * time.Second}

// NewFake returns an empty IPVS with the kernel's default timeouts.
func NewFake() *Fake {
	return &Fake{timeouts: DefaultTimeouts, errs: map[string]error{}, calls: map[string]int{}}
}

// SetUnavailable makes every call fail as if ip_vs were missing ("" undoes).
func (f *Fake) SetUnavailable(reason string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.unavailable = reason
}

// InjectError makes the named method ("VirtualServers", "DeleteRealServer",
// ...) return err until cleared with a nil err.
func (f *Fake) InjectError(method string, err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err == nil {
		delete(f.errs, method)
		return
	}
	f.errs[method] = err
}

// Calls returns how many times the named method was called.
func (f *Fake) Calls(method string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.calls[method]
}

// AddVirtualServer creates vs; it fails if it exists.
func (f *Fake) AddVirtualServer(vs VirtualServer) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.find(vs) != nil {
		return fmt.Errorf("add virtual server %s: file exists", vs.Key())
	}
	if vs.Protocol != TCP && vs.Protocol != UDP && vs.Protocol != SCTP && vs.FWMark == 0 {
		return fmt.Errorf("add virtual server %s: unknown protocol", vs.Key())
	}
	f.services = append(f.services, &fakeService{vs: vs})
	return nil
}

// AddRealServer adds rs to vs; it fails if vs is missing or rs exists.
func (f *Fake) AddRealServer(vs VirtualServer, rs RealServer) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	s := f.find(vs)
	if s == nil {
		return fmt.Errorf("add real server to %s: %w: no such service", vs.Key(), ErrNotFound)
	}
	for _, d := range s.dests {
		if d.AddrPort() == rs.AddrPort() {
			return fmt.Errorf("add real server %s to %s: file exists", rs.AddrPort(), vs.Key())
		}
	}
	s.dests = append(s.dests, rs)
	return nil
}

// AddConn adds entries to the connection table.
func (f *Fake) AddConn(c ...Conn) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.conns = append(f.conns, c...)
}

// RemoveConns removes the connection-table entries for which match is true
// (what expiry or expire_nodest_conn would do) and returns how many.
func (f *Fake) RemoveConns(match func(Conn) bool) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	kept := f.conns[:0]
	n := 0
	for _, c := range f.conns {
		if match(c) {
			n++
			continue
		}
		kept = append(kept, c)
	}
	f.conns = kept
	return n
}

func (f *Fake) find(vs VirtualServer) *fakeService {
	for _, s := range f.services {
		if s.vs.Same(vs) {
			return s
		}
	}
	return nil
}

// enter records a call and returns the injected or unavailability error.
func (f *Fake) enter(ctx context.Context, method string) error {
	f.calls[method]++
	if err := ctx.Err(); err != nil {
		return err
	}
	if f.unavailable != "" {
		return Unavailable("%s", f.unavailable)
	}
	return f.errs[method]
}

// Available reports ErrUnavailable when SetUnavailable was called, like
// the real adapter's availability check.
func (f *Fake) Available(ctx context.Context) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.enter(ctx, "Available")
}

// VirtualServers implements Interface.
func (f *Fake) VirtualServers(ctx context.Context) ([]VirtualServer, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.enter(ctx, "VirtualServers"); err != nil {
		return nil, err
	}
	out := make([]VirtualServer, 0, len(f.services))
	for _, s := range f.services {
		out = append(out, s.vs)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Key() < out[j].Key() })
	return out, nil
}

// RealServers implements Interface.
func (f *Fake) RealServers(ctx context.Context, vs VirtualServer) ([]RealServer, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.enter(ctx, "RealServers"); err != nil {
		return nil, err
	}
	s := f.find(vs)
	if s == nil {
		return nil, fmt.Errorf("list real servers of %s: %w: no such service", vs.Key(), ErrNotFound)
	}
	return append([]RealServer(nil), s.dests...), nil
}

// DeleteVirtualServer implements Interface.
func (f *Fake) DeleteVirtualServer(ctx context.Context, vs VirtualServer) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.enter(ctx, "DeleteVirtualServer"); err != nil {
		return err
	}
	for i, s := range f.services {
		if s.vs.Same(vs) {
			f.services = append(f.services[:i], f.services[i+1:]...)
			return nil
		}
	}
	return fmt.Errorf("delete virtual server %s: %w: no such process", vs.Key(), ErrNotFound)
}

// DeleteRealServer implements Interface.
func (f *Fake) DeleteRealServer(ctx context.Context, vs VirtualServer, rs RealServer) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.enter(ctx, "DeleteRealServer"); err != nil {
		return err
	}
	s := f.find(vs)
	if s == nil {
		return fmt.Errorf("delete real server %s of %s: %w: no such process", rs.AddrPort(), vs.Key(), ErrNotFound)
	}
	for i, d := range s.dests {
		if d.AddrPort() == rs.AddrPort() {
			s.dests = append(s.dests[:i], s.dests[i+1:]...)
			return nil
		}
	}
	return fmt.Errorf("delete real server %s of %s: %w: no such file or directory", rs.AddrPort(), vs.Key(), ErrNotFound)
}

// Timeouts implements Interface.
func (f *Fake) Timeouts(ctx context.Context) (Timeouts, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.enter(ctx, "Timeouts"); err != nil {
		return Timeouts{}, err
	}
	return f.timeouts, nil
}

// SetTimeouts implements Interface.
func (f *Fake) SetTimeouts(ctx context.Context, t Timeouts) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.enter(ctx, "SetTimeouts"); err != nil {
		return err
	}
	if err := ValidateTimeouts(t); err != nil {
		return fmt.Errorf("set IPVS timeouts: invalid argument: %w", err)
	}
	if t.TCP != 0 {
		f.timeouts.TCP = t.TCP
	}
	if t.TCPFin != 0 {
		f.timeouts.TCPFin = t.TCPFin
	}
	if t.UDP != 0 {
		f.timeouts.UDP = t.UDP
	}
	return nil
}

// Connections implements Interface.
func (f *Fake) Connections(ctx context.Context, proto string, fn func(Conn) error) error {
	f.mu.Lock()
	if err := f.enter(ctx, "Connections"); err != nil {
		f.mu.Unlock()
		return err
	}
	var out []Conn
	for _, c := range f.conns {
		if proto == "" || c.Protocol == proto {
			out = append(out, c)
		}
	}
	f.mu.Unlock()
	for _, c := range out {
		if err := fn(c); err != nil {
			return err
		}
	}
	return nil
}
