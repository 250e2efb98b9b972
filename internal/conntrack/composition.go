package conntrack

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"sort"
	"strconv"
	"strings"
	"time"
)

// TCP conntrack states (enum tcp_conntrack, Flow.TCPState).
const (
	TCPStateNone        uint8 = 0
	TCPStateSynSent     uint8 = 1
	TCPStateSynRecv     uint8 = 2
	TCPStateEstablished uint8 = 3
	TCPStateFinWait     uint8 = 4
	TCPStateCloseWait   uint8 = 5
	TCPStateLastAck     uint8 = 6
	TCPStateTimeWait    uint8 = 7
	TCPStateClose       uint8 = 8
	TCPStateSynSent2    uint8 = 9
)

// tcpStateNames are the names conntrack(8) prints, indexed by state.
var tcpStateNames = [...]string{"NONE", "SYN_SENT", "SYN_RECV", "ESTABLISHED", "FIN_WAIT", "CLOSE_WAIT", "LAST_ACK", "TIME_WAIT", "CLOSE", "SYN_SENT2"}

// Class is what a group of entries is, for the breakdown: "tcp/<STATE>"
// (conntrack(8)'s state names), "udp/stream" (packets seen both ways: lives
// nf_conntrack_udp_timeout_stream), "udp/unreplied" (lives
// nf_conntrack_udp_timeout), "icmp", "icmpv6", "sctp", "other". The set is
// fixed, so a label of classes has bounded cardinality.
type Class string

// Classes the timeout tuning acts on.
const (
	ClassUDPStream    Class = "udp/stream"
	ClassUDPUnreplied Class = "udp/unreplied"
	ClassTCPTimeWait  Class = "tcp/TIME_WAIT"
)

// class indexes: TCP states 0..len(tcpStateNames)-1, then these.
const (
	classTCPOther = len(tcpStateNames) + iota // a TCP state this code does not know
	classUDPStream
	classUDPUnreplied
	classICMP
	classICMPv6
	classSCTP
	classOther
	numClasses
)

const (
	protoICMP   uint8 = 1
	protoICMPv6 uint8 = 58
	protoSCTP   uint8 = 132
)

// AllClasses lists every class in a fixed order (for metrics initialised
// at 0).
func AllClasses() []Class {
	out := make([]Class, numClasses)
	for i := range out {
		out[i] = classAt(i)
	}
	return out
}

func classAt(i int) Class {
	switch {
	case i < len(tcpStateNames):
		return Class("tcp/" + tcpStateNames[i])
	case i == classTCPOther:
		return "tcp/other"
	case i == classUDPStream:
		return ClassUDPStream
	case i == classUDPUnreplied:
		return ClassUDPUnreplied
	case i == classICMP:
		return "icmp"
	case i == classICMPv6:
		return "icmpv6"
	case i == classSCTP:
		return "sctp"
	}
	return "other"
}

func classIndex(f *Flow) int {
	switch f.Proto {
	case ProtoTCP:
		if int(f.TCPState) < len(tcpStateNames) {
			return int(f.TCPState)
		}
		return classTCPOther
	case ProtoUDP:
		if f.Status&StatusSeenReply != 0 {
			return classUDPStream
		}
		return classUDPUnreplied
	case protoICMP:
		return classICMP
	case protoICMPv6:
		return classICMPv6
	case protoSCTP:
		return classSCTP
	}
	return classOther
}

// Endpoint is one key of the top-N lists: a destination (protocol,
// original destination address and port) or a source (original source
// address only: client ports are ephemeral, Proto and Port are 0).
type Endpoint struct {
	Proto uint8
	Addr  netip.Addr
	Port  uint16
}

// ProtoName is "tcp", "udp", "icmp", ... or the number.
func ProtoName(p uint8) string {
	switch p {
	case ProtoTCP:
		return "tcp"
	case ProtoUDP:
		return "udp"
	case protoICMP:
		return "icmp"
	case protoICMPv6:
		return "icmpv6"
	case protoSCTP:
		return "sctp"
	}
	return strconv.Itoa(int(p))
}

// String is "udp/10.96.0.10:53" for a destination, "10.1.2.3" for a
// source.
func (e Endpoint) String() string {
	if e.Proto == 0 {
		return e.Addr.String()
	}
	return ProtoName(e.Proto) + "/" + netip.AddrPortFrom(e.Addr, e.Port).String()
}

// MarshalText implements encoding.TextMarshaler (the evidence is JSON).
func (e Endpoint) MarshalText() ([]byte, error) { return []byte(e.String()), nil }

// UnmarshalText implements encoding.TextUnmarshaler (String's format).
func (e *Endpoint) UnmarshalText(b []byte) error {
	s := string(b)
	proto, rest, found := strings.Cut(s, "/")
	if !found {
		a, err := netip.ParseAddr(s)
		if err != nil {
			return fmt.Errorf("endpoint %q: %w", s, err)
		}
		*e = Endpoint{Addr: a}
		return nil
	}
	var p uint8
	switch proto {
	case "tcp":
		p = ProtoTCP
	case "udp":
		p = ProtoUDP
	case "icmp":
		p = protoICMP
	case "icmpv6":
		p = protoICMPv6
	case "sctp":
		p = protoSCTP
	default:
		n, err := strconv.ParseUint(proto, 10, 8)
		if err != nil || n == 0 {
			return fmt.Errorf("endpoint %q: unknown protocol %q", s, proto)
		}
		p = uint8(n)
	}
	ap, err := netip.ParseAddrPort(rest)
	if err != nil {
		return fmt.Errorf("endpoint %q: %w", s, err)
	}
	*e = Endpoint{Proto: p, Addr: ap.Addr(), Port: ap.Port()}
	return nil
}

// ClassCount is the exact number of entries of one class.
type ClassCount struct {
	Class Class  `json:"class"`
	Count uint64 `json:"count"`
}

// HeavyHitter is one of the top destinations or sources. Its Count is an
// upper bound of the true count and Count-MaxOvercount a lower bound
// (space-saving; both exact when MaxOvercount is 0).
type HeavyHitter struct {
	Endpoint     Endpoint `json:"endpoint"`
	Count        uint64   `json:"count"`
	MaxOvercount uint64   `json:"maxOvercount,omitempty"`
}

// Composition is a bounded breakdown of the table: exact counts per class
// and the top destinations and sources. Its size does not depend on the
// table's: at most numClasses classes and TopN hitters each.
type Composition struct {
	// Total is how many entries the dump returned.
	Total uint64 `json:"total"`
	// Classes are the non-empty classes, largest first.
	Classes []ClassCount `json:"classes"`
	// TopDestinations and TopSources are the heaviest original
	// destinations (protocol, address, port) and sources (address),
	// largest first.
	TopDestinations []HeavyHitter `json:"topDestinations"`
	TopSources      []HeavyHitter `json:"topSources"`
	// SketchCapacity is the number of counters of each top-N sketch: any
	// key holding more than Total/SketchCapacity entries is guaranteed to
	// be listed if it is among the TopN, and no count is over by more
	// than Total/SketchCapacity.
	SketchCapacity int `json:"sketchCapacity"`
	// Truncated is true when the dump stopped at its entry limit (the
	// counts cover the first Total entries only).
	Truncated bool `json:"truncated,omitempty"`
	// DurationMs is the time of the dump.
	DurationMs int64 `json:"durationMs"`
}

// Count returns the exact number of entries of class c.
func (c Composition) Count(class Class) uint64 {
	for _, cc := range c.Classes {
		if cc.Class == class {
			return cc.Count
		}
	}
	return 0
}

// Share returns the fraction of the dumped entries of class c (0 when
// nothing was dumped).
func (c Composition) Share(class Class) float64 {
	if c.Total == 0 {
		return 0
	}
	return float64(c.Count(class)) / float64(c.Total)
}

// Summary is one line: the largest classes and the top destination.
func (c Composition) Summary() string {
	if c.Total == 0 {
		return "table empty when dumped"
	}
	var parts []string
	for i, cc := range c.Classes {
		if i == 3 {
			break
		}
		parts = append(parts, fmt.Sprintf("%s %.0f%%", cc.Class, 100*float64(cc.Count)/float64(c.Total)))
	}
	s := strings.Join(parts, ", ")
	if c.Truncated {
		s = fmt.Sprintf("(first %d entries) %s", c.Total, s)
	}
	if len(c.TopDestinations) > 0 {
		h := c.TopDestinations[0]
		s += fmt.Sprintf("; top destination %s (%d entries, %.0f%%)", h.Endpoint, h.Count, 100*float64(h.Count)/float64(c.Total))
	}
	if len(c.TopSources) > 0 {
		h := c.TopSources[0]
		s += fmt.Sprintf("; top source %s (%d)", h.Endpoint, h.Count)
	}
	return s
}

// Composer counts a stream of entries into a Composition with memory
// bounded by its capacity, whatever the table's size: exact per-class
// counters and, for destinations and sources, a space-saving sketch
// (Metwally, Agrawal, El Abbadi 2005) of capacity m: for N entries every
// key with more than N/m entries is kept, and each kept count overstates
// the truth by at most the count of the counter it replaced (recorded per
// key, <= N/m). While there are at most m distinct keys the counts are
// exact. Not goroutine-safe.
type Composer struct {
	topN    int
	classes [numClasses]uint64
	total   uint64
	dst     spaceSaving
	src     spaceSaving
}

// DefaultTopN and DefaultSketchCapacity size a Composer.
const (
	DefaultTopN           = 5
	DefaultSketchCapacity = 64
)

// NewComposer returns a Composer that reports topN hitters from sketches
// of capacity counters (capacity >= topN; defaults when <= 0).
func NewComposer(topN, capacity int) *Composer {
	if topN <= 0 {
		topN = DefaultTopN
	}
	if capacity <= 0 {
		capacity = DefaultSketchCapacity
	}
	capacity = max(capacity, topN)
	return &Composer{topN: topN, dst: newSpaceSaving(capacity), src: newSpaceSaving(capacity)}
}

// Add counts one entry.
func (c *Composer) Add(f *Flow) {
	c.total++
	c.classes[classIndex(f)]++
	c.dst.add(Endpoint{Proto: f.Proto, Addr: f.OrigDst.Addr().Unmap(), Port: f.OrigDst.Port()})
	c.src.add(Endpoint{Addr: f.OrigSrc.Addr().Unmap()})
}

// Result returns the breakdown so far.
func (c *Composer) Result() Composition {
	out := Composition{Total: c.total, SketchCapacity: c.dst.capacity}
	for i, n := range c.classes {
		if n > 0 {
			out.Classes = append(out.Classes, ClassCount{Class: classAt(i), Count: n})
		}
	}
	sort.SliceStable(out.Classes, func(i, j int) bool { return out.Classes[i].Count > out.Classes[j].Count })
	out.TopDestinations = c.dst.top(c.topN)
	out.TopSources = c.src.top(c.topN)
	return out
}

// spaceSaving is the stream-summary of the space-saving algorithm as a
// min-heap (of positions into a fixed array of counters, so reordering the
// heap touches no map) with an index from key to counter: O(log m) per
// entry, m counters of memory.
type spaceSaving struct {
	capacity int
	counters []ssCounter // never reordered
	heap     []int32     // counter numbers, a min-heap by count
	index    map[Endpoint]int32
}

type ssCounter struct {
	key        Endpoint
	count, err uint64
	pos        int32 // in heap
}

func newSpaceSaving(capacity int) spaceSaving {
	return spaceSaving{capacity: capacity, counters: make([]ssCounter, 0, capacity), heap: make([]int32, 0, capacity),
		index: make(map[Endpoint]int32, capacity)}
}

func (s *spaceSaving) add(k Endpoint) {
	if c, ok := s.index[k]; ok {
		s.counters[c].count++
		s.down(int(s.counters[c].pos))
		return
	}
	if len(s.counters) < s.capacity {
		c := int32(len(s.counters))
		s.counters = append(s.counters, ssCounter{key: k, count: 1, pos: int32(len(s.heap))})
		s.heap = append(s.heap, c)
		s.index[k] = c
		s.up(len(s.heap) - 1)
		return
	}
	// Replace the smallest counter: the newcomer inherits its count as
	// possible overcount.
	c := s.heap[0]
	m := &s.counters[c]
	delete(s.index, m.key)
	m.key, m.err = k, m.count
	m.count++
	s.index[k] = c
	s.down(0)
}

func (s *spaceSaving) less(i, j int) bool {
	return s.counters[s.heap[i]].count < s.counters[s.heap[j]].count
}

func (s *spaceSaving) swap(i, j int) {
	s.heap[i], s.heap[j] = s.heap[j], s.heap[i]
	s.counters[s.heap[i]].pos = int32(i)
	s.counters[s.heap[j]].pos = int32(j)
}

func (s *spaceSaving) up(i int) {
	for i > 0 {
		p := (i - 1) / 2
		if !s.less(i, p) {
			return
		}
		s.swap(i, p)
		i = p
	}
}

func (s *spaceSaving) down(i int) {
	n := len(s.heap)
	for {
		l := 2*i + 1
		if l >= n {
			return
		}
		m := l
		if r := l + 1; r < n && s.less(r, l) {
			m = r
		}
		if !s.less(m, i) {
			return
		}
		s.swap(i, m)
		i = m
	}
}

// top returns the n largest counters, largest first (ties: by key text,
// for stable output).
func (s *spaceSaving) top(n int) []HeavyHitter {
	c := append([]ssCounter(nil), s.counters...)
	sort.Slice(c, func(i, j int) bool {
		if c[i].count != c[j].count {
			return c[i].count > c[j].count
		}
		return c[i].key.String() < c[j].key.String()
	})
	if len(c) > n {
		c = c[:n]
	}
	out := make([]HeavyHitter, len(c))
	for i, e := range c {
		out[i] = HeavyHitter{Endpoint: e.key, Count: e.count, MaxOvercount: e.err}
	}
	return out
}

// TableScanner is implemented by adapters that can stream every entry of
// the observed namespace (both address families, every protocol) in one
// dump without loading the table (the real adapter and the fake).
type TableScanner interface {
	// ScanTable streams every entry, calling fn for each (f is reused:
	// copy it to keep it), stopping after limit entries (> 0) with
	// Truncated set, or when fn returns an error (returned).
	ScanTable(ctx context.Context, limit int, fn func(f *Flow) error) (ScanResult, error)
}

// Compose computes the breakdown of the table in one streamed dump of at
// most limit entries. Memory: one datagram and the Composer's counters.
func Compose(ctx context.Context, ts TableScanner, topN, limit int) (Composition, error) {
	if limit <= 0 {
		return Composition{}, errors.New("composition needs a positive entry limit")
	}
	start := time.Now()
	c := NewComposer(topN, 0)
	res, err := ts.ScanTable(ctx, limit, func(f *Flow) error {
		c.Add(f)
		return nil
	})
	out := c.Result()
	out.Truncated = res.Truncated
	out.DurationMs = time.Since(start).Milliseconds()
	if err != nil {
		return out, fmt.Errorf("conntrack breakdown: %w", err)
	}
	return out, nil
}

// EvidenceComposition is the evidence key of the table finding's
// breakdown (a Composition).
const EvidenceComposition = "breakdown"

// PutEvidence writes the breakdown into a finding's evidence.
func (c Composition) PutEvidence(ev map[string]any) { ev[EvidenceComposition] = c }

// DecodeComposition reads the breakdown back from a finding's evidence:
// the Composition itself, or its JSON form (a finding read back from JSON).
// ok is false when the finding carries none.
func DecodeComposition(ev map[string]any) (c Composition, ok bool, err error) {
	v, present := ev[EvidenceComposition]
	if !present || v == nil {
		return c, false, nil
	}
	switch x := v.(type) {
	case Composition:
		return x, true, nil
	case *Composition:
		return *x, x != nil, nil
	}
	b, err := json.Marshal(v)
	if err == nil {
		err = json.Unmarshal(b, &c)
	}
	if err != nil {
		return Composition{}, false, fmt.Errorf("evidence %q: %w", EvidenceComposition, err)
	}
	return c, true, nil
}
