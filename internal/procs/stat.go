package procs

import (
	"bytes"
	"fmt"
	"math"
	"strconv"
	"strings"
)

// StatState returns the one-letter state (R, S, D, T, Z, ...) of the text
// of a /proc/<pid>/stat: the field after the command, which is in
// parentheses and may hold any byte. A text not of the kernel's shape is
// an error.
func StatState(b []byte) (string, error) {
	s, err := parseStat(b)
	return s.state, err
}

// statFields is what one read of /proc/<pid>/stat gives.
type statFields struct {
	comm      string
	state     string
	ppid      int32
	startTick uint64
	cpuTicks  uint64 // utime+stime
}

// parseStat parses the text of /proc/<pid>/stat.
func parseStat(b []byte) (statFields, error) {
	var s statFields
	// comm is in parentheses and may itself contain ") ".
	open := bytes.IndexByte(b, '(')
	end := bytes.LastIndexByte(b, ')')
	if open < 0 || end < open {
		return s, fmt.Errorf("malformed stat %q", b)
	}
	s.comm = string(b[open+1 : end])
	f := strings.Fields(string(b[end+1:]))
	// f[0]=state(3) f[1]=ppid(4) ... f[11]=utime(14) f[12]=stime(15)
	// ... f[19]=starttime(22)
	if len(f) < 20 {
		return s, fmt.Errorf("short stat %q", b)
	}
	s.state = f[0]
	pp, err := strconv.ParseInt(f[1], 10, 32)
	if err != nil {
		return s, fmt.Errorf("bad ppid in stat: %w", err)
	}
	s.ppid = int32(pp)
	s.startTick, err = strconv.ParseUint(f[19], 10, 64)
	if err != nil {
		return s, fmt.Errorf("bad starttime in stat: %w", err)
	}
	ut, err1 := strconv.ParseUint(f[11], 10, 64)
	st, err2 := strconv.ParseUint(f[12], 10, 64)
	if err1 != nil || err2 != nil || ut > math.MaxUint64/2 || st > math.MaxUint64/2 {
		return s, fmt.Errorf("bad utime/stime %q %q in stat", f[11], f[12])
	}
	s.cpuTicks = ut + st
	return s, nil
}
