package procs

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"strconv"
	"strings"
)

// Lock is one line of /proc/locks (or a "lock:" line of fdinfo, without the
// prefix). Format (fs/locks.c lock_get_status):
//
//	<id>: [->] <FLOCK|POSIX|OFDLCK|ACCESS|LEASE|DELEG|UNKNOWN> <mode> <READ|WRITE|UNLCK> <pid> <maj>:<min>:<inode> <start> <end>
//
// Waiters repeat their blocker's id with "->", indented one space per extra
// level of waiting.
type Lock struct {
	// ID groups a granted lock with its waiters.
	ID int64
	// WaitDepth is 0 for a granted lock, 1 for a waiter on it, 2 for a
	// waiter on a waiter, ...
	WaitDepth int
	// Class is FLOCK, POSIX, OFDLCK, ACCESS, LEASE, DELEG or UNKNOWN.
	Class string
	// Mode is ADVISORY or MANDATORY for locks, ACTIVE/BREAKING/BREAKER for
	// leases.
	Mode string
	// Access is READ, WRITE or UNLCK.
	Access string
	// PID as the kernel prints it: the process that took the lock, 0 when
	// not visible in this PID namespace, -1 for OFD locks.
	PID int32
	// Dev is "maj:min:inode" exactly as printed (hex major and minor),
	// comparable with DevKey; "" for locks without an inode.
	Dev string
	// Start and End are the byte range; End is "EOF" for to-the-end.
	Start, End string
}

// Waiting reports whether this line is a waiter rather than a granted lock.
func (l Lock) Waiting() bool { return l.WaitDepth > 0 }

// DevKey formats a device number and inode the way /proc/locks does.
func DevKey(major, minor uint32, ino uint64) string {
	return fmt.Sprintf("%02x:%02x:%d", major, minor, ino)
}

// ParseLocks parses /proc/locks content. Blank lines are ignored; any other
// line that does not have the kernel's shape is an error naming the line.
func ParseLocks(r io.Reader) ([]Lock, error) {
	var out []Lock
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 4096), 1<<20)
	n := 0
	for sc.Scan() {
		n++
		line := sc.Bytes()
		if len(bytes.TrimSpace(line)) == 0 {
			continue
		}
		l, err := ParseLockLine(string(line))
		if err != nil {
			return out, fmt.Errorf("/proc/locks line %d: %w", n, err)
		}
		out = append(out, l)
	}
	if err := sc.Err(); err != nil {
		return out, fmt.Errorf("reading /proc/locks: %w", err)
	}
	return out, nil
}

// ParseLockLine parses one /proc/locks line (also a fdinfo "lock:" line
// with its "lock:" prefix removed).
func ParseLockLine(line string) (Lock, error) {
	var l Lock
	colon := strings.IndexByte(line, ':')
	if colon <= 0 {
		return l, fmt.Errorf("no lock id in %q", line)
	}
	id, err := strconv.ParseInt(strings.TrimSpace(line[:colon]), 10, 64)
	if err != nil {
		return l, fmt.Errorf("bad lock id in %q", line)
	}
	l.ID = id
	rest := line[colon+1:]
	// After "<id>: " a waiter has (depth-1) spaces and "-> ".
	if t := strings.TrimLeft(rest, " "); strings.HasPrefix(t, "->") {
		spaces := len(rest) - len(t) // includes the one separator space
		l.WaitDepth = spaces
		if l.WaitDepth < 1 {
			l.WaitDepth = 1
		}
		rest = t[2:]
	}
	f := strings.Fields(rest)
	if len(f) != 7 {
		return l, fmt.Errorf("want 7 fields after the id, got %d in %q", len(f), line)
	}
	l.Class, l.Mode, l.Access = f[0], f[1], f[2]
	switch l.Access {
	case "READ", "WRITE", "UNLCK":
	default:
		return l, fmt.Errorf("bad access %q in %q", l.Access, line)
	}
	pid, err := strconv.ParseInt(f[3], 10, 32)
	if err != nil {
		return l, fmt.Errorf("bad pid %q in %q", f[3], line)
	}
	l.PID = int32(pid)
	if f[4] != "<none>:0" {
		parts := strings.Split(f[4], ":")
		if len(parts) != 3 {
			return l, fmt.Errorf("bad device:inode %q in %q", f[4], line)
		}
		maj, err1 := strconv.ParseUint(parts[0], 16, 32)
		min, err2 := strconv.ParseUint(parts[1], 16, 32)
		ino, err3 := strconv.ParseUint(parts[2], 10, 64)
		if err1 != nil || err2 != nil || err3 != nil {
			return l, fmt.Errorf("bad device:inode %q in %q", f[4], line)
		}
		l.Dev = DevKey(uint32(maj), uint32(min), ino)
	}
	l.Start, l.End = f[5], f[6]
	return l, nil
}

// Target returns the finding target of a process: "process/<pid>@<ms>"
// (Ref.Target).
func Target(pid int32, createTimeMs int64) string {
	return Ref{Pid: pid, CreateTimeMs: createTimeMs}.Target()
}

// ParseTarget is the inverse of Target (ParseRef).
func ParseTarget(t string) (pid int32, createTimeMs int64, err error) {
	r, err := ParseRef(t)
	return r.Pid, r.CreateTimeMs, err
}
