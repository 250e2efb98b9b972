//go:build linux

// Package podcgroup puts a test's processes in cgroups named as the
// kubelet's systemd cgroup driver names a pod's container
// (kubepods-besteffort-pod<uid>.slice/cri-containerd-<id>.scope), under a
// tree of the test's own, so that identity by cgroup (internal/procident)
// meets the names a real node gives. The tree is on the unified hierarchy
// (/sys/fs/cgroup/unified on a hybrid host); it is removed when the test
// ends, its processes moved back to the root first.
package podcgroup

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// Tree is a test's cgroup tree.
type Tree struct {
	base, top, units string
	pids             []int
}

// New makes the test's tree (named after tag and this process). Without
// root t is skipped; as root a tree that cannot be made fails t.
func New(t testing.TB, tag string) *Tree {
	t.Helper()
	base := "/sys/fs/cgroup/unified"
	if _, err := os.Stat(filepath.Join(base, "cgroup.procs")); err != nil {
		base = "/sys/fs/cgroup"
	}
	tr := &Tree{base: base, top: filepath.Join(base, fmt.Sprintf("kubepods.slice-remediate-%s-%d", tag, os.Getpid())),
		units: filepath.Join(base, fmt.Sprintf("system.slice-remediate-%s-%d", tag, os.Getpid()))}
	if os.Geteuid() != 0 {
		t.Skip("needs root: a cgroup of the test's own")
	}
	if err := os.MkdirAll(tr.top, 0o755); err != nil {
		t.Fatalf("making the test's cgroup tree: %v", err)
	}
	t.Cleanup(tr.remove)
	return tr
}

// Into moves pid into the cgroup of pod uid's container ctr (a 64-hex
// container ID; "" derives one from uid).
func (tr *Tree) Into(t testing.TB, uid, ctr string, pid int) {
	t.Helper()
	if ctr == "" {
		ctr = strings.Repeat(uid[len(uid)-2:], 32)
	}
	dir := filepath.Join(tr.top, "kubepods-besteffort-pod"+strings.ReplaceAll(uid, "-", "_")+".slice", "cri-containerd-"+ctr+".scope")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatalf("making the pod's cgroup: %v", err)
	}
	if err := os.WriteFile(filepath.Join(dir, "cgroup.procs"), []byte(strconv.Itoa(pid)), 0); err != nil {
		t.Fatalf("moving pid %d into %s: %v", pid, dir, err)
	}
	tr.pids = append(tr.pids, pid)
}

// IntoUnit moves pid into a cgroup named as systemd names a service
// unit's (.../<unit>, unit such as "k3s.service"), outside any kubelet
// cgroup: a host process of that unit.
func (tr *Tree) IntoUnit(t testing.TB, unit string, pid int) {
	t.Helper()
	dir := filepath.Join(tr.units, unit)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatalf("making the unit's cgroup: %v", err)
	}
	if err := os.WriteFile(filepath.Join(dir, "cgroup.procs"), []byte(strconv.Itoa(pid)), 0); err != nil {
		t.Fatalf("moving pid %d into %s: %v", pid, dir, err)
	}
	tr.pids = append(tr.pids, pid)
}

// remove moves the processes still running back to the root cgroup, then
// removes the tree deepest first, retrying while processes leave.
func (tr *Tree) remove() {
	for _, pid := range tr.pids {
		_ = os.WriteFile(filepath.Join(tr.base, "cgroup.procs"), []byte(strconv.Itoa(pid)), 0)
	}
	for _, top := range []string{tr.top, tr.units} {
		var dirs []string
		_ = filepath.Walk(top, func(p string, info os.FileInfo, err error) error {
			if err == nil && info.IsDir() {
				dirs = append(dirs, p)
			}
			return nil
		})
		for i := len(dirs) - 1; i >= 0; i-- {
			for j := 0; j < 100 && os.Remove(dirs[i]) != nil; j++ {
				time.Sleep(20 * time.Millisecond)
			}
		}
	}
}
