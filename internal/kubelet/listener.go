package kubelet

import (
	"bufio"
	"context"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"strconv"
	"strings"

	"github.com/remediate-dev/remediate/internal/boundedfile"
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

// maxProcNetLine bounds a line of /proc/net/tcp{,6} (about 150 bytes).
const maxProcNetLine = 4096

// tcpStateTimeWait is TCP_TIME_WAIT: a time-wait entry always shows uid
// 0, so it proves nothing.
const tcpStateTimeWait = 0x06

// tcpSocket is one line of /proc/net/tcp{,6}.
type tcpSocket struct {
	Local, Remote netip.AddrPort
	State         uint8
	UID           uint32
}

// parseProcNetTCP calls fn for each socket of a /proc/net/tcp{,6} table
// until fn returns false. Lines that do not parse are an error (the
// kernel's format is fixed; anything else is not a table to trust).
func parseProcNetTCP(r io.Reader, fn func(tcpSocket) bool) error {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 512), maxProcNetLine)
	for n := 1; sc.Scan(); n++ {
		if n == 1 {
			continue // the header
		}
		s, err := parseProcNetTCPLine(sc.Text())
		if err != nil {
			return fmt.Errorf("line %d: %w", n, err)
		}
		if !fn(s) {
			return nil
		}
	}
	return sc.Err()
}

// parseProcNetTCPLine parses "sl local rem st queues timer retr uid ...".
func parseProcNetTCPLine(line string) (tcpSocket, error) {
	f := strings.Fields(line)
	if len(f) < 8 {
		return tcpSocket{}, fmt.Errorf("%d fields, want at least 8", len(f))
	}
	var s tcpSocket
	var err error
	if s.Local, err = parseHexAddrPort(f[1]); err != nil {
		return s, fmt.Errorf("local address: %w", err)
	}
	if s.Remote, err = parseHexAddrPort(f[2]); err != nil {
		return s, fmt.Errorf("remote address: %w", err)
	}
	st, err := strconv.ParseUint(f[3], 16, 8)
	if err != nil {
		return s, fmt.Errorf("state %q: %w", f[3], err)
	}
	uid, err := strconv.ParseUint(f[7], 10, 32)
	if err != nil {
		return s, fmt.Errorf("uid %q: %w", f[7], err)
	}
	s.State, s.UID = uint8(st), uint32(uid)
	return s, nil
}

// parseHexAddrPort parses the kernel's "0100007F:2803": the address as
// 32-bit words each printed in host byte order, the port big-endian.
func parseHexAddrPort(v string) (netip.AddrPort, error) {
	a, p, ok := strings.Cut(v, ":")
	if !ok || (len(a) != 8 && len(a) != 32) || len(p) != 4 {
		return netip.AddrPort{}, fmt.Errorf("%q is not ADDR:PORT in hex", v)
	}
	port, err := strconv.ParseUint(p, 16, 16)
	if err != nil {
		return netip.AddrPort{}, fmt.Errorf("port %q: %w", p, err)
	}
	raw, err := hex.DecodeString(a)
	if err != nil {
		return netip.AddrPort{}, fmt.Errorf("address %q: %w", a, err)
	}
	b := make([]byte, len(raw))
	for i := 0; i < len(raw); i += 4 {
		binary.NativeEndian.PutUint32(b[i:], binary.BigEndian.Uint32(raw[i:]))
	}
	ip, _ := netip.AddrFromSlice(b)
	return netip.AddrPortFrom(ip, uint16(port)), nil
}

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
		err = parseProcNetTCP(f, func(s tcpSocket) bool {
			if s.State != tcpStateTimeWait && s.Local.Port() == remote.Port() && s.Remote.Port() == local.Port() &&
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
