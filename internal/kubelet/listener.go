package kubelet

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"

	"github.com/remediate-dev/remediate/internal/boundedfile"
	"github.com/remediate-dev/remediate/internal/procs"
)

// The owner check of an unverified scrape (--kubelet-insecure-tls).
//
// Without a verified certificate, the one thing that tells the kubelet
// from an impostor on its port (any user may bind 10250 while the kubelet
// restarts) is who owns the listening socket. The kernel copies the
// listener's owner into every connection it accepts (and shows it for a
// half-open one too), so the check is made on the very connection the
// token would travel on, after the TCP handshake and before the TLS one:
// no window between checking a listener and using another. The owner
// must be uid 0: the kubelet runs as root, and root on the host can read
// the ServiceAccount's token from the kubelet's volumes anyway, so
// nobody learns what they could not already read. A socket not visible
// here (another network namespace) or owned by anyone else gets nothing.

// procNetTCP are the kernel's TCP socket tables of this network namespace.
var procNetTCP = []string{"/proc/net/tcp", "/proc/net/tcp6"}

// ErrNotKubelet is the owner check's refusal: the listener that accepted
// the connection is not owned by root, or is not visible.
var ErrNotKubelet = errors.New("not the kubelet's listener")

// acceptorUID returns the owner of the socket that accepted the
// connection from local to remote (the server's side: local address
// remote, remote address local), read from tables. Both tables are
// read: a dual-stack listener shows an IPv4 peer as ::ffff:a.b.c.d.
func acceptorUID(tables []string, local, remote netip.AddrPort) (uint32, error) {
	local = netip.AddrPortFrom(local.Addr().Unmap(), local.Port())
	remote = netip.AddrPortFrom(remote.Addr().Unmap(), remote.Port())
	var uids []uint32
	var errs []error
	for _, t := range tables {
		f, err := boundedfile.OpenBounded(t, 256<<20)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		err = procs.ScanTCP(f, func(s procs.TCPSocket) bool {
			if s.State != procs.TCPTimeWait && s.Local.Port() == remote.Port() && s.Remote.Port() == local.Port() &&
				s.Local.Addr().Unmap() == remote.Addr() && s.Remote.Addr().Unmap() == local.Addr() {
				uids = append(uids, s.UID)
			}
			return len(uids) < 4
		})
		f.Close()
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", t, err))
		}
	}
	switch {
	case len(uids) == 0 && len(errs) > 0:
		return 0, fmt.Errorf("%w: the socket tables could not be read: %w", ErrNotKubelet, errors.Join(errs...))
	case len(uids) == 0:
		return 0, fmt.Errorf("%w: no socket of this network namespace accepted the connection from %s to %s (the listener is elsewhere)", ErrNotKubelet, local, remote)
	}
	for _, u := range uids[1:] {
		if u != uids[0] {
			return 0, fmt.Errorf("%w: the sockets of the connection from %s to %s have owners %v", ErrNotKubelet, local, remote, uids)
		}
	}
	return uids[0], nil
}

// ownerCheckedDial dials addr and keeps the connection only when the
// socket that accepted it is owned by uid 0 (the kubelet's).
func ownerCheckedDial(tables []string, d *net.Dialer) func(ctx context.Context, network, addr string) (net.Conn, error) {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		conn, err := d.DialContext(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		local, lok := conn.LocalAddr().(*net.TCPAddr)
		remote, rok := conn.RemoteAddr().(*net.TCPAddr)
		if !lok || !rok {
			conn.Close()
			return nil, fmt.Errorf("%w: not a TCP connection (%s)", ErrNotKubelet, conn.RemoteAddr())
		}
		uid, err := acceptorUID(tables, local.AddrPort(), remote.AddrPort())
		if err == nil && uid != 0 {
			err = fmt.Errorf("%w: the socket listening on %s is owned by uid %d, and the kubelet runs as root (another process took its port?)", ErrNotKubelet, remote, uid)
		}
		if err != nil {
			conn.Close()
			return nil, err
		}
		return conn, nil
	}
}
