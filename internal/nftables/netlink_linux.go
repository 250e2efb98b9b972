//go:build linux

package nftables

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"time"

	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"

	"github.com/remediate-dev/remediate/internal/nfnetlink"
)

// The netlink reader: the same dumps nft itself sends (NFT_MSG_GETTABLE,
// GETCHAIN, GETSET, GETSETELEM, GETRULE), read from a NETLINK_NETFILTER
// socket one receive at a time and decoded as they arrive into the typed
// Ruleset, so memory follows the parsed result and a listing stops as soon
// as it passes MaxObjects. Rules' expressions are decoded by
// github.com/google/nftables/expr and turned into the model by
// delinearize.go. Nothing is written but dump requests.

// nf_tables attribute numbers not in golang.org/x/sys/unix
// (linux/netfilter/nf_tables.h).
const (
	attrTableHandle     = 4
	attrTableUserdata   = 6
	attrSetHandle       = 16
	attrChainUserdata   = 12
	attrHookDevs        = 4
	attrSetDescConcat   = 2
	attrSetFieldLen     = 1
	attrSetElemKeyEnd   = 10
	nlmFDumpInterrupted = 0x10
	maxDumpRetries      = 3
	recvSlice           = 200 * time.Millisecond
	// perChainRuleDumps: a table with more chains has its rules dumped
	// chain by chain.
	perChainRuleDumps = 1000
)

// nlReader is one listing over one socket.
type nlReader struct {
	ctx      context.Context
	deadline time.Time
	fd       int
	seq      uint32
	buf      []byte
	bytes    int64
	objects  int
	max      int
	cache    *anonCache
	// smallFD and smallBuf serve the per-chain rule dumps.
	smallFD  int
	smallBuf []byte
}

// errDumpInterrupted: the ruleset changed during a dump (the kernel set
// NLM_F_DUMP_INTR); the listing is started again.
var errDumpInterrupted = errors.New("nf_tables dump interrupted by a ruleset change")

// listNetlink lists the ruleset (table == "") or one table over netlink in
// the network namespace at netns ("" the caller's). The listing ends at
// deadline (ErrTimeout) or when ctx ends; more than maxObjects tables,
// chains, rules, sets and elements together is ErrTooLarge. A missing
// table is ErrNoTable.
func listNetlink(ctx context.Context, netns string, deadline time.Time, maxObjects int, f Family, table string, cache *anonCache) (*Ruleset, int64, error) {
	// Two sockets: one receiving the big dumps in 32 KiB answers (the
	// kernel sizes a dump's answers by the largest buffer the socket
	// received into), one for the many small per-chain rule dumps, whose
	// answers then take a page each, not 32 KiB.
	var fds [2]int
	err := nfnetlink.InNetNS(netns, func() error {
		for i := range fds {
			fd, err := unix.Socket(unix.AF_NETLINK, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.NETLINK_NETFILTER)
			if err != nil {
				if i == 1 {
					unix.Close(fds[0])
				}
				return fmt.Errorf("netlink socket: %w", err)
			}
			fds[i] = fd
		}
		return nil
	})
	if err != nil {
		return nil, 0, err
	}
	defer unix.Close(fds[0])
	defer unix.Close(fds[1])
	for _, fd := range fds {
		if err := unix.Bind(fd, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
			return nil, 0, fmt.Errorf("netlink bind: %w", err)
		}
		_ = unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_RCVBUF, 1<<20)
		// Receives wake up at least every recvSlice to check the
		// deadline and the context.
		tv := unix.NsecToTimeval(recvSlice.Nanoseconds())
		if err := unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv); err != nil {
			return nil, 0, fmt.Errorf("netlink timeout: %w", err)
		}
	}
	r := &nlReader{ctx: ctx, deadline: deadline, fd: fds[0], buf: make([]byte, 64<<10), max: maxObjects, cache: cache,
		smallFD: fds[1], smallBuf: make([]byte, 8<<10)}
	var total int64
	for try := 0; ; try++ {
		r.objects = 0
		rs, err := r.read(f, table)
		total += r.bytes
		r.bytes = 0
		if errors.Is(err, errDumpInterrupted) && try < maxDumpRetries {
			continue
		}
		return rs, total, err
	}
}

// read lists once.
func (r *nlReader) read(f Family, table string) (*Ruleset, error) {
	rs := &Ruleset{}
	fam := byte(unix.NFPROTO_UNSPEC)
	if table != "" {
		fam = familyNumber(f)
	}
	// Tables.
	err := r.dump(unix.NFT_MSG_GETTABLE, fam, nil, func(nfam byte, ad *netlink.AttributeDecoder) error {
		t, err := decodeTable(nfam, ad)
		if err != nil {
			return err
		}
		if table != "" && t.Name != table {
			return nil
		}
		rs.Tables = append(rs.Tables, t)
		return nil
	})
	if err != nil {
		return nil, err
	}
	if table != "" && len(rs.Tables) == 0 {
		return nil, fmt.Errorf("%w: %s %s", ErrNoTable, f, table)
	}
	anon := map[*Table]map[string]*Set{}
	seen := map[anonKey]bool{}
	seenRules := map[ruleKey]bool{}
	for _, t := range rs.Tables {
		tfam := familyNumber(t.Family)
		byTable := []netlink.Attribute{{Type: unix.NFTA_CHAIN_TABLE, Data: cstr(t.Name)}}
		if err := r.dump(unix.NFT_MSG_GETCHAIN, tfam, byTable, func(_ byte, ad *netlink.AttributeDecoder) error {
			c, tname, err := decodeChain(t.Family, ad)
			if err != nil || tname != t.Name {
				return err
			}
			if t.chains[c.Name] != nil {
				return fmt.Errorf("chain %q listed twice in table %s %s", c.Name, t.Family, t.Name)
			}
			t.chains[c.Name] = c
			t.Chains = append(t.Chains, c)
			return nil
		}); err != nil {
			return nil, err
		}
		anon[t] = map[string]*Set{}
		var anonOrder []*Set
		if err := r.dump(unix.NFT_MSG_GETSET, tfam, []netlink.Attribute{{Type: unix.NFTA_SET_TABLE, Data: cstr(t.Name)}},
			func(_ byte, ad *netlink.AttributeDecoder) error {
				s, tname, anonymous, err := decodeSet(t.Family, ad)
				if err != nil || tname != t.Name {
					return err
				}
				if anonymous {
					anon[t][s.Name] = s
					anonOrder = append(anonOrder, s)
					return nil
				}
				if t.sets[s.Name] != nil {
					return fmt.Errorf("set or map %q listed twice in table %s %s", s.Name, t.Family, t.Name)
				}
				t.sets[s.Name] = s
				t.Sets = append(t.Sets, s)
				return nil
			}); err != nil {
			return nil, err
		}
		// Elements of named sets, then of the anonymous ones the rules use
		// (kube-proxy's numgen vmaps: one per service chain).
		all := append(append([]*Set(nil), t.Sets...), anonOrder...)
		for _, s := range all {
			// A constant anonymous set cannot change: its elements read
			// by an earlier listing serve (the kernel finds a set by a
			// linear walk of the table's sets, so reading each of
			// kube-proxy's 30,000 anonymous maps costs O(n^2): 90 s).
			key := anonKey{fam: t.Family, table: t.Name, name: s.Name, handle: s.Handle}
			if s.meta.constant && anon[t][s.Name] == s {
				seen[key] = true
				if els, ok := r.cache.get(key); ok {
					s.Elements, s.meta = els, nil
					r.objects += len(els)
					continue
				}
			}
			attrs := []netlink.Attribute{{Type: unix.NFTA_SET_ELEM_LIST_TABLE, Data: cstr(t.Name)}, {Type: unix.NFTA_SET_ELEM_LIST_SET, Data: cstr(s.Name)}}
			if err := r.dump(unix.NFT_MSG_GETSETELEM, tfam, attrs, func(_ byte, ad *netlink.AttributeDecoder) error {
				n, err := decodeElements(s, ad)
				r.objects += n
				return err
			}); err != nil {
				return nil, fmt.Errorf("elements of %s %s %s: %w", t.Family, t.Name, s.Name, err)
			}
			s.finishElements()
			if seen[key] {
				r.cache.put(key, s.Elements)
			}
		}
		onRule := func(_ byte, ad *netlink.AttributeDecoder) error {
			chain, tname, ru, err := decodeRule(t.Family, ad, anon[t], r.cache, seenRules)
			if err != nil || tname != t.Name {
				return err
			}
			c := t.chains[chain]
			if c == nil {
				return fmt.Errorf("rule %d: no chain %q in table %s %s", ru.Handle, chain, t.Family, t.Name)
			}
			c.Rules = append(c.Rules, ru)
			return nil
		}
		byRuleTable := netlink.Attribute{Type: unix.NFTA_RULE_TABLE, Data: cstr(t.Name)}
		if len(t.Chains) <= perChainRuleDumps {
			if err := r.dump(unix.NFT_MSG_GETRULE, tfam, []netlink.Attribute{byRuleTable}, onRule); err != nil {
				return nil, err
			}
			continue
		}
		// A table-wide rule dump restarts from the table's first rule at
		// each receive (the kernel skips what it sent): quadratic, 6.6 s
		// at 30,000 service ports. One dump per chain finds the chain by
		// hash.
		r.fd, r.smallFD, r.buf, r.smallBuf = r.smallFD, r.fd, r.smallBuf, r.buf
		for _, c := range t.Chains {
			if err := r.dump(unix.NFT_MSG_GETRULE, tfam, []netlink.Attribute{byRuleTable, {Type: unix.NFTA_RULE_CHAIN, Data: cstr(c.Name)}}, onRule); err != nil {
				return nil, fmt.Errorf("rules of chain %s: %w", c.ID(), err)
			}
		}
		r.fd, r.smallFD, r.buf, r.smallBuf = r.smallFD, r.fd, r.smallBuf, r.buf
	}
	r.cache.prune(rs.Tables, table == "", seen)
	r.cache.pruneRules(rs.Tables, table == "", seenRules)
	return rs, nil
}

// dump sends one dump request and hands each answer's attributes (after
// the nfgenmsg header) to fn as it arrives.
func (r *nlReader) dump(msg uint16, fam byte, attrs []netlink.Attribute, fn func(fam byte, ad *netlink.AttributeDecoder) error) error {
	data, err := netlink.MarshalAttributes(attrs)
	if err != nil {
		return err
	}
	r.seq++
	req := netlink.Message{
		Header: netlink.Header{
			Type:     netlink.HeaderType(unix.NFNL_SUBSYS_NFTABLES<<8 | int(msg)),
			Flags:    netlink.Request | netlink.Dump,
			Sequence: r.seq,
		},
		Data: append([]byte{fam, unix.NFNETLINK_V0, 0, 0}, data...),
	}
	req.Header.Length = uint32(unix.NLMSG_HDRLEN + len(req.Data))
	b, err := req.MarshalBinary()
	if err != nil {
		return err
	}
	if err := unix.Sendto(r.fd, b, 0, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		return fmt.Errorf("netlink send: %w", err)
	}
	var ferr error
	for {
		n, err := r.recv()
		if err != nil {
			return err
		}
		done, err := r.each(r.buf[:n], func(m netlink.Message) error {
			if ferr != nil {
				return nil // drain the dump after fn failed
			}
			if len(m.Data) < 4 {
				ferr = errors.New("short nf_tables message")
				return nil
			}
			ad, err := netlink.NewAttributeDecoder(m.Data[4:])
			if err != nil {
				ferr = err
				return nil
			}
			ad.ByteOrder = binary.BigEndian
			r.objects++
			if r.max > 0 && r.objects > r.max {
				return fmt.Errorf("%w: more than %d tables, chains, rules, sets and elements", ErrTooLarge, r.max)
			}
			if err := fn(m.Data[0], ad); err != nil {
				ferr = err
				return nil
			}
			if err := ad.Err(); err != nil {
				ferr = err
			}
			return nil
		})
		if err != nil {
			return err
		}
		if r.max > 0 && r.objects > r.max {
			return fmt.Errorf("%w: more than %d tables, chains, rules, sets and elements", ErrTooLarge, r.max)
		}
		if done {
			return ferr
		}
	}
}

// each walks the messages of one receive; done at NLMSG_DONE.
func (r *nlReader) each(b []byte, fn func(netlink.Message) error) (bool, error) {
	for len(b) >= unix.NLMSG_HDRLEN {
		l := int(binary.NativeEndian.Uint32(b[0:4]))
		if l < unix.NLMSG_HDRLEN || l > len(b) {
			return false, fmt.Errorf("netlink message of length %d in %d bytes", l, len(b))
		}
		var m netlink.Message
		if err := m.UnmarshalBinary(b[:l]); err != nil {
			return false, err
		}
		al := (l + unix.NLMSG_ALIGNTO - 1) &^ (unix.NLMSG_ALIGNTO - 1)
		if al > len(b) {
			al = len(b)
		}
		b = b[al:]
		if m.Header.Sequence != r.seq {
			continue // an answer to an earlier, abandoned request
		}
		if m.Header.Flags&nlmFDumpInterrupted != 0 {
			return false, errDumpInterrupted
		}
		switch m.Header.Type {
		case netlink.Done:
			return true, nil
		case netlink.Error:
			if len(m.Data) >= 4 {
				if code := int32(binary.NativeEndian.Uint32(m.Data[:4])); code != 0 {
					errno := unix.Errno(-code)
					if errno == unix.ENOENT {
						return false, fmt.Errorf("%w: %v", ErrNoTable, errno)
					}
					return false, fmt.Errorf("netlink: %w", errno)
				}
			}
			return true, nil
		case netlink.Noop, netlink.Overrun:
			continue
		}
		if err := fn(m); err != nil {
			return false, err
		}
	}
	return false, nil
}

// recv reads one datagram, waiting at most until the deadline and giving
// up when ctx ends (checked at least every recvSlice).
func (r *nlReader) recv() (int, error) {
	for {
		if err := r.ctx.Err(); err != nil {
			return 0, err
		}
		if !time.Now().Before(r.deadline) {
			return 0, ErrTimeout
		}
		n, _, err := unix.Recvfrom(r.fd, r.buf, 0)
		switch {
		case err == unix.EAGAIN || err == unix.EINTR:
			continue
		case err == unix.ENOBUFS:
			return 0, fmt.Errorf("netlink receive: %w (the dump overran the socket buffer)", err)
		case err != nil:
			return 0, fmt.Errorf("netlink receive: %w", err)
		}
		r.bytes += int64(n)
		return n, nil
	}
}

func cstr(s string) []byte { return append([]byte(s), 0) }

// familyNumber is the NFPROTO_ number of a family.
func familyNumber(f Family) byte {
	switch f {
	case FamilyIP:
		return unix.NFPROTO_IPV4
	case FamilyIP6:
		return unix.NFPROTO_IPV6
	case FamilyInet:
		return unix.NFPROTO_INET
	case FamilyARP:
		return unix.NFPROTO_ARP
	case FamilyBridge:
		return unix.NFPROTO_BRIDGE
	case FamilyNetdev:
		return unix.NFPROTO_NETDEV
	}
	return unix.NFPROTO_UNSPEC
}
