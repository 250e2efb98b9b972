//go:build !linux

package ipvs

import "context"

// Handle is the real adapter; IPVS exists only on Linux, so on this platform
// every call returns ErrUnavailable.
type Handle struct{}

var _ Interface = (*Handle)(nil)

// New returns the adapter, which on this platform is always unavailable.
func New(Options) *Handle { return &Handle{} }

// Close does nothing.
func (a *Handle) Close(context.Context) error { return nil }

func errNotLinux() error { return Unavailable("IPVS exists only on Linux") }

// Available implements the Linux method: always ErrUnavailable here.
func (a *Handle) Available(context.Context) error { return errNotLinux() }

// VirtualServers implements Interface.
func (a *Handle) VirtualServers(context.Context) ([]VirtualServer, error) { return nil, errNotLinux() }

// RealServers implements Interface.
func (a *Handle) RealServers(context.Context, VirtualServer) ([]RealServer, error) {
	return nil, errNotLinux()
}

// DeleteVirtualServer implements Interface.
func (a *Handle) DeleteVirtualServer(context.Context, VirtualServer) error { return errNotLinux() }

// DeleteRealServer implements Interface.
func (a *Handle) DeleteRealServer(context.Context, VirtualServer, RealServer) error {
	return errNotLinux()
}

// Timeouts implements Interface.
func (a *Handle) Timeouts(context.Context) (Timeouts, error) { return Timeouts{}, errNotLinux() }

// SetTimeouts implements Interface.
func (a *Handle) SetTimeouts(context.Context, Timeouts) error { return errNotLinux() }

// Connections implements Interface.
func (a *Handle) Connections(context.Context, string, func(Conn) error) error { return errNotLinux() }

// LastCounts is never available here.
func (a *Handle) LastCounts() (Counts, bool) { return Counts{}, false }
