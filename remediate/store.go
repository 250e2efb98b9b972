package remediate

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"github.com/remediate-dev/remediate/internal/boundedfile"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// StateVersion is the format version of the state file.
const StateVersion = 1

// ActionRecord is one action attempt in the guardrail history. Attempts are
// recorded (and persisted) before the action runs, so a crash mid-action
// still counts against every limit.
type ActionRecord struct {
	Time   time.Time `json:"time"`
	Rule   string    `json:"rule"`
	Target string    `json:"target"`
	Action string    `json:"action"`
	// Outcome is "pending" until the action returns, then "executed",
	// "failed" or "skipped" (refused at execution; not counted by limits);
	// "interrupted" when the daemon stopped mid-action (settle.go).
	Outcome string `json:"outcome"`
	// ID is the journal ID of the attempt's intent and outcome records
	// (empty in state files written before it was recorded).
	ID string `json:"id,omitempty"`
}

// State is everything the guardrails depend on, persisted in the state dir.
type State struct {
	Version int `json:"version"`
	// Targets maps Request.Key() ("rule|target") to its state machine.
	Targets map[string]TargetState `json:"targets"`
	// History lists recent action attempts, oldest first.
	History []ActionRecord `json:"history"`
	// UnknownHistoryAt is set when the state file was unreadable: history
	// before that moment is unknown and treated as recent, so every
	// cooldown and rate limit counts as used at that time.
	UnknownHistoryAt time.Time `json:"unknownHistoryAt,omitempty"`
}

// NewState returns an empty state.
func NewState() *State {
	return &State{Version: StateVersion, Targets: map[string]TargetState{}}
}

// Prune drops history older than keep and targets in phase OK.
func (s *State) Prune(now time.Time, keep time.Duration) {
	cut := now.Add(-keep)
	i := sort.Search(len(s.History), func(i int) bool { return !s.History[i].Time.Before(cut) })
	s.History = append([]ActionRecord(nil), s.History[i:]...)
	for k, t := range s.Targets {
		if t.Phase == PhaseOK || t.Phase == "" {
			delete(s.Targets, k)
		}
	}
	if !s.UnknownHistoryAt.IsZero() && s.UnknownHistoryAt.Before(cut) {
		s.UnknownHistoryAt = time.Time{}
	}
}

// Store persists State in a directory: state.json written atomically
// (temp file, fsync, rename, fsync of the directory), guarded by an flock
// on state.lock so a `remediate --once` and the daemon sharing the
// directory take turns.
type Store struct {
	Dir string
}

const (
	stateFile = "state.json"
	lockFile  = "state.lock"
)

// ErrCorrupt is wrapped by the warning Load returns for a state file that
// could not be read; the file has been moved aside.
var ErrCorrupt = errors.New("corrupt state file")

// Lock takes the state directory's lock, waiting until ctx is done. The
// returned function releases it.
func (s *Store) Lock(ctx context.Context) (func(), error) {
	if err := os.MkdirAll(s.Dir, 0o700); err != nil {
		return nil, fmt.Errorf("creating state dir: %w", err)
	}
	// Never follow a symlink or block opening a FIFO planted as the lock.
	f, err := os.OpenFile(filepath.Join(s.Dir, lockFile), os.O_CREATE|os.O_RDWR|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return nil, fmt.Errorf("opening state lock: %w", err)
	}
	if fi, err := f.Stat(); err != nil || !fi.Mode().IsRegular() {
		f.Close()
		return nil, fmt.Errorf("state lock %s is not a regular file", f.Name())
	}
	for {
		err = unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB)
		if err == nil {
			return func() { _ = unix.Flock(int(f.Fd()), unix.LOCK_UN); f.Close() }, nil
		}
		if !errors.Is(err, unix.EWOULDBLOCK) {
			f.Close()
			return nil, fmt.Errorf("locking %s: %w", f.Name(), err)
		}
		select {
		case <-ctx.Done():
			f.Close()
			return nil, fmt.Errorf("state dir %s is locked by another remediate process: %w", s.Dir, ctx.Err())
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// DaemonLockFile is the file in the state dir a running daemon holds an
// exclusive flock on for its whole life (LockDaemon).
const DaemonLockFile = "daemon.lock"

// ErrStateDirInUse is wrapped by LockDaemon's error when another daemon
// holds the state directory.
var ErrStateDirInUse = errors.New("state dir is in use by another remediate daemon")

// LockDaemon takes the state directory's daemon lock: an exclusive,
// non-blocking flock on daemon.lock (opened with O_NOFOLLOW, a regular file
// only), held until the returned release is called or the process exits.
// A second daemon on the same directory gets an error wrapping
// ErrStateDirInUse that names the holder's PID; it must refuse to start.
// `remediate --once` does not take this lock: it takes turns with the
// daemon on state.lock, one cycle at a time (Lock).
func (s *Store) LockDaemon() (release func(), err error) {
	if err := os.MkdirAll(s.Dir, 0o700); err != nil {
		return nil, fmt.Errorf("creating state dir: %w", err)
	}
	path := filepath.Join(s.Dir, DaemonLockFile)
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return nil, fmt.Errorf("opening the daemon lock %s: %w", path, err)
	}
	if fi, err := f.Stat(); err != nil || !fi.Mode().IsRegular() {
		f.Close()
		return nil, fmt.Errorf("the daemon lock %s is not a regular file: refusing to start", path)
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		holder := "unknown pid"
		{
			b := make([]byte, 32)
			if n, _ := f.ReadAt(b, 0); n > 0 {
				holder = "pid " + strings.TrimSpace(strings.ToValidUTF8(string(b[:n]), "?"))
			}
		}
		f.Close()
		if errors.Is(err, unix.EWOULDBLOCK) {
			return nil, fmt.Errorf("%w: %s holds %s (one daemon per state dir; remediate --once can still run alongside it)", ErrStateDirInUse, holder, path)
		}
		return nil, fmt.Errorf("locking %s: %w", path, err)
	}
	// Who holds it, for the next one's message (best effort).
	if err := f.Truncate(0); err == nil {
		_, _ = f.WriteAt([]byte(strconv.Itoa(os.Getpid())+"\n"), 0)
	}
	return func() { _ = unix.Flock(int(f.Fd()), unix.LOCK_UN); f.Close() }, nil
}

// Load reads the state. A missing file gives an empty state. An unreadable
// or corrupt file is moved aside (state.json.corrupt-<unix>) and the
// returned state has UnknownHistoryAt = now; the returned error (wrapping
// ErrCorrupt) is a warning to report, not a failure.
func (s *Store) Load(now time.Time) (*State, error) {
	path := filepath.Join(s.Dir, stateFile)
	data, err := boundedfile.ReadNoFollow(path, MaxStateSize)
	if errors.Is(err, os.ErrNotExist) {
		return NewState(), nil
	}
	var st State
	if err == nil {
		err = json.Unmarshal(data, &st)
		if err == nil && st.Version != StateVersion {
			err = fmt.Errorf("state version %d, this build reads %d", st.Version, StateVersion)
		}
	}
	if err == nil {
		if st.Targets == nil {
			st.Targets = map[string]TargetState{}
		}
		return &st, nil
	}
	aside := fmt.Sprintf("%s.corrupt-%d", path, now.Unix())
	if rerr := os.Rename(path, aside); rerr != nil {
		aside = "(could not move aside: " + rerr.Error() + ")"
	}
	fresh := NewState()
	fresh.UnknownHistoryAt = now
	return fresh, fmt.Errorf("%w %s: %v; quarantined as %s; treating action history as recent", ErrCorrupt, path, err, aside)
}

// MaxStateSize is the largest state file Load reads; a larger one is
// quarantined unread (and Save refuses to write one).
const MaxStateSize = 16 << 20

// Save writes the state atomically and durably.
func (s *Store) Save(st *State) error {
	if err := os.MkdirAll(s.Dir, 0o700); err != nil {
		return fmt.Errorf("creating state dir: %w", err)
	}
	data, err := json.MarshalIndent(st, "", " ")
	if err != nil {
		return fmt.Errorf("encoding state: %w", err)
	}
	if len(data) > MaxStateSize {
		return fmt.Errorf("state of %d bytes is over the %d-byte bound (%d targets, %d history records): not written", len(data), MaxStateSize, len(st.Targets), len(st.History))
	}
	return WriteFileAtomic(filepath.Join(s.Dir, stateFile), data, 0o600)
}

// WriteFileAtomic writes data to path via a temporary file in the same
// directory, fsyncs it, renames it over path and fsyncs the directory.
func WriteFileAtomic(path string, data []byte, perm os.FileMode) error {
	dir := filepath.Dir(path)
	tmp, err := os.CreateTemp(dir, filepath.Base(path)+".tmp-*")
	if err != nil {
		return fmt.Errorf("creating temp file: %w", err)
	}
	defer os.Remove(tmp.Name()) // no-op after a successful rename
	if _, err := tmp.Write(data); err != nil {
		tmp.Close()
		return fmt.Errorf("writing %s: %w", tmp.Name(), err)
	}
	if err := tmp.Chmod(perm); err != nil {
		tmp.Close()
		return fmt.Errorf("chmod %s: %w", tmp.Name(), err)
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return fmt.Errorf("fsync %s: %w", tmp.Name(), err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("closing %s: %w", tmp.Name(), err)
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return fmt.Errorf("renaming into %s: %w", path, err)
	}
	d, err := boundedfile.OpenDir(dir)
	if err != nil {
		return fmt.Errorf("opening dir for fsync: %w", err)
	}
	defer d.Close()
	if err := d.Sync(); err != nil {
		return fmt.Errorf("fsync dir %s: %w", dir, err)
	}
	return nil
}
