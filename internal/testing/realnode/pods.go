package realnode

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
)

// ContainerPID is the host PID of the main process of the pod's container
// named name, from containerd's own task list (its container ID from the
// pod's status): never a process found by its name, which another
// kube-proxy on this machine could share.
func (n *Node) ContainerPID(ctx context.Context, pod *corev1.Pod, name string) (int, error) {
	id := ""
	for _, cs := range pod.Status.ContainerStatuses {
		if cs.Name == name && cs.State.Running != nil {
			id = strings.TrimPrefix(cs.ContainerID, "containerd://")
		}
	}
	if id == "" {
		return 0, fmt.Errorf("pod %s/%s: container %s not running", pod.Namespace, pod.Name, name)
	}
	out, err := n.ctr(ctx, "tasks", "ls")
	if err != nil {
		return 0, err
	}
	// TASK PID STATUS
	for _, l := range strings.Split(out, "\n") {
		f := strings.Fields(l)
		if len(f) >= 2 && f[0] == id {
			pid, err := strconv.Atoi(f[1])
			if err != nil || pid <= 1 {
				return 0, fmt.Errorf("ctr tasks ls: bad pid in %q", l)
			}
			return pid, nil
		}
	}
	return 0, fmt.Errorf("container %s (%s) not in containerd's tasks:\n%s", name, id, out)
}

// StartTime is field 22 of /proc/<pid>/stat (clock ticks since boot): with
// the PID it names one process, so a signal sent later (SIGCONT in a
// cleanup) never reaches a process that reused the PID.
func StartTime(pid int) (string, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return "", err
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return "", fmt.Errorf("/proc/%d/stat: no comm", pid)
	}
	f := strings.Fields(s[i+1:])
	if len(f) < 20 {
		return "", fmt.Errorf("/proc/%d/stat: %d fields", pid, len(f))
	}
	return f[19], nil
}

// ProcState is field 3 of /proc/<pid>/stat (R, S, T, ...).
func ProcState(pid int) (string, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return "", err
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 || len(s) < i+3 {
		return "", fmt.Errorf("/proc/%d/stat: no state", pid)
	}
	return s[i+2 : i+3], nil
}
