// Package nftables observes the node's nftables ruleset read-only and
// parses it into typed values: tables, chains (with their hook, type,
// priority and policy when they are base chains), rules (their verdicts,
// jumps, verdict maps and NAT statements), and sets and maps with their
// elements.
//
// Two readers give the same values. The netlink reader (netlink_linux.go,
// the default where the network namespace is known) sends the dump
// requests nft itself sends over a NETLINK_NETFILTER socket and decodes
// the answers as they arrive, with rules' expressions decoded by
// github.com/google/nftables/expr and turned back into nft's statements
// (delinearize_linux.go); it is bounded by a deadline and by a number of
// objects (Config.MaxObjects). The nft reader runs `nft -j list ruleset`
// (or `nft -j list table FAMILY NAME`) under a context deadline, reads at
// most a bounded amount of its output and parses the JSON (parse.go); it
// serves behind a command prefix without a known namespace, when netlink
// fails, and as the tests' oracle. At 30,000 Services nft -j took 82 s and
// 51 MB; netlink lists the same table in about a second (docs/SCALE.md).
//
// Nothing here changes the ruleset. The adapter never runs `nft` with
// anything but `list` and never sends netlink messages but dump requests;
// kube-proxy's documentation says never to edit its table by hand, and a
// daemon that does would fight kube-proxy's next sync. Listing takes no
// lock (nftables has no xtables lock; a listing is netlink dumps, started
// again if the ruleset changes under them).
//
// On top of the generic parse, ParseKubeProxy reads kube-proxy's own table
// (`table ip kube-proxy` / `table ip6 kube-proxy`, nftables mode) into what
// it programs: which Service IP, protocol and port goes to which service
// chain, which endpoint chains a service chain load-balances over, and which
// backend each endpoint chain DNATs to (see kubeproxy.go).
//
// sigs.k8s.io/knftables was considered and not used: its constructor
// probes the kernel with `nft --check add table` (a dry-run write), each
// Interface is bound to one table (the shadowing check needs every table),
// and its List calls return names only, not chains' hooks and priorities.
package nftables

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os/exec"
	"strings"
	"sync"
	"time"

	"k8s.io/utils/clock"
)

// Family is an nftables address family as nft names it.
type Family string

// Families.
const (
	FamilyIP     Family = "ip"
	FamilyIP6    Family = "ip6"
	FamilyInet   Family = "inet"
	FamilyARP    Family = "arp"
	FamilyBridge Family = "bridge"
	FamilyNetdev Family = "netdev"
)

// CoversIPv4 reports whether a base chain of this family sees IPv4 packets
// (ip and inet tables do).
func (f Family) CoversIPv4() bool { return f == FamilyIP || f == FamilyInet }

// CoversIPv6 reports whether a base chain of this family sees IPv6 packets
// (ip6 and inet tables do).
func (f Family) CoversIPv6() bool { return f == FamilyIP6 || f == FamilyInet }

// Errors the adapters return (wrapped).
var (
	// ErrUnavailable: the nft command is not installed.
	ErrUnavailable = errors.New("nft unavailable")
	// ErrNoTable: the table asked for by ListTable does not exist.
	ErrNoTable = errors.New("no such nftables table")
	// ErrTooLarge: the listing exceeded the output limit (nft) or the
	// object limit (netlink).
	ErrTooLarge = errors.New("nft output larger than the limit")
	// ErrTimeout: the listing did not finish within its own bound (the
	// Timeout, or three quarters of what the caller's deadline left): a
	// fact about the ruleset's size, unlike the caller's deadline.
	ErrTimeout = errors.New("nft listing did not finish in time")
)

// Snapshot is one parsed listing.
type Snapshot struct {
	Ruleset *Ruleset
	// At is when the listing started (the adapter's clock).
	At time.Time
	// Duration is how long nft ran.
	Duration time.Duration
	// Bytes is the size of nft's output, or of the netlink answers.
	Bytes int64
	// Reader is how it was listed: ReaderNetlink or ReaderNFT.
	Reader Reader
	// Seq increases with every real listing, so a caller seeing the same
	// Seq twice knows it got a cached copy.
	Seq uint64
}

// Interface lists the ruleset. Implementations must be goroutine-safe and
// never change the ruleset.
type Interface interface {
	// ListRuleset lists every table of every family (`nft -j list
	// ruleset`). A missing nft is ErrUnavailable. The answer may be shared
	// with other callers of the same cycle (see Config.CacheTTL).
	ListRuleset(ctx context.Context) (*Snapshot, error)
	// ListTable lists one table (`nft -j list table FAMILY NAME`); a
	// table that does not exist is ErrNoTable.
	ListTable(ctx context.Context, f Family, name string) (*Snapshot, error)
}

// Defaults of Config.
const (
	DefaultTimeout = 10 * time.Second
	// DefaultMaxBytes bounds nft's output. kube-proxy's table in JSON is
	// roughly 1.5 KiB per service port plus 1 KiB per endpoint: 64 MiB is
	// tens of thousands of services, and a runaway listing cannot exhaust
	// the daemon's memory.
	DefaultMaxBytes = 64 << 20
	// DefaultCacheTTL lets the detectors of one cycle share one listing.
	DefaultCacheTTL = 2 * time.Second
	// DefaultMaxDutyCycle: see Config.MaxDutyCycle.
	DefaultMaxDutyCycle = 0.1
	// DefaultReuseFor: see Config.ReuseFor.
	DefaultReuseFor = time.Minute
	// DefaultMaxObjects bounds a netlink listing: tables, chains, rules,
	// sets and elements together. kube-proxy's table holds about 8
	// objects per service port with two endpoints (a service chain and
	// its anonymous map's 2 elements, 2 endpoint chains with 2 rules
	// each, a service-ips element): 500,000 is some 60,000 service
	// ports, about 250 MB of model at most.
	DefaultMaxObjects = 500_000
)

// Reader is how the ruleset is read.
type Reader string

// Readers.
const (
	// ReaderAuto (the zero value): netlink where the network namespace
	// is known (no Prefix, or NetNS set), nft otherwise and when the
	// netlink listing fails for a reason other than the ruleset's size,
	// time, or a missing table.
	ReaderAuto Reader = ""
	// ReaderNetlink: netlink dumps only.
	ReaderNetlink Reader = "netlink"
	// ReaderNFT: `nft -j list` only.
	ReaderNFT Reader = "nft"
)

// Config configures the real adapter. Zero fields take the defaults.
type Config struct {
	// Prefix is prepended to every command, e.g. ["ip", "netns", "exec",
	// "ns1"] or ["nsenter", "-t", "1", "-n"]. Empty runs in the current
	// network namespace.
	Prefix []string
	// Binary is the nft program (default "nft", looked up in PATH).
	Binary string
	// Timeout bounds each listing (netlink or nft) when ctx has no
	// earlier deadline.
	Timeout time.Duration
	// MaxBytes bounds nft's output; more is ErrTooLarge.
	MaxBytes int64
	// CacheTTL is how long a ListRuleset answer (or failure) is reused;
	// negative turns the cache off.
	CacheTTL time.Duration
	// MaxDutyCycle caps the share of time spent listing the ruleset: a
	// listing that took D is reused for at least D/MaxDutyCycle (default
	// 0.1; negative: off). Listing is not free: measured here, `nft -j list
	// ruleset` of a kube-proxy table of 5,000 service ports (2 endpoints
	// each, 10 MB of JSON) costs nft about 2.4 s of CPU, the parse ~0.4 s.
	// Small tables list in milliseconds and are not affected.
	MaxDutyCycle float64
	// Clock defaults to the real clock.
	Clock clock.PassiveClock
	// NetNS is the network namespace file the Prefix enters
	// (/var/run/netns/NAME), where the change check reads the nf_tables
	// generation. With a Prefix and no NetNS there is no change check:
	// every listing past the cache runs nft.
	NetNS string
	// ReuseFor bounds how long a listing is returned again because the
	// namespace's nf_tables generation has not moved since it was listed
	// (default DefaultReuseFor; negative turns reuse off). The generation
	// moves with every committed transaction (any rule, chain, set, table
	// or element written through netlink); what it does not count are the
	// elements the packet path adds to dynamic sets (kube-proxy's session
	// affinity sets) and counters, which no check reads: those are seen
	// at most ReuseFor late.
	ReuseFor time.Duration
	// Reader chooses the netlink or the nft reader (default ReaderAuto).
	Reader Reader
	// MaxObjects bounds a netlink listing (default DefaultMaxObjects);
	// more is ErrTooLarge.
	MaxObjects int
}

// Real lists over netlink or runs nft (Config.Reader). A listing (of the
// ruleset, or of one table, a missing table included) is kept with the
// nf_tables generation read before it ran, and returned again without
// listing while the generation has not moved (Config.ReuseFor): on a node
// whose nftables rules do not change (iptables or IPVS mode, or a quiet
// nftables-mode kube-proxy) the ruleset is listed once, not every cycle.
// When the generation cannot be read, every call lists.
type Real struct {
	cfg Config

	mu     sync.Mutex // held while listing, so concurrent callers share one run
	seq    uint64
	cached *Snapshot
	err    error
	at     time.Time
	took   time.Duration // how long the cached listing ran
	// kept are the listings reused while the generation is unchanged,
	// by what was listed ("ruleset", "table ip kube-proxy").
	kept map[string]keptListing
	// anon keeps the elements of constant anonymous sets between netlink
	// listings.
	anon anonCache
}

// anonKey names one anonymous set: the kernel never reuses a handle
// within a table, and a constant set's elements never change.
type anonKey struct {
	fam         Family
	table, name string
	handle      uint64
}

// anonCache keeps the elements of the constant anonymous sets (kube-proxy's
// numgen vmaps, one per service chain) read by earlier listings, so that a
// listing reads only the sets created since: a cold listing of kube-proxy's
// table at 30,000 Services spends ~90 s in the kernel finding each
// anonymous set by name (a linear walk of the table's sets), a warm one
// seconds. A listing cut by its deadline keeps what it read, so the next
// one goes further. Entries of sets gone from a completely listed table
// are dropped.
type anonCache struct {
	m map[anonKey][]Element
	// rules are decoded rules by table, chain and handle, with a hash of
	// their netlink bytes: decoding is most of a warm listing's CPU.
	rules map[ruleKey]ruleEntry
}

// ruleKey names one rule.
type ruleKey struct {
	fam          Family
	table, chain string
	handle       uint64
}

// ruleEntry is a decoded rule, the hash of its expressions and comment,
// and the handles of the anonymous sets it reads.
type ruleEntry struct {
	sum  uint64
	rule *Rule
	refs map[string]uint64
}

// refsMatch reports whether the anonymous sets the rule read are still
// the same sets.
func (e ruleEntry) refsMatch(anon map[string]*Set) bool {
	for name, h := range e.refs {
		if s := anon[name]; s == nil || s.Handle != h {
			return false
		}
	}
	return true
}

func (c *anonCache) rule(k ruleKey) (ruleEntry, bool) {
	if c == nil {
		return ruleEntry{}, false
	}
	e, ok := c.rules[k]
	return e, ok
}

func (c *anonCache) putRule(k ruleKey, e ruleEntry) {
	if c == nil {
		return
	}
	if c.rules == nil {
		c.rules = map[ruleKey]ruleEntry{}
	}
	c.rules[k] = e
}

// pruneRules drops the rules of the listed tables (all, after a listing
// of the whole ruleset) that the listing did not see.
func (c *anonCache) pruneRules(tables []*Table, all bool, seen map[ruleKey]bool) {
	if c == nil {
		return
	}
	listed := map[[2]string]bool{}
	for _, t := range tables {
		listed[[2]string{string(t.Family), t.Name}] = true
	}
	for k := range c.rules {
		if (all || listed[[2]string{string(k.fam), k.table}]) && !seen[k] {
			delete(c.rules, k)
		}
	}
}

func (c *anonCache) get(k anonKey) ([]Element, bool) {
	if c == nil {
		return nil, false
	}
	e, ok := c.m[k]
	return e, ok
}

func (c *anonCache) put(k anonKey, e []Element) {
	if c == nil {
		return
	}
	if c.m == nil {
		c.m = map[anonKey][]Element{}
	}
	c.m[k] = e
}

// prune drops the entries of the listed tables (all, after a listing of
// the whole ruleset) that the listing did not see.
func (c *anonCache) prune(tables []*Table, all bool, seen map[anonKey]bool) {
	if c == nil {
		return
	}
	listed := map[[2]string]bool{}
	for _, t := range tables {
		listed[[2]string{string(t.Family), t.Name}] = true
	}
	for k := range c.m {
		if (all || listed[[2]string{string(k.fam), k.table}]) && !seen[k] {
			delete(c.m, k)
		}
	}
}

// keptListing is one listing (or ErrNoTable) and the generation read
// before nft ran.
type keptListing struct {
	gen  uint64
	at   time.Time
	snap *Snapshot
	err  error
}

var _ Interface = (*Real)(nil)

// New returns the real adapter. It does not run nft.
func New(cfg Config) *Real {
	if cfg.Binary == "" {
		cfg.Binary = "nft"
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = DefaultTimeout
	}
	if cfg.MaxBytes <= 0 {
		cfg.MaxBytes = DefaultMaxBytes
	}
	if cfg.CacheTTL == 0 {
		cfg.CacheTTL = DefaultCacheTTL
	}
	if cfg.MaxDutyCycle == 0 {
		cfg.MaxDutyCycle = DefaultMaxDutyCycle
	}
	if cfg.Clock == nil {
		cfg.Clock = clock.RealClock{}
	}
	if cfg.ReuseFor == 0 {
		cfg.ReuseFor = DefaultReuseFor
	}
	if cfg.MaxObjects <= 0 {
		cfg.MaxObjects = DefaultMaxObjects
	}
	return &Real{cfg: cfg, kept: map[string]keptListing{}}
}

// listKept lists args, or returns the kept listing of args when the
// nf_tables generation has not moved since it ran; r.mu is held.
func (r *Real) listKept(ctx context.Context, args ...string) (*Snapshot, error) {
	key := strings.Join(args, " ")
	now := r.cfg.Clock.Now()
	gen, genErr := r.generation()
	if k, ok := r.kept[key]; ok && genErr == nil && k.gen == gen && now.Sub(k.at) >= 0 && now.Sub(k.at) < r.cfg.ReuseFor {
		return k.snap, k.err
	}
	delete(r.kept, key)
	s, err := r.list(ctx, args...)
	// The generation read before nft ran: a change during the listing
	// moves it, and nft runs again next time.
	if genErr == nil && (err == nil || errors.Is(err, ErrNoTable)) {
		r.kept[key] = keptListing{gen: gen, at: now, snap: s, err: err}
	}
	return s, err
}

// generation reads the nf_tables generation where nft lists, or fails when
// that namespace is unknown or reuse is off.
func (r *Real) generation() (uint64, error) {
	if r.cfg.ReuseFor < 0 {
		return 0, errors.New("reuse turned off")
	}
	if len(r.cfg.Prefix) > 0 && r.cfg.NetNS == "" {
		return 0, errors.New("a command prefix without NetNS: the namespace is unknown")
	}
	return generation(r.cfg.NetNS)
}

// ListRuleset implements Interface.
func (r *Real) ListRuleset(ctx context.Context) (*Snapshot, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	now := r.cfg.Clock.Now()
	ttl := r.cfg.CacheTTL
	if r.cfg.MaxDutyCycle > 0 && ttl >= 0 {
		if d := time.Duration(float64(r.took) / r.cfg.MaxDutyCycle); d > ttl {
			ttl = d
		}
	}
	if ttl > 0 && (r.cached != nil || r.err != nil) && now.Sub(r.at) < ttl && now.Sub(r.at) >= 0 {
		return r.cached, r.err
	}
	start := time.Now()
	s, err := r.listKept(ctx, "ruleset")
	if err != nil && ctx.Err() != nil {
		// Our caller's deadline, not nft's failure: do not cache it.
		return nil, err
	}
	r.cached, r.err, r.at, r.took = s, err, now, time.Since(start)
	return s, err
}

// ListTable implements Interface. It is not cached for CacheTTL, but kept
// while the nf_tables generation has not moved (a missing table too).
func (r *Real) ListTable(ctx context.Context, f Family, name string) (*Snapshot, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.listKept(ctx, "table", string(f), name)
}

// netlinkReaches reports whether the netlink reader can list where nft
// would: in the daemon's own namespace (no Prefix) or in NetNS.
func (r *Real) netlinkReaches() bool {
	return r.cfg.Reader != ReaderNFT && (len(r.cfg.Prefix) == 0 || r.cfg.NetNS != "")
}

// list lists ARGS ("ruleset" or "table FAMILY NAME") over netlink or with
// `nft -j list ARGS...`; r.mu is held.
func (r *Real) list(parent context.Context, args ...string) (*Snapshot, error) {
	// Its own bound ends before the caller's deadline, so that a listing
	// too long for the caller is said as such (ErrTimeout), not lost in
	// the caller's "did not finish".
	bound := r.cfg.Timeout
	if dl, ok := parent.Deadline(); ok {
		bound = min(bound, time.Until(dl)*3/4)
	}
	ctx, cancel := context.WithTimeout(parent, bound)
	defer cancel()
	var nlErr error
	if r.netlinkReaches() {
		s, err := r.listNetlink(parent, ctx, bound, args...)
		if err == nil || r.cfg.Reader == ReaderNetlink || errors.Is(err, ErrNoTable) || errors.Is(err, ErrTooLarge) ||
			errors.Is(err, ErrTimeout) || parent.Err() != nil {
			return s, err
		}
		nlErr = err
	}
	s, err := r.listNFT(parent, ctx, bound, args...)
	if err != nil && nlErr != nil {
		err = fmt.Errorf("%w (after the netlink listing failed: %v)", err, nlErr)
	}
	return s, err
}

// listNetlink lists over netlink within ctx (bounded by bound).
func (r *Real) listNetlink(parent, ctx context.Context, bound time.Duration, args ...string) (*Snapshot, error) {
	what := "netlink listing of the ruleset"
	var f Family
	var name string
	if len(args) == 3 {
		f, name = Family(args[1]), args[2]
		what = fmt.Sprintf("netlink listing of table %s %s", f, name)
	}
	start := r.cfg.Clock.Now()
	began := time.Now()
	dl, _ := ctx.Deadline()
	rs, n, err := listNetlink(ctx, r.cfg.NetNS, dl, r.cfg.MaxObjects, f, name, &r.anon)
	d := time.Since(began)
	switch {
	case err == nil:
	case parent.Err() != nil:
		return nil, fmt.Errorf("%s: stopped after %v: %w", what, d.Round(time.Millisecond), parent.Err())
	case errors.Is(err, ErrTimeout) || ctx.Err() != nil:
		return nil, fmt.Errorf("%s: %w: %v (bound %v)", what, ErrTimeout, d.Round(time.Millisecond), bound.Round(time.Millisecond))
	default:
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	r.seq++
	return &Snapshot{Ruleset: rs, At: start, Duration: d, Bytes: n, Seq: r.seq, Reader: ReaderNetlink}, nil
}

// listNFT runs `nft -j list ARGS...` within ctx (bounded by bound).
func (r *Real) listNFT(parent, ctx context.Context, bound time.Duration, args ...string) (*Snapshot, error) {
	if _, err := exec.LookPath(r.cfg.Binary); err != nil {
		return nil, fmt.Errorf("%w: %s: %v", ErrUnavailable, r.cfg.Binary, err)
	}
	argv := append(append(append([]string(nil), r.cfg.Prefix...), r.cfg.Binary, "-j", "list"), args...)
	what := "nft -j list " + strings.Join(args, " ")
	cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
	cmd.WaitDelay = time.Second
	var errb bytes.Buffer
	cmd.Stderr = &limitedBuffer{buf: &errb, max: 4096}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	start := r.cfg.Clock.Now()
	began := time.Now()
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	lr := &limitReader{r: stdout, left: r.cfg.MaxBytes}
	rs, perr := Parse(lr)
	// Drain what is left so nft is not blocked on a full pipe: nothing
	// after a good document; after a parse error, the rest of the output
	// (bounded by MaxBytes and the timeout), so that nft's own failure and
	// stderr, when it failed, are what is reported.
	_, _ = io.Copy(io.Discard, lr)
	if lr.over {
		// Over the limit: nft may still be writing; stop it rather than
		// wait for the timeout.
		_ = cmd.Process.Kill()
		_, _ = io.Copy(io.Discard, stdout)
	}
	werr := cmd.Wait()
	d := time.Since(began)
	stderr := strings.TrimSpace(errb.String())
	switch {
	case parent.Err() != nil:
		return nil, fmt.Errorf("%s: stopped after %v: %w", what, d.Round(time.Millisecond), parent.Err())
	case ctx.Err() != nil:
		return nil, fmt.Errorf("%s: %w: %v (bound %v)", what, ErrTimeout, d.Round(time.Millisecond), bound.Round(time.Millisecond))
	case errors.Is(perr, ErrTooLarge) || lr.over:
		return nil, fmt.Errorf("%s: %w (%d bytes)", what, ErrTooLarge, r.cfg.MaxBytes)
	case werr != nil && len(args) == 3 && noSuchTable(stderr):
		return nil, fmt.Errorf("%s: %w: %s", what, ErrNoTable, stderr)
	case werr != nil:
		return nil, fmt.Errorf("%s: %w: %s", what, werr, stderr)
	case perr != nil:
		return nil, fmt.Errorf("parsing %s output: %w", what, perr)
	}
	r.seq++
	return &Snapshot{Ruleset: rs, At: start, Duration: d, Bytes: r.cfg.MaxBytes - lr.left, Seq: r.seq, Reader: ReaderNFT}, nil
}

// noSuchTable recognises nft's answer for a missing table ("Error: No such
// file or directory; did you mean table ..." / "Error: Could not process
// rule: No such file or directory").
func noSuchTable(stderr string) bool {
	return strings.Contains(stderr, "No such file or directory")
}

// limitReader fails with ErrTooLarge once more than left bytes are read.
type limitReader struct {
	r    io.Reader
	left int64
	over bool
}

func (l *limitReader) Read(p []byte) (int, error) {
	if l.left <= 0 {
		// One more byte would be over the limit: probe for it.
		var one [1]byte
		n, err := l.r.Read(one[:])
		if n > 0 {
			l.over = true
			return 0, ErrTooLarge
		}
		return 0, err
	}
	if int64(len(p)) > l.left {
		p = p[:l.left]
	}
	n, err := l.r.Read(p)
	l.left -= int64(n)
	return n, err
}

// limitedBuffer keeps the first max bytes written (stderr of nft).
type limitedBuffer struct {
	buf *bytes.Buffer
	max int
}

func (b *limitedBuffer) Write(p []byte) (int, error) {
	if room := b.max - b.buf.Len(); room > 0 {
		if len(p) > room {
			b.buf.Write(p[:room])
		} else {
			b.buf.Write(p)
		}
	}
	return len(p), nil
}
