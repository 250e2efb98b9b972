package lockwatch

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"path/filepath"
	"sync"
	"time"
	"unsafe"

	"go.uber.org/zap"
	"golang.org/x/sys/unix"

	"github.com/remediate-dev/remediate/internal/procs"
)

// Config configures a Watcher. Zero durations take the defaults.
type Config struct {
	// ProcRoot is the procfs to read (--proc-root).
	ProcRoot string
	// LockFile is the xtables lock file (--xtables-lock); it may not
	// exist yet (its directory is watched until it does).
	LockFile string
	// Procs reads processes (and the full holder scan).
	Procs procs.Interface
	// Log gets start, stop and degraded-mode lines.
	Log *zap.Logger
	// BurstPoll is the sampling interval while the lock file is in use
	// (default 10ms): a hold's start and end are known to this.
	BurstPoll time.Duration
	// FastPoll and FastFor: right after an open the lock is sampled every
	// FastPoll (default 1ms) for FastFor (default 10ms), so that a hold of
	// a few milliseconds (a small iptables command) is seen too.
	FastPoll time.Duration
	FastFor  time.Duration
	// MaxHeldPoll caps the sampling interval during a long hold, which is
	// sampled every 1/20 of its age so far (default 100ms).
	MaxHeldPoll time.Duration
	// Linger is how long sampling goes on after the last open or close
	// with the lock free (default 50ms): an opener flocks right after
	// open.
	Linger time.Duration
	// OpenerPoll is the sampling interval while a process keeps the file
	// open between holds (no open event per hold; default 250ms).
	OpenerPoll time.Duration
	// PollFallback is the sampling interval when inotify is not usable
	// (default 250ms).
	PollFallback time.Duration
	// Ring is how many completed holds are kept (default 512).
	Ring int
}

func (c *Config) defaults() {
	if c.ProcRoot == "" {
		c.ProcRoot = "/proc"
	}
	if c.BurstPoll <= 0 {
		c.BurstPoll = 10 * time.Millisecond
	}
	if c.FastPoll <= 0 {
		c.FastPoll = time.Millisecond
	}
	if c.FastFor <= 0 {
		c.FastFor = 10 * time.Millisecond
	}
	if c.MaxHeldPoll <= 0 {
		c.MaxHeldPoll = 100 * time.Millisecond
	}
	if c.Linger <= 0 {
		c.Linger = 50 * time.Millisecond
	}
	if c.OpenerPoll <= 0 {
		c.OpenerPoll = 250 * time.Millisecond
	}
	if c.PollFallback <= 0 {
		c.PollFallback = 250 * time.Millisecond
	}
	if c.Ring <= 0 {
		c.Ring = 512
	}
	if c.Log == nil {
		c.Log = zap.NewNop()
	}
}

// Watcher watches the xtables lock (see the package doc). It does nothing
// until Start; Close stops it and waits for its goroutine.
type Watcher struct {
	cfg Config
	src *procSource

	mu      sync.Mutex
	tr      *tracker
	status  Status
	started bool
	closed  bool
	stopFd  int
	done    chan struct{}
	cancel  context.CancelFunc
}

var _ Reader = (*Watcher)(nil)

// New returns a Watcher that is not running yet.
func New(cfg Config) *Watcher {
	cfg.defaults()
	return &Watcher{cfg: cfg, tr: newTracker(cfg.Ring),
		src: &procSource{root: cfg.ProcRoot, lock: cfg.LockFile, procs: cfg.Procs}}
}

// Start implements Reader: the first call starts the watching goroutine.
func (w *Watcher) Start() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.closed {
		return errors.New("lock watcher closed")
	}
	if w.started {
		return nil
	}
	if w.cfg.LockFile == "" || w.cfg.Procs == nil {
		return errors.New("lock watcher needs a lock file and a proc root")
	}
	stop, err := unix.Eventfd(0, unix.EFD_CLOEXEC|unix.EFD_NONBLOCK)
	if err != nil {
		return fmt.Errorf("eventfd: %w", err)
	}
	ifd, ierr := unix.InotifyInit1(unix.IN_CLOEXEC | unix.IN_NONBLOCK)
	mode := "inotify"
	if ierr != nil {
		ifd, mode = -1, "poll"
		w.cfg.Log.Warn("xtables lock watcher: inotify unavailable, polling instead (shorter holds may be missed)",
			zap.Error(ierr), zap.Duration("interval", w.cfg.PollFallback))
	}
	ctx, cancel := context.WithCancel(context.Background())
	w.started, w.stopFd, w.cancel, w.done = true, stop, cancel, make(chan struct{})
	w.status = Status{Running: true, Since: time.Now(), Mode: mode}
	go w.run(ctx, ifd, stop)
	return nil
}

// Close stops the watcher and waits for its goroutine (at most a few
// seconds). It is safe to call more than once and without Start.
func (w *Watcher) Close() {
	w.mu.Lock()
	if w.closed || !w.started {
		w.closed = true
		w.mu.Unlock()
		return
	}
	w.closed = true
	done, stop, cancel := w.done, w.stopFd, w.cancel
	w.mu.Unlock()
	cancel()
	var one = [8]byte{1}
	_, _ = unix.Write(stop, one[:])
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		w.cfg.Log.Warn("xtables lock watcher did not stop within 5s")
		return
	}
	_ = unix.Close(stop)
}

// Holds implements Reader.
func (w *Watcher) Holds(since time.Time) []Hold {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.tr.holds(since)
}

// Histogram returns the hold-time histogram by holder label.
func (w *Watcher) Histogram() map[HistKey]Histogram {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.tr.histogram()
}

// Status implements Reader.
func (w *Watcher) Status() Status {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.status
}

// Observe starts the watcher if needed, watches for d (or until ctx ends)
// and returns the holds seen during that window: those that ended in it
// and the one going on at its end. This is the sample window of a one-shot
// run.
func (w *Watcher) Observe(ctx context.Context, d time.Duration) ([]Hold, error) {
	if err := w.Start(); err != nil {
		return nil, err
	}
	from := time.Now()
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
	return w.Holds(from), ctx.Err()
}

const inotifyFileMask = unix.IN_OPEN | unix.IN_CLOSE | unix.IN_DELETE_SELF | unix.IN_MOVE_SELF | unix.IN_ATTRIB

// The directory is watched while the file does not exist or cannot be
// watched itself (not readable): its children's opens and closes are
// reported too, with their name.
const inotifyDirMask = unix.IN_CREATE | unix.IN_MOVED_TO | unix.IN_OPEN | unix.IN_CLOSE

// loop state of the goroutine (owned by it).
type loop struct {
	w          *Watcher
	ifd        int
	wd         int  // current watch descriptor, -1 none
	onFile     bool // watching the file (else its directory, or nothing)
	burstUntil time.Time
	fastUntil  time.Time
	wake       time.Time // when poll last returned: the time of the events it delivered
	heldSince  time.Time // when the current hold was first seen (zero: free)
	lastSample time.Time
	openers    map[int32]bool
	openCheck  time.Time
	key        string
	dev, ino   uint64
	statAt     time.Time // last stat of the lock file (zero: stat again)
}

func (w *Watcher) run(ctx context.Context, ifd, stop int) {
	defer close(w.done)
	defer w.src.close()
	l := &loop{w: w, ifd: ifd, wd: -1, openers: map[int32]bool{}}
	if ifd >= 0 {
		defer unix.Close(ifd)
		l.rewatch()
	}
	// Processes that already keep the file open would flock it without
	// an open event: find them once.
	if l.restat() == nil {
		for _, pid := range w.src.openers(ctx, l.dev, l.ino) {
			l.openers[pid] = true
		}
	}
	l.sample(ctx)
	buf := make([]byte, 16*(unix.SizeofInotifyEvent+unix.NAME_MAX+1))
	for {
		fds := []unix.PollFd{{Fd: int32(stop), Events: unix.POLLIN}}
		if ifd >= 0 {
			fds = append(fds, unix.PollFd{Fd: int32(ifd), Events: unix.POLLIN})
		}
		_, err := unix.Poll(fds, l.timeout(time.Now()))
		l.wake = time.Now()
		if err != nil && !errors.Is(err, unix.EINTR) {
			w.setErr(fmt.Errorf("poll: %w", err))
			time.Sleep(w.cfg.PollFallback)
		}
		if fds[0].Revents != 0 || ctx.Err() != nil {
			return
		}
		if ifd >= 0 && fds[1].Revents != 0 {
			l.events(buf)
		}
		l.sample(ctx)
	}
}

// timeout is the poll timeout in ms: burst rate while the file is in
// use, opener rate while someone keeps it open, the fallback rate without
// inotify, else forever.
func (l *loop) timeout(now time.Time) int {
	cfg := &l.w.cfg
	switch {
	case now.Before(l.fastUntil):
		return max(1, int(cfg.FastPoll.Milliseconds()))
	case !l.heldSince.IsZero():
		// A long hold's end needs no 10 ms precision: sample every
		// 1/20 of its age so far (5%), from BurstPoll up to MaxHeldPoll.
		return int(min(max(now.Sub(l.heldSince)/20, cfg.BurstPoll), cfg.MaxHeldPoll).Milliseconds())
	case now.Before(l.burstUntil):
		return int(cfg.BurstPoll.Milliseconds())
	case l.ifd < 0 || l.wd < 0:
		return int(cfg.PollFallback.Milliseconds())
	case len(l.openers) > 0:
		return int(cfg.OpenerPoll.Milliseconds())
	}
	return -1
}

// rewatch watches the lock file, or its directory until it exists.
func (l *loop) rewatch() {
	if l.wd >= 0 {
		_, _ = unix.InotifyRmWatch(l.ifd, uint32(l.wd))
		l.wd = -1
	}
	lock := l.w.cfg.LockFile
	wd, err := unix.InotifyAddWatch(l.ifd, lock, inotifyFileMask)
	if err == nil {
		l.wd, l.onFile = wd, true
		return
	}
	l.onFile = false
	if wd, err2 := unix.InotifyAddWatch(l.ifd, filepath.Dir(lock), inotifyDirMask); err2 == nil {
		l.wd = wd
	}
	l.w.setErr(fmt.Errorf("watching %s: %w", lock, err))
}

// events reads the pending inotify events.
func (l *loop) events(buf []byte) {
	base := filepath.Base(l.w.cfg.LockFile)
	for {
		n, err := unix.Read(l.ifd, buf)
		if n <= 0 || err != nil {
			return
		}
		for off := 0; off+unix.SizeofInotifyEvent <= n; {
			ev := (*unix.InotifyEvent)(unsafe.Pointer(&buf[off]))
			name := ""
			if ev.Len > 0 && off+unix.SizeofInotifyEvent+int(ev.Len) <= n {
				nb := buf[off+unix.SizeofInotifyEvent : off+unix.SizeofInotifyEvent+int(ev.Len)]
				for i, c := range nb {
					if c == 0 {
						nb = nb[:i]
						break
					}
				}
				name = string(nb)
			}
			off += unix.SizeofInotifyEvent + int(ev.Len)
			switch {
			case ev.Mask&unix.IN_Q_OVERFLOW != 0:
				l.burst()
				l.w.track(func(t *tracker) { t.lostEvents() })
			case ev.Wd != int32(l.wd):
			case !l.onFile && name != base:
			case !l.onFile && ev.Mask&(unix.IN_CREATE|unix.IN_MOVED_TO) != 0:
				l.rewatch()
				l.burst()
				l.changed()
			case ev.Mask&(unix.IN_IGNORED|unix.IN_DELETE_SELF|unix.IN_MOVE_SELF) != 0:
				l.rewatch()
				l.burst()
				l.changed()
			case ev.Mask&unix.IN_OPEN != 0:
				l.burst()
				at := l.wake
				l.fastUntil = time.Now().Add(l.w.cfg.FastFor)
				l.w.track(func(t *tracker) { t.opened(at) })
				l.w.countOpen()
			case ev.Mask&unix.IN_CLOSE != 0:
				l.burst()
				at := l.wake
				l.w.track(func(t *tracker) { t.closed(at) })
			case ev.Mask&unix.IN_ATTRIB != 0:
				l.burst()
				l.changed()
			}
		}
	}
}

func (l *loop) burst() { l.burstUntil = time.Now().Add(l.w.cfg.Linger) }

// changed makes the next sample stat the lock file again.
func (l *loop) changed() { l.statAt = time.Time{} }

// restat refreshes the lock file's key: at most once a second unless an
// event said the file changed (statAt zeroed), or it was missing.
func (l *loop) restat() error {
	if now := time.Now(); l.key != "" && now.Sub(l.statAt) < time.Second {
		return nil
	} else {
		l.statAt = now
	}
	key, dev, ino, err := l.w.src.lockKey()
	if err != nil {
		l.key = ""
		return err
	}
	if key != l.key {
		l.openers = map[int32]bool{}
	}
	l.key, l.dev, l.ino = key, dev, ino
	return nil
}

// sample reads the lock once and feeds the tracker, resolving new holders
// and waiters.
func (l *loop) sample(ctx context.Context) {
	w := l.w
	now := time.Now()
	gap := now.Sub(l.lastSample)
	continuous := l.ifd >= 0 && l.wd >= 0 && (len(l.openers) == 0 || gap <= 2*w.cfg.BurstPoll)
	if gap <= 0 {
		continuous = false
	}
	l.lastSample = now
	if err := l.restat(); err != nil {
		if errors.Is(err, fs.ErrNotExist) && l.ifd >= 0 && l.onFile {
			l.rewatch()
		}
		w.setErr(err)
		w.feed(Sample{At: now})
		return
	}
	lockPIDs, waiterPIDs, err := w.src.sample(l.key)
	if err != nil {
		w.setErr(err)
		return
	}
	s := Sample{At: now, LockPIDs: lockPIDs, WaiterPIDs: waiterPIDs, Continuous: continuous}
	w.mu.Lock()
	st := w.tr.observe(s)
	w.status.Samples++
	w.status.Err = ""
	w.mu.Unlock()
	switch {
	case !s.Held():
		l.heldSince = time.Time{}
	case st.newHold || l.heldSince.IsZero():
		l.heldSince = now
	}
	if s.Held() || len(waiterPIDs) > 0 {
		// Keep sampling at burst rate until it is free.
		l.burstUntil = now.Add(w.cfg.BurstPoll)
	}
	var holders []Proc
	if st.newHold {
		rctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		for _, p := range w.src.holders(rctx, l.key, l.dev, l.ino, lockPIDs) {
			holders = append(holders, w.src.withCgroup(procFrom(p, now)))
		}
		cancel()
	}
	var waiters []Proc
	for _, pid := range st.newWaiters {
		if _, p, err := w.src.proc(ctx, pid); err == nil {
			waiters = append(waiters, p)
		} else {
			waiters = append(waiters, Proc{Pid: pid})
		}
	}
	if st.newHold || len(waiters) > 0 {
		w.mu.Lock()
		if st.newHold {
			w.tr.setHolders(holders)
			w.status.Resolves++
		}
		for _, p := range waiters {
			w.tr.addWaiter(p)
		}
		w.mu.Unlock()
	}
	// A holder that keeps the file open after releasing it can take it
	// again without an open event: poll while it does.
	if st.ended != nil {
		for _, h := range st.ended.Holders {
			if w.src.fdOn(h.Pid, l.dev, l.ino) >= 0 {
				l.openers[h.Pid] = true
			}
		}
	}
	if len(l.openers) > 0 && now.Sub(l.openCheck) >= time.Second {
		l.openCheck = now
		for pid := range l.openers {
			if w.src.fdOn(pid, l.dev, l.ino) < 0 {
				delete(l.openers, pid)
			}
		}
	}
}

// feed observes a sample without resolving (the lock file is gone: any
// hold ended).
func (w *Watcher) feed(s Sample) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.tr.observe(s)
}

func (w *Watcher) track(f func(*tracker)) {
	w.mu.Lock()
	defer w.mu.Unlock()
	f(w.tr)
}

func (w *Watcher) countOpen() {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.status.Opens++
}

func (w *Watcher) setErr(err error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.status.Err = err.Error()
}
