package cni

import (
	"context"
	"time"

	"github.com/remediate-dev/remediate/internal/sharedread"
)

// Reader reads the node's CNI configuration: what Read answers for its
// directories.
type Reader interface {
	// Read returns the configuration as read; a ctx that ends while
	// waiting for a read gives a Dir whose ConfDirErr is ctx.Err().
	Read(ctx context.Context) Dir
}

// Shared reads the directories for the detectors of one cycle (CNIConfig,
// HostLocalIPAM) once (a sharedread.Slot): a Read within maxAge of the
// last completed one returns it, and concurrent callers wait for the read
// in flight instead of starting another. Every read is bounded (Read's
// bounds: entries, files, bytes, and boundedfile's deadline on each open
// and read). The Dir returned is shared: read only.
type Shared struct {
	confDir, binDir string
	maxAge          time.Duration
	now             func() time.Time
	// read is Read of the two directories (tests hold it in flight).
	read func() Dir
	slot sharedread.Slot[Dir]
}

// NewShared reads confDir and binDir; maxAge is how long a read is reused
// (keep it under the detection interval, so every cycle reads afresh).
func NewShared(confDir, binDir string, maxAge time.Duration) *Shared {
	return &Shared{confDir: confDir, binDir: binDir, maxAge: maxAge, now: time.Now,
		read: func() Dir { return Read(confDir, binDir) }}
}

// Read implements Reader.
func (s *Shared) Read(ctx context.Context) Dir {
	d, err := s.slot.Get(ctx, s.now, s.maxAge, func(context.Context) (Dir, error) { return s.read(), nil })
	if err != nil {
		return Dir{ConfDir: s.confDir, BinDir: s.binDir, ConfDirErr: err}
	}
	return d
}

// Reads counts the reads of the directories done so far.
func (s *Shared) Reads() int { return s.slot.Runs() }
