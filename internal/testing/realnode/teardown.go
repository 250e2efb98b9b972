package realnode

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// Stop tears the node down, in the order of ../shared/notes/real-node.md:
// the controller manager, scheduler and kubelet (by PID); every container
// task (SIGKILL, then removed, which ends their shims); containerd,
// kube-apiserver and etcd; shims still alive (found by their -address,
// which names this node's socket, and killed by PID); mounts left under
// the node's folders and containerd's cni-* namespaces (lazily unmounted);
// the network namespaces; the kubepods cgroups (depth-first); the kubelet's
// sysctls (restored); the host folders Start found absent. It keeps going
// past errors and returns them all. Safe to call twice.
func (n *Node) Stop() error {
	if n == nil || n.stopped {
		return nil
	}
	n.stopped = true
	var errs []error
	add := func(err error) {
		if err != nil {
			errs = append(errs, err)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	for _, name := range []string{"kube-controller-manager", "kube-scheduler", "kubelet"} {
		if p := n.find(name); p != nil {
			add(p.stop(10 * time.Second))
		}
	}
	if p := n.find("containerd"); p != nil && !p.exited() {
		if out, err := n.ctr(ctx, "tasks", "ls", "-q"); err == nil {
			for _, id := range strings.Fields(out) {
				_, _ = n.ctr(ctx, "tasks", "kill", "-s", "SIGKILL", id)
			}
			for _, id := range strings.Fields(out) {
				// rm -f deletes it; a task that died with its sandbox is
				// already gone ("not found", or its shim closed the
				// connection): what is really left, Leftovers says.
				if out, err := n.ctr(ctx, "tasks", "rm", "-f", id); err != nil &&
					!strings.Contains(out, "not found") && !strings.Contains(out, "ttrpc: closed") {
					add(err)
				}
			}
		}
	}
	for _, name := range []string{"containerd", "kube-apiserver", "etcd"} {
		if p := n.find(name); p != nil {
			add(p.stop(5 * time.Second))
		}
	}
	if n.ContainerdSock != "" {
		for _, pid := range shimPIDs(n.ContainerdSock) {
			if err := syscall.Kill(pid, syscall.SIGKILL); err != nil && !errors.Is(err, syscall.ESRCH) {
				add(fmt.Errorf("kill shim %d: %w", pid, err))
			}
		}
	}
	// Wait a moment for killed shims to release their mounts.
	for i := 0; i < 20 && len(shimPIDs(n.ContainerdSock)) > 0; i++ {
		time.Sleep(250 * time.Millisecond)
	}
	var prefixes []string
	if n.Dir != "" {
		prefixes = append(prefixes, n.Dir+"/")
	}
	for _, p := range n.created {
		prefixes = append(prefixes, p+"/")
	}
	add(unmountUnder(prefixes))
	cniNS := cniNetns(n)
	for _, ns := range cniNS {
		_ = syscall.Unmount("/run/netns/"+ns, syscall.MNT_DETACH)
		if out, err := exec.Command("ip", "netns", "del", ns).CombinedOutput(); err != nil {
			add(fmt.Errorf("ip netns del %s: %w: %s", ns, err, out))
		}
	}
	if n.NetNS != nil {
		if out, err := exec.Command("ip", "netns", "del", n.NetNS.Name).CombinedOutput(); err != nil {
			add(fmt.Errorf("ip netns del %s: %w: %s", n.NetNS.Name, err, out))
		}
	}
	add(removeCgroups("kubepods"))
	for s, v := range n.sysctls {
		if err := os.WriteFile("/proc/sys/"+s, []byte(v), 0o644); err != nil {
			add(fmt.Errorf("restore sysctl %s=%s: %w", s, v, err))
		}
	}
	for _, p := range n.created {
		if err := os.RemoveAll(p); err != nil {
			add(fmt.Errorf("remove %s: %w", p, err))
		}
	}
	if n.lock != nil {
		n.lock.Close()
	}
	return errors.Join(errs...)
}

// shimPIDs are the containerd-shim processes serving the containerd at
// sock (their command line names it after -address).
func shimPIDs(sock string) []int {
	var out []int
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile("/proc/" + e.Name() + "/cmdline")
		if err != nil {
			continue
		}
		args := strings.Split(string(b), "\x00")
		if len(args) == 0 || !strings.Contains(filepath.Base(args[0]), "containerd-shim") {
			continue
		}
		for i, a := range args {
			if a == "-address" && i+1 < len(args) && args[i+1] == sock {
				out = append(out, pid)
			}
		}
	}
	return out
}

// Mounts returns the mount points (from /proc/self/mountinfo) under any of
// the prefixes, deepest first.
func Mounts(prefixes []string) ([]string, error) {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var out []string
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) < 5 {
			continue
		}
		mp := unescapeMount(fields[4])
		for _, p := range prefixes {
			if strings.HasPrefix(mp+"/", p) {
				out = append(out, mp)
				break
			}
		}
	}
	sort.Slice(out, func(i, j int) bool { return len(out[i]) > len(out[j]) })
	return out, sc.Err()
}

func unescapeMount(s string) string {
	r := strings.NewReplacer(`\040`, " ", `\011`, "\t", `\012`, "\n", `\134`, `\`)
	return r.Replace(s)
}

func unmountUnder(prefixes []string) error {
	mps, err := Mounts(prefixes)
	if err != nil {
		return err
	}
	var errs []error
	for _, mp := range mps {
		if err := syscall.Unmount(mp, syscall.MNT_DETACH); err != nil && !errors.Is(err, syscall.EINVAL) && !errors.Is(err, syscall.ENOENT) {
			errs = append(errs, fmt.Errorf("umount %s: %w", mp, err))
		}
	}
	return errors.Join(errs...)
}

// cniNetns lists the cni-* network namespaces containerd made for this
// node's pods: those whose namespace file is not the node's and that were
// made after Start began (only the node's containerd makes them).
func cniNetns(n *Node) []string {
	ents, _ := os.ReadDir("/run/netns")
	var out []string
	for _, e := range ents {
		if !strings.HasPrefix(e.Name(), "cni-") {
			continue
		}
		if info, err := e.Info(); err == nil && !info.ModTime().Before(n.started) {
			out = append(out, e.Name())
		}
	}
	return out
}

// removeCgroups removes the cgroup tree named top under every mounted
// cgroup hierarchy, depth-first (the kubelet's kubepods; empty once every
// container is gone).
func removeCgroups(top string) error {
	roots, _ := filepath.Glob("/sys/fs/cgroup/*/" + top)
	if st, err := os.Stat("/sys/fs/cgroup/" + top); err == nil && st.IsDir() {
		roots = append(roots, "/sys/fs/cgroup/"+top)
	}
	var errs []error
	for _, root := range roots {
		var dirs []string
		_ = filepath.WalkDir(root, func(p string, d os.DirEntry, err error) error {
			if err == nil && d.IsDir() {
				dirs = append(dirs, p)
			}
			return nil
		})
		sort.Slice(dirs, func(i, j int) bool { return len(dirs[i]) > len(dirs[j]) })
		for _, d := range dirs {
			var err error
			for i := 0; i < 20; i++ { // a killed task's cgroup empties shortly after
				if err = syscall.Rmdir(d); err == nil || errors.Is(err, syscall.ENOENT) {
					err = nil
					break
				}
				time.Sleep(100 * time.Millisecond)
			}
			if err != nil {
				errs = append(errs, fmt.Errorf("rmdir %s: %w", d, err))
			}
		}
	}
	return errors.Join(errs...)
}

// Leftovers lists what a stopped node may have left: processes started
// from its folder or serving its socket, mounts under its folders, its
// network namespace, kubepods cgroups, and the host folders. Empty means
// clean.
func (n *Node) Leftovers() []string {
	var out []string
	if n.ContainerdSock != "" {
		for _, pid := range shimPIDs(n.ContainerdSock) {
			out = append(out, fmt.Sprintf("shim process %d", pid))
		}
	}
	for _, p := range n.procs {
		if !p.exited() {
			out = append(out, fmt.Sprintf("process %s (%d)", p.name, p.cmd.Process.Pid))
		}
	}
	prefixes := []string{n.Dir + "/"}
	for _, p := range n.created {
		prefixes = append(prefixes, p+"/")
	}
	mps, _ := Mounts(prefixes)
	for _, mp := range mps {
		out = append(out, "mount "+mp)
	}
	if n.NetNS != nil {
		if _, err := os.Stat("/run/netns/" + n.NetNS.Name); err == nil {
			out = append(out, "netns "+n.NetNS.Name)
		}
	}
	if m, _ := filepath.Glob("/sys/fs/cgroup/*/kubepods"); len(m) > 0 {
		out = append(out, "cgroups "+strings.Join(m, " "))
	}
	for _, p := range n.created {
		if _, err := os.Stat(p); err == nil {
			out = append(out, "path "+p)
		}
	}
	for s, v := range n.sysctls {
		if b, err := os.ReadFile("/proc/sys/" + s); err == nil && strings.TrimSpace(string(b)) != v {
			out = append(out, fmt.Sprintf("sysctl %s=%s (was %s)", s, strings.TrimSpace(string(b)), v))
		}
	}
	return out
}
