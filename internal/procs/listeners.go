package procs

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
)

// ErrNoPtrace is returned when the kernel refuses what only
// CAP_SYS_PTRACE over the process allows (its descriptors).
var ErrNoPtrace = errors.New("the process's descriptors are not readable here (needs CAP_SYS_PTRACE over it)")

// tcpListen is the st column of a listening socket in /proc/net/tcp.
const tcpListen = "0A"

// ParseTCPListeners returns the inodes of the sockets listening on port
// in the text of /proc/<pid>/net/tcp or tcp6 (a header line, then
// "sl local_address rem_address st tx_queue:rx_queue tr:tm->when retrnsmt
// uid timeout inode ..."; addresses as hex "ADDR:PORT"). At most 1<<20
// lines are read; a line not of that shape is an error naming it.
func ParseTCPListeners(r io.Reader, port uint16) ([]uint64, error) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 512), 4096)
	var out []uint64
	n := 0
	for sc.Scan() {
		n++
		if n == 1 {
			continue // header
		}
		if n > 1<<20 {
			return out, fmt.Errorf("more than %d lines", 1<<20)
		}
		f := strings.Fields(sc.Text())
		if len(f) == 0 {
			continue
		}
		if len(f) < 10 {
			return out, fmt.Errorf("line %d: %d fields, want at least 10", n, len(f))
		}
		_, ps, ok := strings.Cut(f[1], ":")
		if !ok {
			return out, fmt.Errorf("line %d: bad local address %q", n, f[1])
		}
		p, err := strconv.ParseUint(ps, 16, 16)
		if err != nil {
			return out, fmt.Errorf("line %d: bad local port %q", n, ps)
		}
		ino, err := strconv.ParseUint(f[9], 10, 64)
		if err != nil {
			return out, fmt.Errorf("line %d: bad inode %q", n, f[9])
		}
		if uint16(p) == port && f[3] == tcpListen && ino != 0 {
			out = append(out, ino)
		}
	}
	if err := sc.Err(); err != nil {
		return out, fmt.Errorf("line %d: %w", n+1, err)
	}
	return out, nil
}
