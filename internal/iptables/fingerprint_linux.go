//go:build linux

package iptables

import (
	byteorder "encoding/binary"
	"errors"
	"fmt"
	"hash/maphash"
	"os"
	"slices"
	"sort"
	"strings"
	"time"
	"unsafe"

	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"

	"github.com/remediate-dev/remediate/internal/boundedfile"
	"github.com/remediate-dev/remediate/internal/nfnetlink"
)

// A fingerprint tells, without running a save command, whether a
// backend's rules of one family may have changed since the last save and
// whether it has any table at all. It never takes the xtables lock (that
// lock is a userspace flock on /run/xtables.lock which only the iptables
// commands take; what is read here is what iptables-legacy-save itself
// reads, under the kernel's own short per-family mutex, and the nf_tables
// generation):
//
//   - legacy: /proc/net/ip{,6}_tables_names (the tables that exist in
//     this network namespace; no name is asked for that is not listed
//     there, so no iptable_* module is loaded and no table created by
//     asking), then for each table IPT_SO_GET_INFO and IPT_SO_GET_ENTRIES
//     (the same two getsockopts iptables-legacy-save makes) and a keyed
//     64-bit hash of the hook offsets, entry count, size and the whole
//     entry blob with the per-rule packet/byte counters zeroed. The size
//     and count alone are not enough: kube-proxy replacing one endpoint by
//     another rewrites a DNAT rule and a KUBE-SEP chain name of exactly
//     the same length, so the table keeps its size.
//   - nft: the ruleset generation (NFT_MSG_GETGEN), which the kernel bumps
//     on every committed nf_tables transaction in the namespace, plus which
//     iptables tables (filter, nat, mangle, raw, security) exist in the
//     family (NFT_MSG_GETTABLE) and the legacy table names (iptables-nft-save
//     prints a warning when legacy tables exist).
//
// Two equal fingerprints mean the save would print the same rules
// (counters aside); anything unreadable is an error and the caller saves.
//
// For legacy the first part alone (names, GET_INFO: microseconds, while
// the entries' copy is most of a loaded cycle's CPU) is the info; Save
// reads only that while nobody touched the xtables lock (lockActivity)
// and the entries were checked less than EntriesMaxAge ago.
type fingerprint struct {
	// info covers the table names and each table's IPT_SO_GET_INFO
	// (legacy) or everything (nft: the generation and tables).
	info uint64
	// sum covers info and the entries with their counters zeroed (legacy;
	// nft: equal to info); valid when full.
	sum   uint64
	full  bool
	empty bool // the backend has no table in this family: the save prints nothing
}

var fpSeed = maphash.MakeSeed()

// Socket options of linux/netfilter_ipv4/ip_tables.h (the IPv6 ones have
// the same numbers at SOL_IPV6).
const (
	soGetInfo    = 64 // IPT_SO_GET_INFO
	soGetEntries = 65 // IPT_SO_GET_ENTRIES
	getInfoSize  = 84 // sizeof(struct ipt_getinfo): name[32], valid_hooks, hook_entry[5], underflow[5], num_entries, size
	entriesHdr   = 40 // offsetof(struct ipt_get_entries, entrytable)
	// maxBlob bounds the entry blob read (a 100k-rule kube-proxy nat
	// table is ~40 MB); a larger table is saved every cycle instead.
	maxBlob = 256 << 20
)

// entryLayout is where struct ipt_entry / ip6t_entry keep next_offset and
// the counters.
type entryLayout struct {
	size, nextOff, counters int
}

var (
	ip4Entry = entryLayout{size: 112, nextOff: 90, counters: 96}
	ip6Entry = entryLayout{size: 168, nextOff: 142, counters: 152}
)

// legacyTableNames reads the legacy tables of the namespace the calling
// (locked) thread is in, in the file's order (the order
// iptables-legacy-save prints them); a missing file means ip{,6}_tables
// is not loaded: no table.
func legacyTableNames(f Family) ([]string, error) {
	name := "ip_tables_names"
	if f == IPv6 {
		name = "ip6_tables_names"
	}
	// boundedfile opens a /proc/thread-self path on this (locked) thread.
	b, err := boundedfile.Read("/proc/thread-self/net/"+name, 64<<10)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	return strings.Fields(string(b)), nil
}

// fingerprint computes the fingerprint of a family and backend in the
// configured network namespace; for legacy, withEntries reads and hashes
// the entries too (otherwise only info is set).
//
// When the entries are read, decodeIf is not nil and says yes to the
// fingerprint (the rules changed since the kept snapshot), the entries
// already read are decoded too (IPv4 only; see DecodeLegacy): dec is the
// decode, its time included, or why it could not be had.
func (r *Real) fingerprint(f Family, b Backend, withEntries bool, decodeIf func(fingerprint) bool) (fingerprint, *decoded, error) {
	var fp fingerprint
	var dec *decoded
	err := nfnetlink.InNetNS(r.cfg.NetNS, func() error {
		var err error
		if b == Legacy {
			r.addRead(f, b, readInfo)
			if f != IPv4 {
				decodeIf = nil
			}
			fp, dec, err = legacyFingerprint(f, withEntries, decodeIf)
			if withEntries && !fp.empty && err == nil {
				r.addRead(f, b, readEntries)
			}
		} else {
			r.addRead(f, b, readInfo)
			fp, err = nftFingerprint(f)
		}
		return err
	})
	return fp, dec, err
}

func legacyFingerprint(f Family, withEntries bool, decodeIf func(fingerprint) bool) (fingerprint, *decoded, error) {
	start := time.Now()
	fileOrder, err := legacyTableNames(f)
	if err != nil {
		return fingerprint{}, nil, err
	}
	if len(fileOrder) == 0 {
		return fingerprint{empty: true, full: true}, nil, nil
	}
	names := slices.Clone(fileOrder)
	sort.Strings(names)
	af, level, layout := unix.AF_INET, unix.SOL_IP, ip4Entry
	if f == IPv6 {
		af, level, layout = unix.AF_INET6, unix.SOL_IPV6, ip6Entry
	}
	fd, err := unix.Socket(af, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.IPPROTO_RAW)
	if err != nil {
		return fingerprint{}, nil, fmt.Errorf("raw socket: %w", err)
	}
	defer unix.Close(fd)
	var hi, hs maphash.Hash
	hi.SetSeed(fpSeed)
	hs.SetSeed(fpSeed)
	// The blobs stay mapped until the decode (if any) is done.
	tables := make(map[string]legacyTable, len(names))
	defer func() {
		for _, t := range tables {
			t.unmap()
		}
	}()
	for _, name := range names {
		if len(name) >= 32 {
			return fingerprint{}, nil, fmt.Errorf("table name %q too long", name)
		}
		var entries *maphash.Hash
		if withEntries {
			entries = &hs
		}
		t, err := hashLegacyTable(&hi, entries, fd, level, name, layout)
		if err != nil {
			return fingerprint{}, nil, fmt.Errorf("table %s: %w", name, err)
		}
		if t.unmap != nil {
			tables[name] = t
		}
	}
	fp := fingerprint{info: hi.Sum64(), full: withEntries}
	if !withEntries {
		return fp, nil, nil
	}
	fp.sum = hs.Sum64()
	if decodeIf == nil || !decodeIf(fp) {
		return fp, nil, nil
	}
	infos := make([]LegacyTableInfo, 0, len(fileOrder))
	blobs := make([][]byte, 0, len(fileOrder))
	dec := &decoded{}
	for _, name := range fileOrder {
		t, ok := tables[name]
		if !ok {
			return fp, nil, fmt.Errorf("table %s listed twice", name)
		}
		infos, blobs = append(infos, t.info), append(blobs, t.blob)
		dec.bytes += len(t.blob)
	}
	dec.rules, dec.err = DecodeLegacy(infos, blobs)
	dec.took = time.Since(start)
	return fp, dec, nil
}

// legacyTable is one table's info and entry blob (mapped outside the heap
// until unmap).
type legacyTable struct {
	info  LegacyTableInfo
	blob  []byte
	unmap func()
}

// readLegacyTables reads the IPv4 legacy tables of the calling thread's
// namespace in the save's order (for tests and benchmarks: the info and a
// heap copy of each entry blob).
func readLegacyTables() ([]LegacyTableInfo, [][]byte, error) {
	names, err := legacyTableNames(IPv4)
	if err != nil {
		return nil, nil, err
	}
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.IPPROTO_RAW)
	if err != nil {
		return nil, nil, fmt.Errorf("raw socket: %w", err)
	}
	defer unix.Close(fd)
	var infos []LegacyTableInfo
	var blobs [][]byte
	for _, name := range names {
		var hi, hs maphash.Hash
		t, err := hashLegacyTable(&hi, &hs, fd, unix.SOL_IP, name, ip4Entry)
		if err != nil {
			return nil, nil, err
		}
		infos, blobs = append(infos, t.info), append(blobs, slices.Clone(t.blob))
		t.unmap()
	}
	return infos, blobs, nil
}

func getsockopt(fd, level, opt int, buf []byte) error {
	l := uint32(len(buf))
	_, _, e := unix.Syscall6(unix.SYS_GETSOCKOPT, uintptr(fd), uintptr(level), uintptr(opt),
		uintptr(unsafe.Pointer(&buf[0])), uintptr(unsafe.Pointer(&l)), 0)
	if e != 0 {
		return e
	}
	if int(l) != len(buf) {
		return fmt.Errorf("getsockopt %d returned %d bytes, want %d", opt, l, len(buf))
	}
	return nil
}

// hashLegacyTable writes the table's name and GET_INFO into hi and, when
// hs is not nil, the same followed by its entries (counters zeroed) into
// hs, and returns the info and the entries (mapped outside the heap; the
// caller calls unmap, nil when hs is nil).
func hashLegacyTable(hi, hs *maphash.Hash, fd, level int, name string, lay entryLayout) (legacyTable, error) {
	info := make([]byte, getInfoSize)
	copy(info, name)
	if err := getsockopt(fd, level, soGetInfo, info); err != nil {
		return legacyTable{}, fmt.Errorf("IPT_SO_GET_INFO: %w", err)
	}
	size := byteorder.NativeEndian.Uint32(info[80:84])
	if size > maxBlob {
		return legacyTable{}, fmt.Errorf("entries of %d bytes: larger than %d", size, maxBlob)
	}
	_, _ = hi.WriteString(name)
	_ = hi.WriteByte(0)
	_, _ = hi.Write(info[32:]) // valid_hooks, hook_entry, underflow, num_entries, size
	if hs == nil {
		return legacyTable{}, nil
	}
	_, _ = hs.WriteString(name)
	_ = hs.WriteByte(0)
	_, _ = hs.Write(info[32:])
	t := legacyTable{info: LegacyTableInfo{Name: name,
		ValidHooks: byteorder.NativeEndian.Uint32(info[32:36]),
		NumEntries: byteorder.NativeEndian.Uint32(info[76:80]), Size: size}}
	for h := range 5 {
		t.info.HookEntry[h] = byteorder.NativeEndian.Uint32(info[36+4*h:])
		t.info.Underflow[h] = byteorder.NativeEndian.Uint32(info[56+4*h:])
	}
	// The blob is read into memory outside the Go heap and unmapped
	// after the hash (and decode): a large table must not grow the heap
	// for a hash.
	buf, unmap, err := blobBuffer(entriesHdr + int(size))
	if err != nil {
		return legacyTable{}, err
	}
	ok := false
	defer func() {
		if !ok {
			unmap()
		}
	}()
	copy(buf, name)
	byteorder.NativeEndian.PutUint32(buf[32:36], size)
	if err := getsockopt(fd, level, soGetEntries, buf); err != nil {
		// EAGAIN: the table was replaced between the two reads.
		return legacyTable{}, fmt.Errorf("IPT_SO_GET_ENTRIES: %w", err)
	}
	blob := buf[entriesHdr:]
	for off := 0; off < len(blob); {
		if off+lay.size > len(blob) {
			return legacyTable{}, fmt.Errorf("entry at %d overruns the blob", off)
		}
		next := int(byteorder.NativeEndian.Uint16(blob[off+lay.nextOff:]))
		if next < lay.size || off+next > len(blob) {
			return legacyTable{}, fmt.Errorf("bad next_offset %d at %d", next, off)
		}
		clear(blob[off+lay.counters : off+lay.counters+16])
		off += next
	}
	_, _ = hs.Write(blob)
	ok = true
	t.blob, t.unmap = blob, unmap
	return t, nil
}

// hugePage is the size of a transparent huge page on x86-64 and arm64
// (4 KiB base pages).
const hugePage = 2 << 20

// blobBuffer maps n bytes outside the Go heap for one GET_ENTRIES copy.
// A blob of a huge page or more is placed on huge-page boundaries and
// advised MADV_HUGEPAGE: the kernel's copy then faults in a few 2 MiB
// pages instead of one 4 KiB page per fault (a 20k-rule table is ~1,500
// faults otherwise). Where transparent huge pages are off the advice is a
// no-op and the buffer is ordinary pages.
func blobBuffer(n int) ([]byte, func(), error) {
	if n < hugePage {
		m, err := unix.Mmap(-1, 0, n, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
		if err != nil {
			return nil, nil, fmt.Errorf("mmap %d bytes: %w", n, err)
		}
		return m, func() { _ = unix.Munmap(m) }, nil
	}
	m, err := unix.Mmap(-1, 0, n+hugePage, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		return nil, nil, fmt.Errorf("mmap %d bytes: %w", n+hugePage, err)
	}
	off := 0
	if a := uintptr(unsafe.Pointer(&m[0])) % hugePage; a != 0 {
		off = int(hugePage - a)
	}
	buf := m[off : off+n : off+n]
	_ = unix.Madvise(buf, unix.MADV_HUGEPAGE) // advice only
	return buf, func() { _ = unix.Munmap(m) }, nil
}

// nf_tables netlink constants (linux/netfilter/nf_tables.h, nfnetlink.h).
const (
	nftMsgGetTable = 1
	nftaTableName  = 1
	nfprotoIPv4    = 2
	nfprotoIPv6    = 10
)

// xtablesTables are the table names iptables-nft-save prints.
var xtablesTables = map[string]bool{"filter": true, "nat": true, "mangle": true, "raw": true, "security": true}

func nftFingerprint(f Family) (fingerprint, error) {
	c, err := netlink.Dial(unix.NETLINK_NETFILTER, nil)
	if err != nil {
		return fingerprint{}, fmt.Errorf("nfnetlink: %w", err)
	}
	defer c.Close()
	// The generation first: a change after it is read gives another
	// generation next time.
	gen, err := nfnetlink.Generation(c)
	if err != nil {
		return fingerprint{}, err
	}
	fam := uint8(nfprotoIPv4)
	if f == IPv6 {
		fam = nfprotoIPv6
	}
	msgs, err := c.Execute(netlink.Message{
		Header: netlink.Header{Type: netlink.HeaderType(nfnetlink.SubsysNFTables<<8 | nftMsgGetTable), Flags: netlink.Request | netlink.Dump},
		Data:   []byte{fam, 0, 0, 0},
	})
	if err != nil {
		return fingerprint{}, fmt.Errorf("listing nf_tables tables: %w", err)
	}
	var tables []string
	for _, m := range msgs {
		if len(m.Data) < 4 {
			continue
		}
		ad, err := netlink.NewAttributeDecoder(m.Data[4:])
		if err != nil {
			return fingerprint{}, fmt.Errorf("table message: %w", err)
		}
		ad.ByteOrder = byteorder.BigEndian
		for ad.Next() {
			if ad.Type() == nftaTableName {
				if n := ad.String(); xtablesTables[n] {
					tables = append(tables, n)
				}
			}
		}
		if err := ad.Err(); err != nil {
			return fingerprint{}, fmt.Errorf("table message: %w", err)
		}
	}
	legacy, err := legacyTableNames(f)
	if err != nil {
		return fingerprint{}, err
	}
	sort.Strings(legacy)
	sort.Strings(tables)
	var h maphash.Hash
	h.SetSeed(fpSeed)
	_ = byteorder.Write(&h, byteorder.BigEndian, gen)
	_, _ = h.WriteString(strings.Join(tables, ",") + "|" + strings.Join(legacy, ","))
	// Without an iptables table in the family the save prints nothing but
	// perhaps the legacy warning: keep saving then, it is cheap.
	sum := h.Sum64()
	return fingerprint{info: sum, sum: sum, full: true, empty: len(tables) == 0 && len(legacy) == 0}, nil
}
