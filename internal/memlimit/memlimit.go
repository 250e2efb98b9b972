// Package memlimit sets the Go runtime's memory defaults of the daemon:
// a soft memory limit derived from the container's cgroup memory limit
// when GOMEMLIMIT is not set, so the heap stays inside the limit (the
// garbage collector works harder as the heap nears it instead of letting
// it grow to twice the live heap), a lower GOGC when GOGC is not set, and
// giving back the binary's init-only pages (DropInitPages).
package memlimit

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"os"
	"path"
	"runtime/debug"
	"strconv"
	"strings"

	"github.com/remediate-dev/remediate/internal/boundedfile"
)

// Fraction of the cgroup limit given to the Go heap: the rest is for
// what the runtime does not count (stacks outside the heap, the binary's
// text, cgo-free child processes are their own cgroup charge anyway) and
// headroom. 192 MiB gives ~154 MiB (the DaemonSet used to set 150MiB).
const Fraction = 0.8

// GCPercent is the GOGC used when GOGC is not set: the heap may grow by a
// quarter of the live heap between collections instead of doubling. The
// daemon's steady cycles allocate little (unchanged saves and views are
// not parsed or derived again, ~1.4 MB a cycle on a loaded node), so
// collections stay rare while the RSS of a node with a large rule set
// stays near its live heap. Measured with `make bench-load` (20k legacy
// rules, 1,000 extra processes): 25 against 50 gave 35.3 against 38.3 MiB
// of RSS (anonymous 19.0 against 21.6) for 20 against 17 ms of CPU per
// cycle.
const GCPercent = 25

// unlimited: cgroup v1 reports "no limit" as a page-rounded maximum int64.
const unlimited = int64(1) << 62

// Result says what Set did.
type Result struct {
	// Limit is the soft limit set (0: none set).
	Limit int64
	// CgroupLimit is the cgroup's memory limit found (0: none).
	CgroupLimit int64
	// Reason is why no limit was set, or where it came from.
	Reason string
	// GCPercent is the GOGC set (0: left to the environment).
	GCPercent int
}

// Set sets GOGC to GCPercent unless GOGC is set, and the runtime's memory
// limit to Fraction of the cgroup memory limit of this process, unless
// GOMEMLIMIT is set (the runtime has applied it) or no cgroup limit is
// found. cgroupRoot "" means /sys/fs/cgroup.
func Set(cgroupRoot string) Result {
	gc := 0
	if v, ok := os.LookupEnv("GOGC"); !ok || v == "" {
		debug.SetGCPercent(GCPercent)
		gc = GCPercent
	}
	r := setLimit(cgroupRoot)
	r.GCPercent = gc
	return r
}

func setLimit(cgroupRoot string) Result {
	if v, ok := os.LookupEnv("GOMEMLIMIT"); ok && v != "" {
		return Result{Reason: "GOMEMLIMIT=" + v + " set in the environment"}
	}
	if cgroupRoot == "" {
		cgroupRoot = "/sys/fs/cgroup"
	}
	self, err := boundedfile.Read("/proc/self/cgroup", 64<<10)
	if err != nil {
		return Result{Reason: fmt.Sprintf("no cgroup: %v", err)}
	}
	lim, err := CgroupLimit(cgroupRoot, self)
	if err != nil {
		return Result{Reason: err.Error()}
	}
	soft := int64(float64(lim) * Fraction)
	debug.SetMemoryLimit(soft)
	return Result{Limit: soft, CgroupLimit: lim, Reason: fmt.Sprintf("%.0f%% of the cgroup memory limit", Fraction*100)}
}

// CgroupLimit returns the memory limit of the cgroup named in selfCgroup
// (the content of /proc/self/cgroup) under root: cgroup v2's memory.max or
// v1's memory.limit_in_bytes, the smallest along the path up to the root
// of the mount (a container sees its own cgroup as the root). No limit is
// an error saying so.
func CgroupLimit(root string, selfCgroup []byte) (int64, error) {
	var v2, v1 string
	haveV2, haveV1 := false, false
	sc := bufio.NewScanner(bytes.NewReader(selfCgroup))
	for sc.Scan() {
		f := strings.SplitN(sc.Text(), ":", 3)
		if len(f) != 3 {
			continue
		}
		if f[0] == "0" && f[1] == "" {
			v2, haveV2 = f[2], true
		}
		for _, c := range strings.Split(f[1], ",") {
			if c == "memory" {
				v1, haveV1 = f[2], true
			}
		}
	}
	var dir, file string
	switch {
	case haveV1:
		dir, file = path.Join(root, "memory"), "memory.limit_in_bytes"
		v2 = v1
	case haveV2:
		dir, file = root, "memory.max"
	default:
		return 0, errors.New("no memory cgroup in /proc/self/cgroup")
	}
	best := int64(0)
	p := path.Clean("/" + v2)
	for {
		b, err := boundedfile.Read(path.Join(dir, p, file), 4096)
		if err == nil {
			s := strings.TrimSpace(string(b))
			if s != "max" {
				n, err := strconv.ParseInt(s, 10, 64)
				if err != nil {
					return 0, fmt.Errorf("%s: %w", path.Join(dir, p, file), err)
				}
				if n > 0 && n < unlimited && (best == 0 || n < best) {
					best = n
				}
			}
		}
		if p == "/" {
			break
		}
		p = path.Dir(p)
	}
	if best == 0 {
		return 0, errors.New("no cgroup memory limit")
	}
	return best, nil
}
