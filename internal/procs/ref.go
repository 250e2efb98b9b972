package procs

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/remediate-dev/remediate/internal/finding"
)

// RestoreNames are the argv[0] basenames of the iptables restore binaries:
// what HungIPTablesRestore watches and KillProcess may kill by default.
var RestoreNames = []string{
	"iptables-restore", "ip6tables-restore",
	"iptables-legacy-restore", "ip6tables-legacy-restore",
	"iptables-nft-restore", "ip6tables-nft-restore",
}

// EvidenceHoldSeconds is the evidence key of how long a lock holder has
// held the xtables lock (XtablesLockContention writes it, KillProcess's
// minHoldTime reads it).
const EvidenceHoldSeconds = "holdSeconds"

// Ref is the typed reference to a process target (finding.KindProcess):
// the PID and its create time, so a reused PID is another process. Its one
// encoding is the target "process/<pid>@<createTimeMs>".
type Ref struct {
	Pid          int32
	CreateTimeMs int64
}

// Kind is finding.KindProcess.
func (Ref) Kind() finding.Kind { return finding.KindProcess }

// Ref returns the process's reference.
func (p Process) Ref() Ref { return Ref{Pid: p.Pid, CreateTimeMs: p.CreateTimeMs} }

// Target encodes r: "process/<pid>@<createTimeMs>".
func (r Ref) Target() string { return fmt.Sprintf("process/%d@%d", r.Pid, r.CreateTimeMs) }

// ParseRef decodes a target written by Ref.Target.
func ParseRef(t string) (Ref, error) {
	rest, ok := strings.CutPrefix(t, "process/")
	if !ok {
		return Ref{}, fmt.Errorf("target %q is not a process target", t)
	}
	ps, cs, ok := strings.Cut(rest, "@")
	if !ok {
		return Ref{}, fmt.Errorf("target %q has no create time", t)
	}
	p, err := strconv.ParseInt(ps, 10, 32)
	if err != nil || p <= 0 {
		return Ref{}, fmt.Errorf("target %q: bad pid", t)
	}
	c, err := strconv.ParseInt(cs, 10, 64)
	if err != nil || c <= 0 {
		return Ref{}, fmt.Errorf("target %q: bad create time", t)
	}
	return Ref{Pid: int32(p), CreateTimeMs: c}, nil
}
