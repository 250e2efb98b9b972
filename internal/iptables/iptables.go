// Package iptables observes the node's iptables rules without ever taking
// the xtables lock: it runs iptables-legacy-save / iptables-nft-save (and
// the ip6tables variants) under a context timeout and parses their output.
// iptables -S/-L and coreos/go-iptables are deliberately not used for reads:
// iptables-legacy takes the xtables lock for every command, reads included,
// so a daemon reading that way adds to the contention it should cure.
package iptables

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os/exec"
	"strings"
	"time"
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

// Snapshot is one parsed save of one family and backend.
type Snapshot struct {
	Family  Family
	Backend Backend
	Rules   *Ruleset
	// Duration is how long the save command ran: a slow save means a very
	// large rule set, and kube-proxy's own restores take correspondingly
	// long while holding the lock.
	Duration time.Duration
	// Bytes is the size of the save output.
	Bytes int
}

// Interface reads rule sets. Implementations must be goroutine-safe.
type Interface interface {
	// Save runs the save command of that family and backend and parses
	// its output. A missing command is ErrUnavailable.
	Save(ctx context.Context, f Family, b Backend) (*Snapshot, error)
}

// BackendDetector is optionally implemented by an Interface: the backend
// of the plain `iptables` command on the daemon's PATH, that is, of the
// daemon's own image, which says nothing about the node's or kube-proxy's.
//
// Deprecated: detectors read the host's and kube-proxy's iptables from
// their own root filesystems with ReadInstall.
type BackendDetector interface {
	DefaultBackend(ctx context.Context) (Backend, error)
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
}

// Real runs the save commands.
type Real struct{ cfg Config }

var (
	_ Interface       = (*Real)(nil)
	_ BackendDetector = (*Real)(nil)
)

// New returns the real adapter.
func New(cfg Config) *Real {
	if cfg.Timeout <= 0 {
		cfg.Timeout = 30 * time.Second
	}
	return &Real{cfg: cfg}
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
	out, d, err := r.save(ctx, f, b, nil)
	if err != nil {
		return nil, err
	}
	size := out.Len()
	rs, err := ParseString(out.String())
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
	start := time.Now()
	err = cmd.Run()
	d := time.Since(start)
	if err != nil {
		if ctx.Err() != nil {
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

// DefaultBackend runs `iptables --version` (which takes no lock) and returns
// the backend the node's plain `iptables` uses.
func (r *Real) DefaultBackend(ctx context.Context) (Backend, error) {
	ctx, cancel := context.WithTimeout(ctx, r.cfg.Timeout)
	defer cancel()
	cmd, err := r.command(ctx, "iptables", "--version")
	if err != nil {
		return "", err
	}
	out, err := cmd.CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("iptables --version: %w: %s", err, strings.TrimSpace(string(out)))
	}
	_, b, err := ParseVersion(string(out))
	return b, err
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
