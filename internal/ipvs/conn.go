package ipvs

import (
	"bufio"
	"context"
	"encoding/hex"
	"fmt"
	"io"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/remediate-dev/remediate/internal/boundedfile"
)

// Conn is one entry of the IPVS connection table, as the kernel prints it in
// /proc/net/ip_vs_conn (net/netfilter/ipvs/ip_vs_conn.c,
// ip_vs_conn_seq_show):
//
//	Pro FromIP   FPrt ToIP     TPrt DestIP   DPrt State       Expires PEName PEData
//	UDP 0A000005 D3A1 0A60000A 0035 0AF4000C 0035 UDP             297
//
// IPv4 addresses and all ports are upper-case hex in network order; IPv6
// addresses are printed in full colon form (%pI6). The destination can be of
// another family than the client (mixed-family forwarding).
type Conn struct {
	Protocol string `json:"protocol"`
	// Client is the client's address (FromIP:FPrt).
	Client netip.AddrPort `json:"client"`
	// Virtual is the virtual server the client addressed (ToIP:TPrt).
	Virtual netip.AddrPort `json:"virtual"`
	// Dest is the real server the connection is pinned to (DestIP:DPrt).
	Dest netip.AddrPort `json:"dest"`
	// State is the protocol state ("UDP" for UDP, "ESTABLISHED", ...), or
	// the template state ("NONE", "ASSURED") for persistence templates.
	State string `json:"state"`
	// Expires is the time left before the entry expires.
	Expires time.Duration `json:"expires"`
	// PEName and PEData are the persistence engine's, usually empty.
	PEName string `json:"peName,omitempty"`
	PEData string `json:"peData,omitempty"`
}

// Template reports whether c looks like a persistence template (session
// affinity) rather than a connection: client port 0 and a template state.
func (c Conn) Template() bool {
	return c.Client.Port() == 0 && (c.State == "NONE" || c.State == "ASSURED")
}

// ConnHeader is the first line of /proc/net/ip_vs_conn.
const ConnHeader = "Pro FromIP   FPrt ToIP     TPrt DestIP   DPrt State       Expires PEName PEData"

// maxConnLine bounds a line: the longest legal line (IPv6 everywhere plus
// persistence-engine data) is well under 300 bytes.
const maxConnLine = 4096

// ParseConns reads the ip_vs_conn format from r and calls fn for each entry
// whose protocol is proto ("" for all). It stops at the first malformed line
// and returns an error naming the line; an error from fn stops parsing and is
// returned as is. ctx is checked every few thousand lines.
func ParseConns(ctx context.Context, r io.Reader, proto string, fn func(Conn) error) error {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 512), maxConnLine)
	line := 0
	for sc.Scan() {
		line++
		if line%4096 == 0 && ctx != nil {
			if err := ctx.Err(); err != nil {
				return err
			}
		}
		text := sc.Text()
		if line == 1 && strings.HasPrefix(text, "Pro ") {
			continue
		}
		if strings.TrimSpace(text) == "" {
			continue
		}
		if proto != "" && !strings.HasPrefix(text, proto+" ") {
			continue
		}
		c, err := ParseConnLine(text)
		if err != nil {
			return fmt.Errorf("ip_vs_conn line %d: %w", line, err)
		}
		if proto != "" && c.Protocol != proto {
			continue
		}
		if err := fn(c); err != nil {
			return err
		}
	}
	if err := sc.Err(); err != nil {
		return fmt.Errorf("ip_vs_conn after line %d: %w", line, err)
	}
	return nil
}

// ParseConnLine parses one entry line of /proc/net/ip_vs_conn.
func ParseConnLine(s string) (Conn, error) {
	if strings.ContainsAny(s, "\n\r") {
		return Conn{}, fmt.Errorf("line break inside a line: %q", s)
	}
	f := strings.Fields(s)
	if len(f) < 9 {
		return Conn{}, fmt.Errorf("%d fields, want at least 9: %q", len(f), s)
	}
	var c Conn
	c.Protocol = f[0]
	var err error
	if c.Client, err = parseAddrPort(f[1], f[2]); err != nil {
		return Conn{}, fmt.Errorf("client: %w", err)
	}
	if c.Virtual, err = parseAddrPort(f[3], f[4]); err != nil {
		return Conn{}, fmt.Errorf("virtual: %w", err)
	}
	if c.Dest, err = parseAddrPort(f[5], f[6]); err != nil {
		return Conn{}, fmt.Errorf("dest: %w", err)
	}
	c.State = f[7]
	exp, err := strconv.ParseUint(f[8], 10, 32)
	if err != nil {
		return Conn{}, fmt.Errorf("expires %q: %w", f[8], err)
	}
	c.Expires = time.Duration(exp) * time.Second
	if len(f) > 9 {
		c.PEName = f[9]
		c.PEData = strings.Join(f[10:], " ")
	}
	return c, nil
}

func parseAddrPort(addr, port string) (netip.AddrPort, error) {
	a, err := parseConnAddr(addr)
	if err != nil {
		return netip.AddrPort{}, err
	}
	if len(port) != 4 {
		return netip.AddrPort{}, fmt.Errorf("port %q is not 4 hex digits", port)
	}
	p, err := strconv.ParseUint(port, 16, 16)
	if err != nil {
		return netip.AddrPort{}, fmt.Errorf("port %q: %w", port, err)
	}
	return netip.AddrPortFrom(a, uint16(p)), nil
}

// parseConnAddr parses an IPv4 address as 8 hex digits (host order of the
// printed value = network order of the address) or an IPv6 address in %pI6
// form.
func parseConnAddr(s string) (netip.Addr, error) {
	if len(s) == 8 && !strings.Contains(s, ":") {
		var b [4]byte
		if _, err := hex.Decode(b[:], []byte(s)); err != nil {
			return netip.Addr{}, fmt.Errorf("address %q: %w", s, err)
		}
		return netip.AddrFrom4(b), nil
	}
	if !strings.Contains(s, ":") {
		return netip.Addr{}, fmt.Errorf("address %q is neither 8 hex digits nor IPv6", s)
	}
	a, err := netip.ParseAddr(s)
	if err != nil || !a.Is6() || a.Zone() != "" {
		return netip.Addr{}, fmt.Errorf("address %q is not an IPv6 address", s)
	}
	return a, nil
}

// WalkConns streams <procRoot>/net/ip_vs_conn to fn (see ParseConns). A
// missing file means IPVS is not loaded (in the reader's network
// namespace) and returns ErrUnavailable.
func WalkConns(ctx context.Context, procRoot, proto string, fn func(Conn) error) error {
	path := filepath.Join(procRoot, "net", "ip_vs_conn")
	// Streamed (the table can hold millions of connections): no size
	// bound, but non-blocking, regular-only and each read under a deadline.
	f, err := boundedfile.Open(path)
	if err != nil {
		if os.IsNotExist(err) {
			return Unavailable("%s does not exist (no ip_vs module)", path)
		}
		return fmt.Errorf("reading IPVS connection table: %w", err)
	}
	defer f.Close()
	if err := ParseConns(ctx, f, proto, fn); err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	return nil
}

// ReadConns collects what WalkConns streams; for tests and small tables.
func ReadConns(ctx context.Context, procRoot, proto string) ([]Conn, error) {
	var out []Conn
	err := WalkConns(ctx, procRoot, proto, func(c Conn) error {
		out = append(out, c)
		return nil
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}
