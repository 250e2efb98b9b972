package lockwatch

import (
	"bytes"
	"strings"
)

// maxCgroupBytes bounds how much of /proc/<pid>/cgroup is read.
const maxCgroupBytes = 16 << 10

// ParseCgroup returns the pod UID and container ID a /proc/<pid>/cgroup
// names, "" for either when it names none. Both kubelet cgroup drivers
// and both cgroup versions are understood:
//
//	0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod1b2c_..._9f.slice/cri-containerd-<id>.scope
//	11:cpu,cpuacct:/kubepods/burstable/pod1b2c-...-9f/<id>
//
// The UID is returned with dashes (the systemd driver writes underscores)
// and the container ID without its runtime prefix. Hostile input gives
// "" or a bounded string, never an error.
func ParseCgroup(b []byte) (podUID, container string) {
	if len(b) > maxCgroupBytes {
		b = b[:maxCgroupBytes]
	}
	for _, line := range bytes.Split(b, []byte("\n")) {
		// hierarchy-ID:controllers:path; the path may contain ':'.
		parts := bytes.SplitN(line, []byte(":"), 3)
		if len(parts) != 3 || !bytes.Contains(parts[2], []byte("kubepods")) {
			continue
		}
		u, c := fromCgroupPath(string(parts[2]))
		if u != "" {
			return u, c
		}
	}
	return "", ""
}

func fromCgroupPath(path string) (podUID, container string) {
	segs := strings.Split(path, "/")
	for i, s := range segs {
		s = strings.TrimSuffix(s, ".slice")
		j := strings.LastIndex(s, "pod")
		if j < 0 {
			continue
		}
		uid := strings.ReplaceAll(s[j+3:], "_", "-")
		if !isUID(uid) {
			continue
		}
		podUID = uid
		if i+1 < len(segs) {
			container = containerID(segs[i+1])
		}
		return podUID, container
	}
	return "", ""
}

// isUID accepts the 36-character form Kubernetes uses (and static pods'
// 32-hex-digit config hashes).
func isUID(s string) bool {
	if len(s) != 36 && len(s) != 32 {
		return false
	}
	for i, r := range s {
		switch {
		case r >= '0' && r <= '9', r >= 'a' && r <= 'f', r >= 'A' && r <= 'F':
		case r == '-' && len(s) == 36 && (i == 8 || i == 13 || i == 18 || i == 23):
		default:
			return false
		}
	}
	return true
}

// containerID strips the runtime's prefix and suffix
// ("cri-containerd-<id>.scope", "crio-<id>.scope", "docker-<id>.scope").
func containerID(seg string) string {
	seg = strings.TrimSuffix(seg, ".scope")
	if i := strings.LastIndexByte(seg, '-'); i >= 0 {
		seg = seg[i+1:]
	}
	if len(seg) < 12 || len(seg) > 128 {
		return ""
	}
	for _, r := range seg {
		if !(r >= '0' && r <= '9' || r >= 'a' && r <= 'f') {
			return ""
		}
	}
	return seg
}
