//go:build linux

package conntrack

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/remediate-dev/remediate/internal/boundedfile"
	"github.com/remediate-dev/remediate/internal/sysctl"
)

// Tunable locations.
const (
	// MaxKey is the sysctl key of the table limit.
	MaxKey = "net.netfilter.nf_conntrack_max"
	// HashSizePath is the hashsize module parameter relative to the sysfs
	// root.
	HashSizePath = "module/nf_conntrack/parameters/hashsize"
	// RecordFile is the file in the state directory where SetMax records
	// the value it wrote.
	RecordFile = "conntrack-max.json"
	// maxRecordSize bounds RecordFile (a few dozen bytes when written).
	maxRecordSize = 64 << 10
	// DefaultDeleteBatch is how many deletes go in one sendmsg.
	DefaultDeleteBatch = 256
)

// Config configures the real adapter.
type Config struct {
	// ProcRoot is the procfs root (--proc-root), default /proc.
	ProcRoot string
	// SysRoot is the sysfs root, default /sys.
	SysRoot string
	// NetNS is an open file descriptor of the network namespace whose
	// table is observed and cleaned; 0 means the daemon's own.
	NetNS int
	// StateDir is where SetMax records what it wrote (RecordFile); empty
	// disables the record (and so drift detection).
	StateDir string
	// DeleteBatch is how many deletes are sent per sendmsg (default
	// DefaultDeleteBatch).
	DeleteBatch int
	// NoKernelFilter forces unfiltered (streamed) dumps. New sets it on
	// kernels whose reply-tuple CTA_FILTER is missing or broken (< 5.16).
	NoKernelFilter bool
}

// Real is the kernel adapter.
type Real struct {
	cfg    Config
	sysctl sysctl.Interface
	mu     sync.Mutex // serializes the record file
	// last is the newest Usage read (nil before the first), for gauges
	// that must not read the kernel at scrape time.
	last atomic.Pointer[Usage]
}

// LastUsage returns the newest Usage read by a detector, without touching
// the kernel; ok is false before the first.
func (r *Real) LastUsage() (Usage, bool) {
	if u := r.last.Load(); u != nil {
		return *u, true
	}
	return Usage{}, false
}

var _ Interface = (*Real)(nil)

// New returns the real adapter.
func New(cfg Config) *Real {
	if cfg.ProcRoot == "" {
		cfg.ProcRoot = "/proc"
	}
	if cfg.SysRoot == "" {
		cfg.SysRoot = "/sys"
	}
	if cfg.DeleteBatch <= 0 {
		cfg.DeleteBatch = DefaultDeleteBatch
	}
	var uts unix.Utsname
	if err := unix.Uname(&uts); err != nil || !kernelFilterWorks(unix.ByteSliceToString(uts.Release[:])) {
		cfg.NoKernelFilter = true
	}
	return &Real{cfg: cfg, sysctl: sysctl.New(cfg.ProcRoot)}
}

// Available reports why conntrack cannot be used under procRoot (nil when it
// can): the nf_conntrack module exposes nf_conntrack_max once loaded.
func Available(procRoot string) error {
	if procRoot == "" {
		procRoot = "/proc"
	}
	p := filepath.Join(procRoot, "sys/net/netfilter/nf_conntrack_max")
	if _, err := os.Stat(p); err != nil {
		return fmt.Errorf("nf_conntrack is not loaded (%s: %w)", p, err)
	}
	return nil
}

func (r *Real) withSock(fn func(s *nlSock) error) error {
	s, err := openSock(r.cfg.NetNS)
	if err != nil {
		return err
	}
	defer s.Close()
	return fn(s)
}

// Usage implements Interface (IPCTNL_MSG_CT_GET_STATS; the max falls back to
// the sysctl on kernels older than 4.18).
func (r *Real) Usage(ctx context.Context) (Usage, error) {
	var u Usage
	err := r.withSock(func(s *nlSock) error {
		var err error
		u, err = s.statsGlobal(ctx)
		return err
	})
	if err != nil {
		return u, fmt.Errorf("conntrack usage: %w", err)
	}
	if u.Max == 0 {
		m, err := r.Max(ctx)
		if err != nil {
			return u, err
		}
		u.Max = m
	}
	r.last.Store(&u)
	return u, nil
}

// Stats implements Interface (IPCTNL_MSG_CT_GET_STATS_CPU, summed).
func (r *Real) Stats(ctx context.Context) (Stats, error) {
	var st Stats
	err := r.withSock(func(s *nlSock) error {
		var err error
		st, err = s.statsCPU(ctx)
		return err
	})
	if err != nil {
		return st, fmt.Errorf("conntrack statistics: %w", err)
	}
	return st, nil
}

// Max implements Interface.
func (r *Real) Max(ctx context.Context) (uint64, error) {
	return sysctl.GetUint(r.sysctl, MaxKey)
}

// SetMax implements Interface: it writes the sysctl, then records it.
func (r *Real) SetMax(ctx context.Context, n uint64) error {
	if err := sysctl.SetUint(r.sysctl, MaxKey, n); err != nil {
		return err
	}
	return r.record(func(rec *MaxRecord) { rec.Max = n })
}

func (r *Real) hashSizePath() string { return filepath.Join(r.cfg.SysRoot, HashSizePath) }

// HashSize implements Interface.
func (r *Real) HashSize(ctx context.Context) (uint64, error) {
	return sysctl.ReadUintFile(r.hashSizePath())
}

// SetHashSize implements Interface.
func (r *Real) SetHashSize(ctx context.Context, n uint64) error {
	if err := sysctl.WriteFile(r.hashSizePath(), fmt.Sprint(n)); err != nil {
		return err
	}
	return r.record(func(rec *MaxRecord) { rec.HashSize = n })
}

// LastSetMax implements Interface.
func (r *Real) LastSetMax(ctx context.Context) (MaxRecord, bool, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return readRecord(r.cfg.StateDir)
}

func readRecord(dir string) (MaxRecord, bool, error) {
	var rec MaxRecord
	if dir == "" {
		return rec, false, nil
	}
	// Our own file: never through a symlink, never a FIFO (which would
	// hang the detector until restart), bounded.
	b, err := boundedfile.ReadNoFollow(filepath.Join(dir, RecordFile), maxRecordSize)
	if errors.Is(err, os.ErrNotExist) {
		return rec, false, nil
	}
	if err != nil {
		return rec, false, err
	}
	if err := json.Unmarshal(b, &rec); err != nil {
		return rec, false, fmt.Errorf("%s: %w", filepath.Join(dir, RecordFile), err)
	}
	return rec, rec.Max > 0, nil
}

// record updates the record file atomically (write, fsync, rename).
func (r *Real) record(update func(*MaxRecord)) error {
	if r.cfg.StateDir == "" {
		return nil
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	rec, _, err := readRecord(r.cfg.StateDir)
	if err != nil {
		rec = MaxRecord{} // a corrupt record is replaced by the new truth
	}
	update(&rec)
	rec.SetAt = time.Now().UTC()
	b, err := json.Marshal(rec)
	if err != nil {
		return err
	}
	return writeAtomic(filepath.Join(r.cfg.StateDir, RecordFile), b)
}

func writeAtomic(path string, b []byte) error {
	tmp, err := os.CreateTemp(filepath.Dir(path), ".tmp-"+filepath.Base(path))
	if err != nil {
		return fmt.Errorf("record %s: %w", path, err)
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(b); err != nil {
		tmp.Close()
		return fmt.Errorf("record %s: %w", path, err)
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return fmt.Errorf("record %s: %w", path, err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("record %s: %w", path, err)
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return fmt.Errorf("record %s: %w", path, err)
	}
	return nil
}

// CountUDPByReplySource implements Interface.
func (r *Real) CountUDPByReplySource(ctx context.Context, b Backend, limit int) (int, error) {
	if err := b.Validate(); err != nil {
		return 0, err
	}
	n := 0
	err := r.withSock(func(s *nlSock) error {
		_, err := s.dumpByReplySource(ctx, b, !r.cfg.NoKernelFilter, func(f *Flow) error {
			if b.Matches(f) {
				n++
				if limit > 0 && n > limit {
					return errDone
				}
			}
			return nil
		})
		return err
	})
	if errors.Is(err, errDone) {
		err = nil
	}
	if err != nil {
		return n, fmt.Errorf("count UDP entries with reply source %s: %w", b, err)
	}
	return n, nil
}

// DeleteUDPByReplySource implements Interface. Two sockets: one streams the
// kernel-filtered dump, the other deletes each full batch (the dump pauses
// while the batch is deleted). Memory: one batch.
func (r *Real) DeleteUDPByReplySource(ctx context.Context, b Backend, limit int) (DeleteResult, error) {
	start := time.Now()
	var res DeleteResult
	if err := b.Validate(); err != nil {
		return res, err
	}
	if limit <= 0 {
		return res, errors.New("delete needs a positive limit")
	}
	dump, err := openSock(r.cfg.NetNS)
	if err != nil {
		return res, err
	}
	defer dump.Close()
	del, err := openSock(r.cfg.NetNS)
	if err != nil {
		return res, err
	}
	defer del.Close()

	batch := make([]Flow, 0, r.cfg.DeleteBatch)
	flush := func() error {
		d, v, err := del.deleteBatch(ctx, batch)
		res.Deleted += d
		res.Vanished += v
		batch = batch[:0]
		return err
	}
	res.KernelFiltered, err = dump.dumpByReplySource(ctx, b, !r.cfg.NoKernelFilter, func(f *Flow) error {
		res.Scanned++
		if !b.Matches(f) {
			return nil
		}
		if res.Matched == limit {
			res.Truncated = true
			return errDone
		}
		res.Matched++
		batch = append(batch, *f)
		if len(batch) == cap(batch) {
			return flush()
		}
		return nil
	})
	if errors.Is(err, errDone) {
		err = nil
	}
	if err == nil {
		err = flush()
	}
	res.Duration = time.Since(start)
	if err != nil {
		return res, fmt.Errorf("delete UDP entries with reply source %s: %w", b, err)
	}
	return res, nil
}

var _ Scanner = (*Real)(nil)

// ScanProtocol implements Scanner: one streamed dump of the family,
// filtered in the kernel by the original tuple's protocol (on kernels whose
// CTA_FILTER is trusted, see New), checked again in user space.
func (r *Real) ScanProtocol(ctx context.Context, v6 bool, proto uint8, limit int, fn func(f *Flow) error) (ScanResult, error) {
	fam := uint8(afInet)
	if v6 {
		fam = afInet6
	}
	res, err := r.scan(ctx, limit, func(s *nlSock, each func(f *Flow) error) (bool, error) {
		return s.dumpByProto(ctx, fam, proto, !r.cfg.NoKernelFilter, func(f *Flow) error {
			if f.Proto != proto || f.OrigDst.Addr().Is4() == v6 {
				return nil
			}
			return each(f)
		})
	}, fn)
	if err != nil {
		return res, fmt.Errorf("scan conntrack entries of protocol %d: %w", proto, err)
	}
	return res, nil
}

var _ TableScanner = (*Real)(nil)

// ScanTable implements TableScanner: one unfiltered AF_UNSPEC dump (every
// family and protocol), streamed and decoded into one reused Flow.
func (r *Real) ScanTable(ctx context.Context, limit int, fn func(f *Flow) error) (ScanResult, error) {
	res, err := r.scan(ctx, limit, func(s *nlSock, each func(f *Flow) error) (bool, error) {
		seq := s.nextSeq()
		s.enc.reset()
		s.enc.dumpAllRequest(seq, s.pid)
		return s.streamFlows(ctx, seq, false, each)
	}, fn)
	if err != nil {
		return res, fmt.Errorf("scan conntrack table: %w", err)
	}
	return res, nil
}

// scan runs dump on a fresh socket, passing fn the entries dump hands to
// each until limit (> 0) of them, then stopping with Truncated set.
func (r *Real) scan(ctx context.Context, limit int, dump func(s *nlSock, each func(f *Flow) error) (filtered bool, err error), fn func(f *Flow) error) (ScanResult, error) {
	start := time.Now()
	var res ScanResult
	if limit <= 0 {
		return res, errors.New("scan needs a positive limit")
	}
	err := r.withSock(func(s *nlSock) error {
		var err error
		res.KernelFiltered, err = dump(s, func(f *Flow) error {
			if res.Scanned == limit {
				res.Truncated = true
				return errDone
			}
			res.Scanned++
			return fn(f)
		})
		return err
	})
	if errors.Is(err, errDone) {
		err = nil
	}
	res.Duration = time.Since(start)
	return res, err
}

var _ TimeoutTuner = (*Real)(nil)

// timeoutSysctl is the sysctl of the observed namespace (timeouts are per
// network namespace; Config.NetNS 0 = the daemon's own).
func (r *Real) timeoutSysctl() sysctl.Interface { return sysctl.NewNetNS(r.cfg.ProcRoot, r.cfg.NetNS) }

// Timeouts implements TimeoutTuner.
func (r *Real) Timeouts(ctx context.Context) (Timeouts, error) {
	s := r.timeoutSysctl()
	var t Timeouts
	for _, e := range []struct {
		key string
		d   *time.Duration
	}{{UDPTimeoutKey, &t.UDP}, {UDPTimeoutStreamKey, &t.UDPStream}, {TCPTimeoutTimeWaitKey, &t.TCPTimeWait}} {
		v, err := sysctl.GetUint(s, e.key)
		if err != nil {
			return t, err
		}
		*e.d = time.Duration(v) * time.Second
	}
	return t, nil
}

// SetTimeouts implements TimeoutTuner.
func (r *Real) SetTimeouts(ctx context.Context, t Timeouts) error {
	s := r.timeoutSysctl()
	for _, e := range []struct {
		key string
		d   time.Duration
	}{{UDPTimeoutKey, t.UDP}, {UDPTimeoutStreamKey, t.UDPStream}, {TCPTimeoutTimeWaitKey, t.TCPTimeWait}} {
		if e.d <= 0 {
			continue
		}
		if err := sysctl.SetUint(s, e.key, uint64(e.d/time.Second)); err != nil {
			return err
		}
	}
	return nil
}
