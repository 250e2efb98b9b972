// Package hostlocal reads the state of host-local IPAM
// (containernetworking/plugins plugins/ipam/host-local) on the node,
// read-only: the ranges a network configuration gives it, and its store
// under the data directory (default /var/lib/cni/networks): one directory
// per network, in it one file per allocated address named by the address
// and holding "<container ID>\r\n<ifname>" (older versions: the container
// ID alone), last_reserved_ip.<range set index> and the lock file. Every
// read is bounded (entries listed, files read, bytes per file), never
// follows a symlink and never blocks on a FIFO: a hostile directory of a
// million files, or a huge file, gets a bounded answer. Nothing here takes
// host-local's lock or writes anything.
package hostlocal

import (
	"encoding/json"
	"fmt"
	"math/big"
	"net/netip"
	"strings"
)

// DefaultDataDir is host-local's default data directory.
const DefaultDataDir = "/var/lib/cni/networks"

// Range is one range of a range set, canonicalised as host-local does:
// Start defaults to the subnet's first address + 1, End to its last (the
// broadcast − 1 for IPv4), Gateway to the first address + 1; the gateway
// is never allocated.
type Range struct {
	Subnet  netip.Prefix `json:"subnet"`
	Start   netip.Addr   `json:"rangeStart"`
	End     netip.Addr   `json:"rangeEnd"`
	Gateway netip.Addr   `json:"gateway"`
}

// RangeSet is the ranges one address of each attachment is taken from
// (one range set per IP family, usually).
type RangeSet []Range

// Config is the host-local part of one network configuration.
type Config struct {
	// Network is the network's name: the store's directory under DataDir.
	Network string `json:"network"`
	// DataDir is the ipam section's dataDir (empty: the default).
	DataDir string `json:"dataDir,omitempty"`
	// RangeSets are the parsed range sets.
	RangeSets []RangeSet `json:"rangeSets,omitempty"`
	// Unknown says why a range set could not be parsed (e.g. a subnet of
	// "usePodCidr", filled in by a wrapper); its capacity is unknown.
	Unknown string `json:"unknown,omitempty"`
}

type rawRange struct {
	Subnet     string `json:"subnet"`
	RangeStart string `json:"rangeStart"`
	RangeEnd   string `json:"rangeEnd"`
	Gateway    string `json:"gateway"`
}

type rawIPAM struct {
	Type    string       `json:"type"`
	DataDir string       `json:"dataDir"`
	Ranges  [][]rawRange `json:"ranges"`
	// The legacy single-range form.
	rawRange
}

type rawPlugin struct {
	Type string   `json:"type"`
	IPAM *rawIPAM `json:"ipam"`
	// flannel's delegate form carries the ipam in "delegate".
	Delegate *rawPlugin `json:"delegate"`
}

type rawConf struct {
	Name    string      `json:"name"`
	Plugins []rawPlugin `json:"plugins"`
	rawPlugin
}

// ParseConfig returns the host-local sections of a network configuration
// file (.conf or .conflist): one Config per plugin whose ipam type is
// host-local. It is a pure function of the bytes.
func ParseConfig(b []byte) ([]Config, error) {
	var c rawConf
	if err := json.Unmarshal(b, &c); err != nil {
		return nil, fmt.Errorf("parsing network configuration: %w", err)
	}
	plugins := c.Plugins
	if len(plugins) == 0 {
		plugins = []rawPlugin{c.rawPlugin}
	}
	var out []Config
	for _, p := range plugins {
		for q := &p; q != nil; q = q.Delegate {
			if q.IPAM == nil || q.IPAM.Type != "host-local" {
				continue
			}
			out = append(out, parseIPAM(c.Name, q.IPAM))
			break
		}
	}
	return out, nil
}

func parseIPAM(network string, ipam *rawIPAM) Config {
	c := Config{Network: network, DataDir: ipam.DataDir}
	sets := ipam.Ranges
	if len(sets) == 0 && ipam.Subnet != "" {
		sets = [][]rawRange{{ipam.rawRange}}
	}
	var bad []string
	for i, s := range sets {
		var rs RangeSet
		for j, r := range s {
			pr, err := parseRange(r)
			if err != nil {
				bad = append(bad, fmt.Sprintf("ranges[%d][%d]: %v", i, j, err))
				rs = nil
				break
			}
			rs = append(rs, pr)
		}
		if len(rs) > 0 {
			c.RangeSets = append(c.RangeSets, rs)
		}
	}
	if len(sets) == 0 {
		bad = append(bad, "no ranges or subnet")
	}
	if len(bad) > 0 {
		c.Unknown = strings.Join(bad, "; ")
	}
	return c
}

func parseRange(r rawRange) (Range, error) {
	p, err := netip.ParsePrefix(strings.TrimSpace(r.Subnet))
	if err != nil {
		return Range{}, fmt.Errorf("subnet %q: %w", r.Subnet, err)
	}
	p = p.Masked()
	first, last := p.Addr(), lastAddr(p)
	out := Range{Subnet: p, Start: first.Next(), End: last, Gateway: first.Next()}
	if p.Addr().Is4() {
		out.End = last.Prev()
	}
	for _, f := range []struct {
		s   string
		dst *netip.Addr
	}{{r.RangeStart, &out.Start}, {r.RangeEnd, &out.End}, {r.Gateway, &out.Gateway}} {
		if f.s == "" {
			continue
		}
		a, err := netip.ParseAddr(strings.TrimSpace(f.s))
		if err != nil {
			return Range{}, fmt.Errorf("address %q: %w", f.s, err)
		}
		*f.dst = a.Unmap()
	}
	if !out.Start.IsValid() || !out.End.IsValid() || !p.Contains(out.Start) || !p.Contains(out.End) || out.End.Less(out.Start) {
		return Range{}, fmt.Errorf("range %s-%s not within %s", out.Start, out.End, p)
	}
	return out, nil
}

// lastAddr is a prefix's last address.
func lastAddr(p netip.Prefix) netip.Addr {
	b := p.Addr().AsSlice()
	bits := p.Bits()
	for i := range b {
		for k := 7; k >= 0; k-- {
			if i*8+(7-k) >= bits {
				b[i] |= 1 << k
			}
		}
	}
	a, _ := netip.AddrFromSlice(b)
	return a
}

// Contains says whether a is in the range.
func (r Range) Contains(a netip.Addr) bool {
	a = a.Unmap()
	return a.BitLen() == r.Start.BitLen() && !a.Less(r.Start) && !r.End.Less(a)
}

// Size is how many addresses host-local can allocate from the range (the
// gateway excluded), saturating at MaxUint64.
func (r Range) Size() uint64 {
	n := new(big.Int).Sub(new(big.Int).SetBytes(r.End.AsSlice()), new(big.Int).SetBytes(r.Start.AsSlice()))
	n.Add(n, big.NewInt(1))
	if r.Contains(r.Gateway) {
		n.Sub(n, big.NewInt(1))
	}
	if !n.IsUint64() {
		if n.Sign() < 0 {
			return 0
		}
		return ^uint64(0)
	}
	return n.Uint64()
}

// Contains says whether a is in one of the set's ranges.
func (s RangeSet) Contains(a netip.Addr) bool {
	for _, r := range s {
		if r.Contains(a) {
			return true
		}
	}
	return false
}

// Size is the sum of the ranges' sizes, saturating.
func (s RangeSet) Size() uint64 {
	var n uint64
	for _, r := range s {
		z := r.Size()
		if n+z < n {
			return ^uint64(0)
		}
		n += z
	}
	return n
}

// String is host-local's own rendering of a range set
// ("10.244.0.2-10.244.0.3,..."), as in its exhaustion error.
func (s RangeSet) String() string {
	parts := make([]string, len(s))
	for i, r := range s {
		parts[i] = r.Start.String() + "-" + r.End.String()
	}
	return strings.Join(parts, ",")
}

// PodCIDRRangeSets are the range sets host-local uses for the Node's
// podCIDRs when the configuration leaves them to a wrapper (a subnet of
// "usePodCidr", or no range at all): one set per CIDR, with host-local's
// defaults (from the subnet's first address + 1 to its last, less the
// IPv4 broadcast). A CIDR that gives no range is left out.
func PodCIDRRangeSets(cidrs []netip.Prefix) []RangeSet {
	var out []RangeSet
	for _, p := range cidrs {
		if r, err := parseRange(rawRange{Subnet: p.String()}); err == nil {
			out = append(out, RangeSet{r})
		}
	}
	return out
}
