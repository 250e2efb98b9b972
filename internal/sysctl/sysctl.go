// Package sysctl reads and writes kernel tunables through a configurable
// procfs root (--proc-root) and sysfs root, so that every read and write of
// the daemon can be pointed at a fixture tree in tests and at the host's
// /proc when the daemon runs in a container.
//
// A key is written either with dots ("net.netfilter.nf_conntrack_max") or
// with slashes ("net/netfilter/nf_conntrack_max"); it always resolves to
// <procRoot>/sys/<key with slashes>. Keys are validated: no "..", no empty
// components, so a key can never escape the root.
//
// Tests use a temporary directory as the root (see WriteFixture). Note that
// /proc/sys/net/netfilter/nf_conntrack_max is read-only inside a child
// network namespace (EACCES): only the initial namespace can change it.
package sysctl

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/remediate-dev/remediate/internal/boundedfile"
)

// Interface reads and writes sysctl values. Implementations must be
// goroutine-safe.
type Interface interface {
	// Get returns the value of key, trimmed of surrounding white space.
	Get(key string) (string, error)
	// Set writes value to key.
	Set(key, value string) error
}

// FS is the real Interface: files under <ProcRoot>/sys.
type FS struct {
	// ProcRoot is the procfs mount, "/proc" by default.
	ProcRoot string
}

var _ Interface = (*FS)(nil)

// New returns an FS rooted at procRoot ("" means "/proc").
func New(procRoot string) *FS {
	if procRoot == "" {
		procRoot = "/proc"
	}
	return &FS{ProcRoot: procRoot}
}

// Path returns the file that holds key.
func (s *FS) Path(key string) (string, error) {
	rel, err := keyPath(key)
	if err != nil {
		return "", err
	}
	return filepath.Join(s.ProcRoot, "sys", rel), nil
}

// Get implements Interface.
func (s *FS) Get(key string) (string, error) {
	p, err := s.Path(key)
	if err != nil {
		return "", err
	}
	return ReadFile(p)
}

// Set implements Interface.
func (s *FS) Set(key, value string) error {
	p, err := s.Path(key)
	if err != nil {
		return err
	}
	return WriteFile(p, value)
}

// GetUint reads key from s as an unsigned decimal integer.
func GetUint(s Interface, key string) (uint64, error) {
	v, err := s.Get(key)
	if err != nil {
		return 0, err
	}
	n, err := strconv.ParseUint(v, 10, 64)
	if err != nil {
		return 0, fmt.Errorf("sysctl %s: value %q is not an unsigned integer: %w", key, v, err)
	}
	return n, nil
}

// SetUint writes n to key.
func SetUint(s Interface, key string, n uint64) error {
	return s.Set(key, strconv.FormatUint(n, 10))
}

// ReadFile reads a one-value kernel file (procfs or sysfs) and trims it.
func ReadFile(path string) (string, error) {
	b, err := boundedfile.Read(path, 64<<10)
	if err != nil {
		return "", fmt.Errorf("read %s: %w", path, err)
	}
	return strings.TrimSpace(string(b)), nil
}

// ReadUintFile reads a one-value kernel file holding an unsigned integer.
func ReadUintFile(path string) (uint64, error) {
	v, err := ReadFile(path)
	if err != nil {
		return 0, err
	}
	n, err := strconv.ParseUint(v, 10, 64)
	if err != nil {
		return 0, fmt.Errorf("%s: value %q is not an unsigned integer: %w", path, v, err)
	}
	return n, nil
}

// WriteFile writes value to an existing kernel file. It never creates the
// file: a missing tunable is an error, not something to invent. The write is
// one write(2) of the whole value followed by a newline, as sysctl(8) does.
func WriteFile(path, value string) error {
	f, err := boundedfile.OpenWrite(path)
	if err != nil {
		return fmt.Errorf("open %s for writing: %w", path, err)
	}
	return writeClose(f, path, value)
}

// writeClose writes value and a newline to f in one write(2) and closes it.
func writeClose(f *os.File, path, value string) error {
	_, werr := f.Write([]byte(value + "\n"))
	cerr := f.Close()
	if werr != nil {
		return fmt.Errorf("write %q to %s: %w", value, path, werr)
	}
	if cerr != nil {
		return fmt.Errorf("write %q to %s: %w", value, path, cerr)
	}
	return nil
}

// keyPath turns a dotted or slashed key into a relative path, rejecting
// anything that could leave the root.
func keyPath(key string) (string, error) {
	if key == "" {
		return "", errors.New("sysctl: empty key")
	}
	k := key
	if !strings.Contains(k, "/") {
		k = strings.ReplaceAll(k, ".", "/")
	}
	parts := strings.Split(k, "/")
	for _, p := range parts {
		if p == "" || p == "." || p == ".." {
			return "", fmt.Errorf("sysctl: invalid key %q", key)
		}
	}
	return filepath.Join(parts...), nil
}

// WriteFixture creates <procRoot>/sys/<key> with value, making directories
// as needed. It is meant for tests that use a temporary directory as the
// proc root.
func WriteFixture(procRoot, key, value string) error {
	rel, err := keyPath(key)
	if err != nil {
		return err
	}
	p := filepath.Join(procRoot, "sys", rel)
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		return err
	}
	return os.WriteFile(p, []byte(value+"\n"), 0o644)
}
