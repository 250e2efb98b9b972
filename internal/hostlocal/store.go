package hostlocal

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/netip"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/remediate-dev/remediate/internal/boundedfile"
	"github.com/remediate-dev/remediate/internal/clip"
)

// Limits bound one read of a network's store.
type Limits struct {
	// MaxEntries is how many directory entries are listed (default
	// 65536: a /16's worth); beyond, the count is a lower bound
	// (Network.Truncated).
	MaxEntries int
	// MaxRead is how many allocation files have their content read
	// (default 4096); the others count, without a container ID.
	MaxRead int
}

// Bounds of one file.
const (
	// MaxAllocationFile is the largest allocation file read: a container
	// ID (64 hex digits), CRLF and an interface name take under 100 bytes.
	MaxAllocationFile = 512
)

func (l Limits) withDefaults() Limits {
	if l.MaxEntries <= 0 {
		l.MaxEntries = 65536
	}
	if l.MaxRead <= 0 {
		l.MaxRead = 4096
	}
	return l
}

// Allocation is one allocated address of the store.
type Allocation struct {
	IP netip.Addr `json:"ip"`
	// ContainerID is the container (sandbox) ID the address belongs to,
	// IfName its interface; empty when not read (Err says why, or the
	// read limit was reached: Read false).
	ContainerID string `json:"containerID,omitempty"`
	IfName      string `json:"ifName,omitempty"`
	// ModTime is the file's modification time (when it was reserved).
	ModTime time.Time `json:"modTime,omitempty"`
	Read    bool      `json:"-"`
	Err     string    `json:"error,omitempty"`
}

// Network is one network's store as read.
type Network struct {
	Name string `json:"network"`
	Dir  string `json:"dir"`
	// Allocations are the files named by an address, by address.
	Allocations []Allocation `json:"-"`
	// Entries is how many directory entries were listed; Truncated says
	// the listing stopped at Limits.MaxEntries (more may exist).
	Entries   int  `json:"entries"`
	Truncated bool `json:"truncated,omitempty"`
	// Unread is how many allocation files were not read (Limits.MaxRead).
	Unread int `json:"unread,omitempty"`
	// Other are entries that are neither an address, a last_reserved_ip
	// file nor the lock (at most 10 named).
	Other []string `json:"other,omitempty"`
}

// ParseAllocation parses an allocation file's content: "<id>\r\n<ifname>"
// (host-local since v0.8.6) or "<id>" (before). It is a pure function.
func ParseAllocation(b []byte) (id, ifname string, err error) {
	s := string(b)
	id, ifname, _ = strings.Cut(s, "\r\n")
	if !strings.Contains(s, "\r\n") {
		id, ifname, _ = strings.Cut(s, "\n")
	}
	id, ifname = strings.TrimSpace(id), strings.TrimSpace(ifname)
	if id == "" {
		return "", "", errors.New("no container ID")
	}
	for _, r := range id + ifname {
		if r < 0x21 || r > 0x7e {
			return "", "", fmt.Errorf("not a container ID and interface name: %q", clip.String(s, 64))
		}
	}
	if len(id) > 256 || len(ifname) > 64 {
		return "", "", fmt.Errorf("container ID or interface name too long (%d, %d bytes)", len(id), len(ifname))
	}
	return id, ifname, nil
}

// ReadNetwork reads the store of network under dataDir, bounded by l.
// A missing directory is an error wrapping fs.ErrNotExist.
func ReadNetwork(dataDir, network string, l Limits) (Network, error) {
	l = l.withDefaults()
	dir := filepath.Join(dataDir, network)
	n := Network{Name: network, Dir: dir}
	if network == "" || strings.ContainsAny(network, "/\x00") || network == "." || network == ".." {
		return n, fmt.Errorf("network name %q is not a directory name", network)
	}
	d, err := boundedfile.OpenDir(dir)
	if err != nil {
		return n, fmt.Errorf("opening host-local store %s: %w", dir, err)
	}
	ents, err := d.ReadDir(l.MaxEntries)
	more := false
	if err == nil && len(ents) == l.MaxEntries {
		extra, _ := d.ReadDir(1)
		more = len(extra) > 0
	}
	d.Close()
	if err != nil && !errors.Is(err, io.EOF) {
		return n, fmt.Errorf("listing host-local store %s: %w", dir, err)
	}
	n.Entries, n.Truncated = len(ents), more
	for _, e := range ents {
		name := e.Name()
		ip, perr := netip.ParseAddr(name)
		if perr != nil || e.IsDir() {
			if name != "lock" && !strings.HasPrefix(name, "last_reserved_ip.") && len(n.Other) < 10 {
				n.Other = append(n.Other, clip.String(name, 64))
			}
			continue
		}
		n.Allocations = append(n.Allocations, Allocation{IP: ip.Unmap()})
	}
	sort.Strings(n.Other)
	sort.Slice(n.Allocations, func(i, j int) bool { return n.Allocations[i].IP.Less(n.Allocations[j].IP) })
	for i := range n.Allocations {
		if i >= l.MaxRead {
			n.Unread = len(n.Allocations) - l.MaxRead
			break
		}
		a := &n.Allocations[i]
		a.Read = true
		b, mt, err := readSmall(filepath.Join(dir, a.IP.String()))
		a.ModTime = mt
		if err != nil {
			a.Err = err.Error()
			continue
		}
		if a.ContainerID, a.IfName, err = ParseAllocation(b); err != nil {
			a.Err = err.Error()
		}
	}
	return n, nil
}

// readSmall reads a regular file of at most MaxAllocationFile bytes, never
// through a symlink, and its modification time.
func readSmall(path string) ([]byte, time.Time, error) {
	f, err := boundedfile.OpenBoundedNoFollow(path, MaxAllocationFile)
	if err != nil {
		return nil, time.Time{}, err
	}
	defer f.Close()
	var mt time.Time
	if st, err := f.Stat(); err == nil {
		mt = st.ModTime()
	}
	b, err := io.ReadAll(f)
	if err != nil {
		return nil, mt, err
	}
	return b, mt, nil
}

// IsNotExist says whether err is a missing store.
func IsNotExist(err error) bool { return errors.Is(err, fs.ErrNotExist) }
