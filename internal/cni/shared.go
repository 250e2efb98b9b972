package cni

import (
	"context"
	"sync"
	"time"
)

// Reader reads the node's CNI configuration: what Read answers for its
// directories.
type Reader interface {
	// Read returns the configuration as read; a ctx that ends while
	// waiting for a read gives a Dir whose ConfDirErr is ctx.Err().
	Read(ctx context.Context) Dir
}

// Shared reads the directories for the detectors of one cycle (CNIConfig,
// HostLocalIPAM) once: a Read within maxAge of the last completed one
// returns it, and concurrent callers wait for the read in flight instead
// of starting another. Every read is bounded (Read's bounds: entries,
// files, bytes, and boundedfile's deadline on each open and read). The Dir
// returned is shared: read only.
type Shared struct {
	confDir, binDir string
	maxAge          time.Duration
	now             func() time.Time

	mu sync.Mutex
	// done is closed when the read in flight ends; nil before the first.
	done  chan struct{}
	last  Dir
	at    time.Time
	reads int
}

// NewShared reads confDir and binDir; maxAge is how long a read is reused
// (keep it under the detection interval, so every cycle reads afresh).
func NewShared(confDir, binDir string, maxAge time.Duration) *Shared {
	return &Shared{confDir: confDir, binDir: binDir, maxAge: maxAge, now: time.Now}
}

// Read implements Reader.
func (s *Shared) Read(ctx context.Context) Dir {
	s.mu.Lock()
	done := s.done
	fresh := false
	if done != nil {
		select {
		case <-done:
			fresh = s.now().Sub(s.at) <= s.maxAge
		default:
			fresh = true // in flight: wait for it below
		}
	}
	if !fresh {
		done = make(chan struct{})
		s.done = done
		s.reads++
		go func() {
			d := Read(s.confDir, s.binDir)
			s.mu.Lock()
			s.last, s.at = d, s.now()
			s.mu.Unlock()
			close(done)
		}()
	}
	s.mu.Unlock()
	select {
	case <-done:
		s.mu.Lock()
		defer s.mu.Unlock()
		return s.last
	case <-ctx.Done():
		return Dir{ConfDir: s.confDir, BinDir: s.binDir, ConfDirErr: ctx.Err()}
	}
}

// Reads counts the reads of the directories done so far.
func (s *Shared) Reads() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.reads
}
