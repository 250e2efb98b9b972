package procs

import (
	"fmt"
	"io"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"

	"github.com/remediate-dev/remediate/internal/boundedfile"
)

// maxCgroupFile bounds the read of /proc/<pid>/cgroup.
const maxCgroupFile = 64 << 10

// podUIDPattern finds the pod UID the kubelet puts in a container's cgroup
// path: "pod<uid>" with the cgroupfs driver
// (/kubepods/burstable/pod1b2c...-.../<container>), "pod<uid with _>" with
// the systemd driver (kubepods-burstable-pod1b2c..._....slice).
var podUIDPattern = regexp.MustCompile(`pod([0-9a-f]{8}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{12})`)

// ParsePodUID returns the UID of the pod whose cgroup the process is in,
// from the text of /proc/<pid>/cgroup; false when it is in none (a host
// process) or the lines name more than one pod.
func ParsePodUID(data []byte) (string, bool) {
	uid := ""
	for _, line := range strings.Split(string(data), "\n") {
		// hierarchy-ID:controllers:path
		parts := strings.SplitN(line, ":", 3)
		if len(parts) != 3 {
			continue
		}
		m := podUIDPattern.FindAllStringSubmatch(parts[2], -1)
		for _, g := range m {
			u := strings.ReplaceAll(g[1], "_", "-")
			if uid != "" && u != uid {
				return "", false
			}
			uid = u
		}
	}
	return uid, uid != ""
}

// PodUID reads <procRoot>/<pid>/cgroup (bounded) and returns the UID of the
// pod the process runs in.
func PodUID(procRoot string, pid int32) (string, error) {
	f, err := boundedfile.Open(filepath.Join(procRoot, strconv.Itoa(int(pid)), "cgroup"))
	if err != nil {
		return "", err
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, maxCgroupFile))
	if err != nil {
		return "", fmt.Errorf("reading cgroup of pid %d: %w", pid, err)
	}
	uid, ok := ParsePodUID(b)
	if !ok {
		return "", fmt.Errorf("pid %d runs in no (single) pod's cgroup", pid)
	}
	return uid, nil
}
