package realnode

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
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

// ExecInContainer starts argv in the pod's running container named name,
// as kubectl exec does (containerd's `ctr tasks exec`: the process joins
// that container's cgroup and namespaces, its parent is the runtime's
// shim, not the container's main process). execID names the exec in
// containerd. The returned command is ctr's own: it ends when the process
// ends; the caller stops the process by its host PID (ProcessInPod) and
// then waits for the command.
func (n *Node) ExecInContainer(ctx context.Context, pod *corev1.Pod, name, execID string, argv ...string) (*exec.Cmd, error) {
	id := ""
	for _, cs := range pod.Status.ContainerStatuses {
		if cs.Name == name && cs.State.Running != nil {
			id = strings.TrimPrefix(cs.ContainerID, "containerd://")
		}
	}
	if id == "" {
		return nil, fmt.Errorf("pod %s/%s: container %s not running", pod.Namespace, pod.Name, name)
	}
	cmd := exec.CommandContext(ctx, "ctr", append([]string{"--address", n.ContainerdSock, "-n", "k8s.io", "tasks", "exec", "--exec-id", execID, id}, argv...)...)
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("ctr tasks exec in %s/%s %s: %w", pod.Namespace, pod.Name, name, err)
	}
	return cmd, nil
}

// ProcessInPod returns the host PIDs of the processes whose argv[0]
// basename is argv0, whose whole argv (NUL-separated) contains each of
// argvHas, and whose cgroup is the pod's (its UID in /proc/<pid>/cgroup,
// with '-' or '_' as the kubelet's cgroup driver writes it): how the test
// finds what it started in a pod, never by name alone (other tests run
// processes of the same names on this machine, and kube-proxy's container
// runs its own short iptables-restore every sync).
func ProcessInPod(podUID, argv0 string, argvHas ...string) ([]int, error) {
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return nil, err
	}
	uids := []string{podUID, strings.ReplaceAll(podUID, "-", "_")}
	var out []int
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		cl, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
		if err != nil || len(cl) == 0 {
			continue
		}
		a0, _, _ := strings.Cut(string(cl), "\x00")
		if filepath.Base(a0) != argv0 {
			continue
		}
		has := true
		for _, h := range argvHas {
			has = has && strings.Contains(string(cl), h)
		}
		if !has {
			continue
		}
		cg, err := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", pid))
		if err != nil {
			continue
		}
		if strings.Contains(string(cg), "pod"+uids[0]) || strings.Contains(string(cg), "pod"+uids[1]) {
			out = append(out, pid)
		}
	}
	return out, nil
}
