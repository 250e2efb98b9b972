// Package iptables observes the node's iptables rules without ever taking
// the xtables lock: it runs iptables-legacy-save / iptables-nft-save (and
// the ip6tables variants) under a context timeout and parses their output.
// iptables -S/-L and coreos/go-iptables are deliberately not used for reads:
// iptables-legacy takes the xtables lock for every command, reads included,
// so a daemon reading that way adds to the contention it should cure.
//
// A changed legacy IPv4 table is not saved at all when its entries, which
// the change check reads anyway (IPT_SO_GET_ENTRIES, see fingerprint),
// decode exactly (DecodeLegacy): the decode gives the Ruleset the save's
// parse would. Entries it cannot print exactly fall back to the save.
package iptables

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os/exec"
	"sort"
	"strings"
	"sync"
	"time"
	"unsafe"
)

// Backend is the iptables kernel backend.
type Backend string

// Backends.
const (
	Legacy Backend = "legacy"
	NFT    Backend = "nft"
)

// Family is the IP family, named like kube-proxy's ip_family label.
type Family string

// Families.
const (
	IPv4 Family = "IPv4"
	IPv6 Family = "IPv6"
)

// ErrUnavailable is returned (wrapped) when a backend's save command is not
// installed.
var ErrUnavailable = errors.New("iptables backend unavailable")

// ErrStarved is returned (wrapped) when a save did not finish in its
// timeout because it waited for a CPU (at the timeout, from
// /proc/PID/schedstat and stat: half its time counted as run-queue wait,
// or runnable with under a quarter of it on a CPU), not because it ran
// long or hung (blocked, sleeping): the daemon's own CPU limit or a busy
// node, not a sign of the node's rules. It does not wrap
// context.DeadlineExceeded.
var ErrStarved = errors.New("starved of CPU")

// Snapshot is one parsed save of one family and backend.
type Snapshot struct {
	Family  Family
	Backend Backend
	Rules   *Ruleset
	// Duration is how long the save command ran: a slow save means a very
	// large rule set, and kube-proxy's own restores take correspondingly
	// long while holding the lock.
	Duration time.Duration
	// Bytes is the size of the save output (0 when Decoded).
	Bytes int
	// Decoded is true when no save ran: the legacy IPv4 entries read for
	// the change check were decoded into Rules (see DecodeLegacy), and
	// Duration is the time of that read and decode. DecodeFallback is why
	// a legacy IPv4 save ran although the entries were read (they were not
	// decodable; see ErrNotDecodable), "" otherwise.
	Decoded        bool
	DecodeFallback string
	// Reused is true when the save was not run because the kernel's
	// rules are unchanged since the snapshot's save (its Duration and
	// Bytes are that save's); Empty when the backend has no table in this
	// family, so nothing was run and there is nothing to parse.
	Reused, Empty bool
}

// Interface reads rule sets. Implementations must be goroutine-safe.
type Interface interface {
	// Save runs the save command of that family and backend and parses
	// its output. A missing command is ErrUnavailable.
	Save(ctx context.Context, f Family, b Backend) (*Snapshot, error)
}

// Config configures the real adapter.
type Config struct {
	// Prefix is prepended to every command, e.g. ["ip", "netns", "exec",
	// "ns1"] or ["nsenter", "-t", "1", "-n"]. Empty runs in the current
	// network namespace.
	Prefix []string
	// Timeout bounds each save run when ctx has no earlier deadline
	// (default 30s).
	Timeout time.Duration
	// NetNS is the network namespace file the Prefix enters
	// (/var/run/netns/NAME), read directly for the change check. With a
	// Prefix and no NetNS there is no change check: every Save runs the
	// command.
	NetNS string
	// ReuseFor bounds how long a snapshot is returned again because the
	// kernel says nothing changed: older, the command runs anyway
	// (default 5m; negative turns reuse off).
	ReuseFor time.Duration
	// LockFile is the xtables lock file (--xtables-lock). When set and
	// watchable, a legacy backend's entries (the costly part of the
	// change check) are read only when the lock file was opened or closed
	// since they were last read, when the tables' sizes, entry counts or
	// hook offsets changed, or when they were last read EntriesMaxAge ago
	// (see lockActivity); "" reads them at every Save.
	LockFile string
	// EntriesMaxAge bounds how long a legacy backend's entries go unread
	// while nothing else says they changed: an equal-size edit by a writer
	// that never opens LockFile is seen at most this late (default 1m).
	EntriesMaxAge time.Duration
	// Now is the clock (time.Now when nil).
	Now func() time.Time
	// NoDecode turns the decode of legacy IPv4 entries off: a change
	// always runs the save (see DecodeLegacy).
	NoDecode bool
	// Log, when set, is told (once per adapter) that entries were not
	// decodable and the save ran instead, with the reason.
	Log func(family Family, reason string)
}

// Real runs the save commands. It keeps the last snapshot of each family
// and backend with the kernel's fingerprint of the rules it was saved
// from (see fingerprint): while the fingerprint is unchanged (and the
// snapshot younger than ReuseFor) Save returns that snapshot without
// running the command; a backend with no table in the family gives an
// empty snapshot without running it. When the fingerprint cannot be read
// the command runs: a stale snapshot never hides a change the checks can
// see (for legacy, see Config.LockFile for what is read when).
type Real struct {
	cfg      Config
	activity *lockActivity // nil: no LockFile, or not watchable here

	mu    sync.Mutex
	last  map[sharedKey]*lastSave
	stats map[sharedKey]*Reads
	// loggedFallback is set once the first decode fallback was logged.
	loggedFallback bool
}

// decoded is a decode of the legacy entries read for a fingerprint.
type decoded struct {
	rules *Ruleset
	err   error         // not decodable: the caller saves
	took  time.Duration // reading the entries and decoding them
	bytes int           // the entry blobs' size
}

// lastSave is the snapshot kept for the next Save of a family and backend.
type lastSave struct {
	fp   fingerprint // full: with the entries
	snap *Snapshot
	at   time.Time // when the save ran
	// checked is when the entries were last read and found equal to fp
	// (or saved); lockGen the lock activity generation read before that
	// read, lockOK whether there was one.
	checked time.Time
	lockGen uint64
	lockOK  bool
}

// Reads counts what Save read for one family and backend since the
// adapter was made.
type Reads struct {
	Family  Family
	Backend Backend
	// Info counts the cheap checks: legacy table names and IPT_SO_GET_INFO
	// (microseconds), the nf_tables generation.
	Info uint64
	// Entries counts the legacy entry reads (IPT_SO_GET_ENTRIES, the copy
	// iptables-legacy-save makes: ~40 ms of CPU for 20k rules).
	Entries uint64
	// Saves counts the save commands run and parsed.
	Saves uint64
	// Decodes counts the legacy IPv4 entry reads decoded instead of a
	// save; DecodeFallbacks those that were not decodable, so the save
	// ran (also counted in Saves).
	Decodes, DecodeFallbacks uint64
}

type readKind int

const (
	readInfo readKind = iota
	readEntries
	readSave
	readDecode
	readDecodeFallback
)

func (r *Real) addRead(f Family, b Backend, k readKind) {
	r.mu.Lock()
	defer r.mu.Unlock()
	s := r.stats[sharedKey{f, b}]
	if s == nil {
		s = &Reads{Family: f, Backend: b}
		r.stats[sharedKey{f, b}] = s
	}
	switch k {
	case readInfo:
		s.Info++
	case readEntries:
		s.Entries++
	case readSave:
		s.Saves++
	case readDecode:
		s.Decodes++
	case readDecodeFallback:
		s.DecodeFallbacks++
	}
}

// Reads returns the read counts of every family and backend read so far.
func (r *Real) Reads() []Reads {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]Reads, 0, len(r.stats))
	for _, s := range r.stats {
		out = append(out, *s)
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Family != out[j].Family {
			return out[i].Family < out[j].Family
		}
		return out[i].Backend < out[j].Backend
	})
	return out
}

var (
	_ Interface = (*Real)(nil)
)

// New returns the real adapter.
func New(cfg Config) *Real {
	if cfg.Timeout <= 0 {
		cfg.Timeout = 30 * time.Second
	}
	if cfg.ReuseFor == 0 {
		cfg.ReuseFor = 5 * time.Minute
	}
	if cfg.EntriesMaxAge <= 0 {
		cfg.EntriesMaxAge = time.Minute
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	return &Real{cfg: cfg, activity: lockActivityFor(cfg.LockFile),
		last: map[sharedKey]*lastSave{}, stats: map[sharedKey]*Reads{}}
}

// SaveCommand returns the save binary for a family and backend
// ("ip6tables-nft-save").
func SaveCommand(f Family, b Backend) string {
	bin := "iptables"
	if f == IPv6 {
		bin = "ip6tables"
	}
	return bin + "-" + string(b) + "-save"
}

func (r *Real) command(ctx context.Context, args ...string) (*exec.Cmd, error) {
	if _, err := exec.LookPath(args[0]); err != nil {
		return nil, fmt.Errorf("%w: %s: %v", ErrUnavailable, args[0], err)
	}
	full := append(append([]string(nil), r.cfg.Prefix...), args...)
	cmd := exec.CommandContext(ctx, full[0], full[1:]...)
	cmd.WaitDelay = time.Second
	return cmd, nil
}

// Save implements Interface.
func (r *Real) Save(ctx context.Context, f Family, b Backend) (*Snapshot, error) {
	name := SaveCommand(f, b)
	if _, err := exec.LookPath(name); err != nil {
		return nil, fmt.Errorf("%w: %s: %v", ErrUnavailable, name, err)
	}
	k := sharedKey{f, b}
	now := r.cfg.Now()
	r.mu.Lock()
	l := r.last[k]
	r.mu.Unlock()
	// The lock activity is read before the kernel: a writer closing the
	// lock file after this read is seen next time.
	var gen uint64
	var genOK bool
	if b == Legacy && r.activity != nil {
		gen, genOK = r.activity.generation()
	}
	quick := l != nil && genOK && l.lockOK && l.lockGen == gen && now.Sub(l.checked) >= 0 &&
		now.Sub(l.checked) < r.cfg.EntriesMaxAge
	reusable := func(fp fingerprint) bool {
		return l != nil && fp.info == l.fp.info && (!fp.full || fp.sum == l.fp.sum) && now.Sub(l.at) < r.cfg.ReuseFor
	}
	// When the entries read for the check changed, they are decoded
	// instead of saving (legacy IPv4; see DecodeLegacy).
	var decodeIf func(fingerprint) bool
	if !r.cfg.NoDecode {
		decodeIf = func(fp fingerprint) bool { return !reusable(fp) }
	}
	fp, dec, fpErr := r.fingerprintFor(f, b, !quick, decodeIf)
	if fpErr == nil && quick && fp.info != l.fp.info {
		// The sizes or offsets changed: read the entries for the
		// fingerprint kept with the save.
		fp, dec, fpErr = r.fingerprintFor(f, b, true, decodeIf)
	}
	if fpErr == nil {
		if fp.empty {
			r.forget(k)
			return &Snapshot{Family: f, Backend: b, Rules: &Ruleset{}, Empty: true}, nil
		}
		if reusable(fp) {
			if fp.full {
				r.mu.Lock()
				if r.last[k] == l {
					n := *l
					n.checked, n.lockGen, n.lockOK = now, gen, genOK
					r.last[k] = &n
				}
				r.mu.Unlock()
			}
			s := *l.snap
			s.Reused = true
			return &s, nil
		}
	}
	var snap *Snapshot
	var err error
	switch {
	case fpErr == nil && dec != nil && dec.err == nil:
		r.addRead(f, b, readDecode)
		snap = &Snapshot{Family: f, Backend: b, Rules: dec.rules, Duration: dec.took, Decoded: true}
	default:
		snap, err = r.saveParsed(ctx, f, b)
		if fpErr == nil && dec != nil {
			r.addRead(f, b, readDecodeFallback)
			r.logFallback(f, dec.err)
			if snap != nil {
				snap.DecodeFallback = dec.err.Error()
			}
		}
	}
	if err != nil || fpErr != nil {
		r.forget(k)
		return snap, err
	}
	// The fingerprint read before the save: a change during the save
	// gives another fingerprint next time, and the command runs again.
	r.mu.Lock()
	r.last[k] = &lastSave{fp: fp, snap: snap, at: now, checked: now, lockGen: gen, lockOK: genOK}
	r.mu.Unlock()
	return snap, nil
}

func (r *Real) fingerprintFor(f Family, b Backend, withEntries bool, decodeIf func(fingerprint) bool) (fingerprint, *decoded, error) {
	if r.cfg.ReuseFor < 0 {
		return fingerprint{}, nil, errors.New("reuse turned off")
	}
	if len(r.cfg.Prefix) > 0 && r.cfg.NetNS == "" {
		return fingerprint{}, nil, errors.New("a command prefix without NetNS: the namespace is unknown")
	}
	return r.fingerprint(f, b, withEntries, decodeIf)
}

// logFallback tells Config.Log of the first decode fallback.
func (r *Real) logFallback(f Family, err error) {
	r.mu.Lock()
	first := !r.loggedFallback
	r.loggedFallback = true
	r.mu.Unlock()
	if first && r.cfg.Log != nil {
		r.cfg.Log(f, err.Error())
	}
}

func (r *Real) forget(k sharedKey) {
	r.mu.Lock()
	delete(r.last, k)
	r.mu.Unlock()
}

// saveParsed runs the save command and parses its output.
func (r *Real) saveParsed(ctx context.Context, f Family, b Backend) (*Snapshot, error) {
	name := SaveCommand(f, b)
	// The output buffer starts at the size of the last save of this family
	// and backend, so a large table is read without growing it step by
	// step (each step garbage the size of the table).
	hint := 64 << 10
	r.mu.Lock()
	if l := r.last[sharedKey{f, b}]; l != nil && l.snap.Bytes > 0 {
		hint = l.snap.Bytes + l.snap.Bytes/16
	}
	r.mu.Unlock()
	out := &outBuf{b: make([]byte, 0, hint)}
	r.addRead(f, b, readSave)
	_, d, err := r.save(ctx, f, b, out)
	if err != nil {
		return nil, err
	}
	size := len(out.b)
	rs, err := ParseString(out.text())
	if err != nil {
		return nil, fmt.Errorf("parsing %s output: %w", name, err)
	}
	return &Snapshot{Family: f, Backend: b, Rules: rs, Duration: d, Bytes: size}, nil
}

// SaveRaw runs the same save command as Save (never through the xtables
// lock) and returns its output as it is, at most maxBytes of it (the rest
// is read and dropped; truncated says so). For the evidence bundle.
func (r *Real) SaveRaw(ctx context.Context, f Family, b Backend, maxBytes int) (out []byte, truncated bool, d time.Duration, err error) {
	lw := &limitWriter{max: maxBytes}
	_, d, err = r.save(ctx, f, b, lw)
	return lw.b.Bytes(), lw.cut, d, err
}

// save runs the save command with stdout into w (a buffer when nil).
func (r *Real) save(ctx context.Context, f Family, b Backend, w io.Writer) (*bytes.Buffer, time.Duration, error) {
	ctx, cancel := context.WithTimeout(ctx, r.cfg.Timeout)
	defer cancel()
	name := SaveCommand(f, b)
	cmd, err := r.command(ctx, name)
	if err != nil {
		return nil, 0, err
	}
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if w != nil {
		cmd.Stdout = w
	}
	// At the timeout, before the kill, how the save spent its time: on a
	// CPU, waiting for one, or neither (blocked, hung).
	var sched schedStat
	var cancelAt time.Duration
	start := time.Now()
	cmd.Cancel = func() error {
		sched, cancelAt = readSchedStat(cmd.Process.Pid), time.Since(start)
		return cmd.Process.Kill()
	}
	err = cmd.Run()
	d := time.Since(start)
	if err != nil {
		if ctx.Err() != nil {
			// Run returns after Cancel did (exec collects its result in Wait).
			// Judged at the cancel: a starved process also takes long to
			// be scheduled to die.
			if sched.starved(cancelAt) {
				return nil, d, fmt.Errorf("%s: not finished after %v, only %v of it on a CPU, waiting for one (%v counted so far): %w (the daemon's CPU limit or a busy node), not a slow save",
					name, cancelAt.Round(time.Millisecond), sched.cpu.Round(time.Millisecond), sched.runDelay.Round(time.Millisecond), ErrStarved)
			}
			return nil, d, fmt.Errorf("%s: timed out after %v: %w", name, d.Round(time.Millisecond), ctx.Err())
		}
		return nil, d, fmt.Errorf("%s: %w: %s", name, err, strings.TrimSpace(errb.String()))
	}
	return &out, d, nil
}

// limitWriter keeps the first max bytes written and drops the rest.
type limitWriter struct {
	b   bytes.Buffer
	max int
	cut bool
}

func (l *limitWriter) Write(p []byte) (int, error) {
	if rest := l.max - l.b.Len(); rest < len(p) {
		l.cut = true
		l.b.Write(p[:max(rest, 0)])
		return len(p), nil
	}
	return l.b.Write(p)
}

// outBuf collects a command's output; text hands it to the parser without
// a copy when the buffer is not much larger than the output (the parsed
// rules point into it, so its spare capacity would be kept with them).
type outBuf struct{ b []byte }

func (o *outBuf) Write(p []byte) (int, error) {
	o.b = append(o.b, p...)
	return len(p), nil
}

func (o *outBuf) text() string {
	if len(o.b) == 0 {
		return ""
	}
	if cap(o.b)-len(o.b) > len(o.b)/8 {
		return string(o.b)
	}
	// The buffer is not written after this: the string is immutable.
	return unsafe.String(unsafe.SliceData(o.b), len(o.b))
}

// ParseVersion parses `iptables --version` output ("iptables v1.8.9
// (nf_tables)") into the version and the backend. Versions before 1.8 print
// no backend and are legacy.
func ParseVersion(out string) (version string, b Backend, err error) {
	f := strings.Fields(strings.TrimSpace(out))
	if len(f) < 2 || !strings.HasPrefix(f[1], "v") {
		return "", "", fmt.Errorf("unrecognised iptables version output %q", truncate(out))
	}
	version = strings.TrimPrefix(f[1], "v")
	switch {
	case len(f) == 2, len(f) >= 3 && f[2] == "(legacy)":
		return version, Legacy, nil
	case len(f) >= 3 && f[2] == "(nf_tables)":
		return version, NFT, nil
	}
	return version, "", fmt.Errorf("unrecognised iptables backend in %q", truncate(out))
}
