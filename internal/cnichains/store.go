package cnichains

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"

	"github.com/remediate-dev/remediate/internal/boundedfile"
)

// Memory is what the daemon remembers of the agents' chains: per agent
// name, per "family/backend" (IPv4/legacy), the chains and hooks seen.
type Memory struct {
	Version int                        `json:"version"`
	Agents  map[string]map[string]Seen `json:"agents"`
}

// Get returns the memory of one agent in one family/backend.
func (m Memory) Get(agent, key string) Seen { return m.Agents[agent][key] }

// Set stores the memory of one agent in one family/backend.
func (m *Memory) Set(agent, key string, s Seen) {
	if m.Agents == nil {
		m.Agents = map[string]map[string]Seen{}
	}
	if m.Agents[agent] == nil {
		m.Agents[agent] = map[string]Seen{}
	}
	if len(s.Chains) == 0 && len(s.Hooks) == 0 {
		delete(m.Agents[agent], key)
		if len(m.Agents[agent]) == 0 {
			delete(m.Agents, agent)
		}
		return
	}
	m.Agents[agent][key] = s
}

// Store loads and saves the Memory. Implementations must be
// goroutine-safe.
type Store interface {
	// Load returns the memory saved last (empty when none).
	Load() (Memory, error)
	// Save replaces the saved memory.
	Save(Memory) error
}

// File is the memory's file name in the state directory.
const File = "cni-agent-chains.json"

// maxFile bounds the file read: five agents × 4 family/backends × 128
// entries of about 150 bytes is under 400 KiB.
const maxFile = 1 << 20

// FileStore keeps the memory in Dir/File (the daemon's state directory):
// read bounded, never through a symlink nor from a FIFO; written to a
// temporary file, synced and renamed over it, so a crash leaves the old
// or the new memory, never half of one.
type FileStore struct {
	Dir string
	mu  sync.Mutex
}

// Load implements Store. A file that does not parse is reported; the
// caller starts from an empty memory (the next Save replaces it).
func (s *FileStore) Load() (Memory, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	p := filepath.Join(s.Dir, File)
	b, err := boundedfile.ReadNoFollow(p, maxFile)
	if errors.Is(err, os.ErrNotExist) {
		return Memory{Version: 1}, nil
	}
	if err != nil {
		return Memory{Version: 1}, fmt.Errorf("reading %s: %w", p, err)
	}
	var m Memory
	if err := json.Unmarshal(b, &m); err != nil {
		return Memory{Version: 1}, fmt.Errorf("%s: %w", p, err)
	}
	return m, nil
}

// Save implements Store.
func (s *FileStore) Save(m Memory) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	m.Version = 1
	b, err := json.Marshal(m)
	if err != nil {
		return err
	}
	p := filepath.Join(s.Dir, File)
	if err := os.MkdirAll(s.Dir, 0o700); err != nil {
		return fmt.Errorf("saving %s: %w", p, err)
	}
	tmp, err := os.CreateTemp(s.Dir, ".tmp-"+File)
	if err != nil {
		return fmt.Errorf("saving %s: %w", p, err)
	}
	defer os.Remove(tmp.Name())
	_, werr := tmp.Write(b)
	if werr == nil {
		werr = tmp.Sync()
	}
	if cerr := tmp.Close(); werr == nil {
		werr = cerr
	}
	if werr == nil {
		werr = os.Rename(tmp.Name(), p)
	}
	if werr != nil {
		return fmt.Errorf("saving %s: %w", p, werr)
	}
	return nil
}

// MemStore is the stateful fake Store (tests): a copy of the memory
// through a JSON round trip, as the file would keep it.
type MemStore struct {
	mu    sync.Mutex
	b     []byte
	Saves int
}

// Load implements Store.
func (s *MemStore) Load() (Memory, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	var m Memory
	if s.b == nil {
		return Memory{Version: 1}, nil
	}
	err := json.Unmarshal(s.b, &m)
	return m, err
}

// Save implements Store.
func (s *MemStore) Save(m Memory) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	b, err := json.Marshal(m)
	if err != nil {
		return err
	}
	s.b = b
	s.Saves++
	return nil
}
