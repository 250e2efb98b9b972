package procs

import (
	"bufio"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"strconv"
	"strings"
)

// ErrNoPtrace is returned when the kernel refuses what only
// CAP_SYS_PTRACE over the process allows (its descriptors).
var ErrNoPtrace = errors.New("the process's descriptors are not readable here (needs CAP_SYS_PTRACE over it)")

// TCP states of the st column of /proc/net/tcp{,6} (include/net/tcp_states.h).
const (
	// TCPTimeWait is TCP_TIME_WAIT: such an entry always shows uid 0.
	TCPTimeWait uint8 = 0x06
	// TCPListen is TCP_LISTEN.
	TCPListen uint8 = 0x0A
)

// maxTCPLines bounds the lines of one /proc/net/tcp{,6} read; maxTCPLine
// one line (the kernel's are about 150 bytes).
const (
	maxTCPLines = 1 << 20
	maxTCPLine  = 4096
)

// TCPSocket is one line of /proc/net/tcp or /proc/net/tcp6.
type TCPSocket struct {
	Local, Remote netip.AddrPort
	State         uint8
	UID           uint32
	Inode         uint64
}

// ScanTCP calls fn for each socket of the text of /proc/net/tcp{,6} (or
// /proc/<pid>/net/tcp{,6}) until fn returns false: a header line, then
// "sl local_address rem_address st tx_queue:rx_queue tr:tm->when retrnsmt
// uid timeout inode ...", addresses as the kernel's hex "ADDR:PORT". The
// kernel's format is fixed, so a line not of that shape is an error
// naming it; at most 1<<20 lines are read.
func ScanTCP(r io.Reader, fn func(TCPSocket) bool) error {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 512), maxTCPLine)
	n := 0
	for sc.Scan() {
		n++
		if n == 1 {
			continue // the header
		}
		if n > maxTCPLines {
			return fmt.Errorf("more than %d lines", maxTCPLines)
		}
		if strings.TrimSpace(sc.Text()) == "" {
			continue
		}
		s, err := parseTCPLine(sc.Text())
		if err != nil {
			return fmt.Errorf("line %d: %w", n, err)
		}
		if !fn(s) {
			return nil
		}
	}
	if err := sc.Err(); err != nil {
		return fmt.Errorf("line %d: %w", n+1, err)
	}
	return nil
}

// parseTCPLine parses one socket line.
func parseTCPLine(line string) (TCPSocket, error) {
	f := strings.Fields(line)
	if len(f) < 10 {
		return TCPSocket{}, fmt.Errorf("%d fields, want at least 10", len(f))
	}
	var s TCPSocket
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
	if s.Inode, err = strconv.ParseUint(f[9], 10, 64); err != nil {
		return s, fmt.Errorf("inode %q: %w", f[9], err)
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

// ParseTCPListeners returns the inodes of the sockets listening on port
// in the text of /proc/<pid>/net/tcp or tcp6 (ScanTCP's format and
// bounds).
func ParseTCPListeners(r io.Reader, port uint16) ([]uint64, error) {
	var out []uint64
	err := ScanTCP(r, func(s TCPSocket) bool {
		if s.Local.Port() == port && s.State == TCPListen && s.Inode != 0 {
			out = append(out, s.Inode)
		}
		return true
	})
	return out, err
}
