package memlimit

import (
	"bufio"
	"fmt"
	"os"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/remediate-dev/remediate/internal/boundedfile"
)

// DropInitPages tells the kernel that the pages of this binary's
// read-only mappings (code, read-only data, the function tables) need not
// stay mapped: package initialisation touches much of the binary once
// (client-go's API scheme registers every built-in type) and never again,
// yet those file pages stay in the process's RSS. After madvise
// MADV_DONTNEED they are clean page-cache pages, reclaimable without
// writeback; what the daemon runs again is faulted back in from the page
// cache (minor faults, no I/O while cached). Only mappings of the
// executable that are not writable and hold no anonymous (copied) page
// are touched, so nothing is lost. It returns the bytes advised.
func DropInitPages() (int64, error) {
	exe, err := os.Executable()
	if err != nil {
		return 0, err
	}
	f, err := boundedfile.OpenBounded("/proc/self/smaps", 256<<20)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	type region struct {
		start, end uint64
		ok         bool
	}
	var (
		regions []region
		cur     *region
	)
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		fields := strings.Fields(line)
		if len(fields) >= 5 && strings.Contains(fields[0], "-") && len(fields[1]) == 4 {
			// A mapping header: start-end perms offset dev inode [path].
			regions = append(regions, region{})
			cur = &regions[len(regions)-1]
			se := strings.SplitN(fields[0], "-", 2)
			cur.start, _ = strconv.ParseUint(se[0], 16, 64)
			cur.end, _ = strconv.ParseUint(se[1], 16, 64)
			cur.ok = len(fields) >= 6 && fields[5] == exe && fields[1][1] == '-' && fields[1][3] == 'p'
			continue
		}
		// Anonymous pages in a file mapping are private copies (copy on
		// write: relocations, a debugger's breakpoints); dropping those
		// would lose them. Page-cache pages, dirty or not, are the file's.
		if cur != nil && strings.HasPrefix(line, "Anonymous:") {
			if len(fields) >= 2 && fields[1] != "0" {
				cur.ok = false
			}
		}
	}
	if err := sc.Err(); err != nil {
		return 0, err
	}
	var n int64
	for _, r := range regions {
		if !r.ok || r.end <= r.start {
			continue
		}
		if _, _, e := unix.Syscall(unix.SYS_MADVISE, uintptr(r.start), uintptr(r.end-r.start), unix.MADV_DONTNEED); e != 0 {
			return n, fmt.Errorf("madvise %x-%x: %w", r.start, r.end, e)
		}
		n += int64(r.end - r.start)
	}
	return n, nil
}
