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
// the systemd driver (kubepods-burstable-pod1b2c..._....slice). A static
// pod's UID is the 32 hex digits of its configuration's hash (the
// kubelet's; its mirror pod carries it in the kubernetes.io/config.mirror
// annotation).
var podUIDPattern = regexp.MustCompile(`pod([0-9a-f]{8}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{12}|[0-9a-f]{32})(?:\.slice)?$`)

// containerIDPattern is a container's cgroup directory below its pod's:
// cri-containerd-<id>.scope, crio-<id>.scope, docker-<id>.scope (systemd
// driver) or <id> (cgroupfs driver), id 64 hex digits.
var containerIDPattern = regexp.MustCompile(`^(?:(?:cri-containerd|crio|docker)-)?([0-9a-f]{64})(?:\.scope)?$`)

// CgroupPlace is where /proc/<pid>/cgroup puts a process: in a pod's
// cgroup, or the host's (no pod), or cannot tell.
type CgroupPlace uint8

// The places of CgroupPlace.
const (
	// CgroupUnknown: not read (or unreadable).
	CgroupUnknown CgroupPlace = iota
	// CgroupHost: no line names a kubelet cgroup (kubepods): a host
	// process (a systemd unit, a shell, a test's process).
	CgroupHost
	// CgroupPod: every line naming a kubelet pod cgroup names the same pod.
	CgroupPod
	// CgroupAmbiguous: lines name different pods, or a kubelet cgroup
	// without a pod UID.
	CgroupAmbiguous
)

func (c CgroupPlace) String() string {
	switch c {
	case CgroupHost:
		return "host"
	case CgroupPod:
		return "pod"
	case CgroupAmbiguous:
		return "ambiguous"
	}
	return "unknown"
}

// Cgroup is what a process's /proc/<pid>/cgroup says of its pod: a file
// every process may read (no ptrace), whose path a process cannot choose
// (moving into another cgroup takes write access to that cgroup's
// cgroup.procs: the host's root, not a pod's).
type Cgroup struct {
	Place CgroupPlace `json:"place"`
	// PodUID is the pod's UID as the kubelet named its cgroup (dashes, not
	// the systemd driver's underscores); ContainerID the container's ID
	// when its directory is below the pod's ("" for the pod's own cgroup).
	PodUID      string `json:"podUID,omitempty"`
	ContainerID string `json:"containerID,omitempty"`
	// Unit is, for a host process, the systemd unit its cgroup names
	// ("kube-proxy.service", "k3s.service"): the unit that runs it, which
	// the process cannot choose either. "" when none, or when the lines
	// name different units.
	Unit string `json:"unit,omitempty"`
	// Why says what made the place ambiguous.
	Why string `json:"why,omitempty"`
}

// unitPattern is a systemd service unit's cgroup directory name.
var unitPattern = regexp.MustCompile(`^[A-Za-z0-9:_.@\\-]{1,200}\.service$`)

// unitOfPath returns the deepest service unit a host cgroup path names.
func unitOfPath(path string) string {
	segs := strings.Split(path, "/")
	for i := len(segs) - 1; i >= 0; i-- {
		if unitPattern.MatchString(segs[i]) {
			return segs[i]
		}
	}
	return ""
}

// ParseCgroup returns what the text of /proc/<pid>/cgroup says of the
// process's pod (cgroup v1 and v2, the cgroupfs and systemd drivers, a
// cgroup namespace's relative "/../" paths).
func ParseCgroup(data []byte) Cgroup {
	if len(data) > maxCgroupFile {
		data = data[:maxCgroupFile]
	}
	var c Cgroup
	lines := 0
	unit, units := "", 0
	for _, line := range strings.Split(string(data), "\n") {
		// hierarchy-ID:controllers:path; the path may contain ':'.
		parts := strings.SplitN(line, ":", 3)
		if len(parts) != 3 {
			continue
		}
		lines++
		path := parts[2]
		if !strings.Contains(path, "kubepods") {
			// systemd's own hierarchies: the unified one (v2, or v1's
			// unified mount) and v1's name=systemd.
			if parts[1] == "" || parts[1] == "name=systemd" {
				if u := unitOfPath(path); u != "" && u != unit {
					unit, units = u, units+1
				}
			}
			continue
		}
		uid, ctr, ok := podOfPath(path)
		if !ok {
			return Cgroup{Place: CgroupAmbiguous, Why: fmt.Sprintf("cgroup %q is the kubelet's but names no pod", clipPath(path))}
		}
		if c.PodUID != "" && uid != c.PodUID {
			return Cgroup{Place: CgroupAmbiguous, Why: fmt.Sprintf("its cgroups name two pods (%s and %s)", c.PodUID, uid)}
		}
		c.PodUID = uid
		if ctr != "" {
			if c.ContainerID != "" && ctr != c.ContainerID {
				return Cgroup{Place: CgroupAmbiguous, Why: fmt.Sprintf("its cgroups name two containers (%s and %s)", c.ContainerID, ctr)}
			}
			c.ContainerID = ctr
		}
	}
	switch {
	case c.PodUID != "":
		c.Place = CgroupPod
	case lines > 0:
		c.Place = CgroupHost
		if units == 1 {
			c.Unit = unit
		}
	default:
		c.Why = "no cgroup line"
	}
	return c
}

// podOfPath finds the pod segment of a kubelet cgroup path and the
// container directory after it.
func podOfPath(path string) (uid, container string, ok bool) {
	segs := strings.Split(path, "/")
	for i, s := range segs {
		m := podUIDPattern.FindStringSubmatch(s)
		if m == nil {
			continue
		}
		uid = strings.ReplaceAll(m[1], "_", "-")
		if i+1 < len(segs) {
			if cm := containerIDPattern.FindStringSubmatch(segs[i+1]); cm != nil {
				container = cm[1]
			}
		}
		return uid, container, true
	}
	return "", "", false
}

func clipPath(s string) string {
	if len(s) > 256 {
		return s[:256] + "..."
	}
	return s
}

// ParsePodUID returns the UID of the pod whose cgroup the process is in,
// from the text of /proc/<pid>/cgroup; false when it is in none (a host
// process) or the lines name more than one pod (ParseCgroup).
func ParsePodUID(data []byte) (string, bool) {
	c := ParseCgroup(data)
	return c.PodUID, c.Place == CgroupPod
}

// readCgroup reads <procRoot>/<pid>/cgroup (bounded) and parses it.
func readCgroup(procRoot string, pid int32) (Cgroup, error) {
	f, err := boundedfile.Open(filepath.Join(procRoot, strconv.Itoa(int(pid)), "cgroup"))
	if err != nil {
		return Cgroup{}, err
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, maxCgroupFile))
	if err != nil {
		return Cgroup{}, fmt.Errorf("reading cgroup of pid %d: %w", pid, err)
	}
	return ParseCgroup(b), nil
}

// ReadCgroup reads <procRoot>/<pid>/cgroup (bounded) and parses it.
func ReadCgroup(procRoot string, pid int32) (Cgroup, error) { return readCgroup(procRoot, pid) }

// PodUID reads <procRoot>/<pid>/cgroup (bounded) and returns the UID of the
// pod the process runs in.
func PodUID(procRoot string, pid int32) (string, error) {
	c, err := readCgroup(procRoot, pid)
	if err != nil {
		return "", err
	}
	if c.Place != CgroupPod {
		why := c.Why
		if why == "" {
			why = "in no pod's cgroup"
		}
		return "", fmt.Errorf("pid %d runs in no (single) pod's cgroup: %s", pid, why)
	}
	return c.PodUID, nil
}
