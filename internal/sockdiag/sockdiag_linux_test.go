package sockdiag_test

import (
	"context"
	"fmt"
	"io"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/remediate-dev/remediate/internal/netnstest"
	"github.com/remediate-dev/remediate/internal/procs"
	"github.com/remediate-dev/remediate/internal/sockdiag"
	"github.com/remediate-dev/remediate/internal/testing/podcgroup"
)

// TestRealListenerCgroup, on the real kernel: a process the test moved
// into a cgroup of its own (a unit's, on the unified hierarchy) before it
// listened on 10249 inside a network namespace the test made is found by
// a dump of that namespace with its cgroup's id; procs.CgroupTree maps
// the id to that cgroup's directory and its cgroup.procs to the process.
// A dump of this process's own namespace does not show the socket
// (sock_diag is per namespace), and a dump with a past deadline fails
// instead of waiting.
func TestRealListenerCgroup(t *testing.T) {
	ns := netnstest.New(t) // skips when not root
	netnstest.NeedCommands(t, "python3")
	tr := podcgroup.New(t, "sockdiag")
	tree, err := procs.NewCgroupTree("/sys/fs/cgroup")
	if err != nil {
		t.Skipf("no unified hierarchy: %v", err)
	}
	cmd := netnstest.Cmd(ns, "", "sh", "-c", `read go; exec python3 -c 'import socket,time
s=socket.socket(socket.AF_INET6); s.bind(("::",10249)); s.listen()
t=socket.socket(); t.bind(("127.0.0.1",10256)); t.listen()
print("listening", flush=True); time.sleep(600)'`)
	in, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	netnstest.StartGroup(t, cmd)
	pid := cmd.Process.Pid
	tr.IntoUnit(t, "proxy-under-test.service", pid)
	fmt.Fprintln(in, "go")
	buf := make([]byte, 10)
	if _, err := io.ReadFull(out, buf); err != nil || string(buf) != "listening\n" {
		t.Fatalf("the listener did not start: %q %v", buf, err)
	}

	ctx := context.Background()
	ls, err := sockdiag.Listeners(ctx, sockdiag.Options{NetNS: filepath.Join("/var/run/netns", ns)}, 10249, 10256)
	if err != nil {
		t.Fatal(err)
	}
	if len(ls) != 2 {
		t.Fatalf("listeners on 10249 and 10256 in %s: %+v, want 2", ns, ls)
	}
	for _, l := range ls {
		if !l.HasCgroupID {
			t.Skipf("the kernel does not report socket cgroups (INET_DIAG_CGROUP_ID, 5.7+): %+v", l)
		}
		if l.Inode == 0 || l.UID != 0 {
			t.Errorf("listener %+v: want an inode and uid 0", l)
		}
		dir, err := tree.Dir(ctx, l.CgroupID)
		if err != nil || !strings.HasSuffix(dir, "/proxy-under-test.service") {
			t.Fatalf("cgroup id %d of %s: %q %v, want the unit's cgroup", l.CgroupID, l.Addr, dir, err)
		}
		pids, err := tree.Procs(dir)
		if err != nil || !slices.Equal(pids, []int32{int32(pid)}) {
			t.Fatalf("processes of %s: %v %v, want [%d]", dir, pids, err, pid)
		}
	}
	if got := []string{ls[0].Addr.String(), ls[1].Addr.String()}; !slices.Contains(got, "[::]:10249") || !slices.Contains(got, "127.0.0.1:10256") {
		t.Errorf("addresses %v", got)
	}
	// Cached: the second lookup re-checks the directory only.
	if dir, err := tree.Dir(ctx, ls[0].CgroupID); err != nil || !strings.HasSuffix(dir, "/proxy-under-test.service") {
		t.Fatalf("cached lookup: %q %v", dir, err)
	}
	own, err := sockdiag.Listeners(ctx, sockdiag.Options{})
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range own {
		if l.Inode == ls[0].Inode || l.Inode == ls[1].Inode {
			t.Fatalf("this namespace's dump shows the namespace's socket %+v", l)
		}
	}
	past, cancel := context.WithDeadline(ctx, time.Now().Add(-time.Second))
	defer cancel()
	if _, err := sockdiag.Listeners(past, sockdiag.Options{}); err == nil {
		t.Fatal("a dump past its deadline succeeded")
	}
}
