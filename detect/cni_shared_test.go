package detect

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/remediate-dev/remediate/internal/cni"
	"github.com/remediate-dev/remediate/internal/node"
)

// inotifyOpens watches dir for opens (IN_OPEN) on the real kernel; count
// returns how many times the directory itself was opened (listed) and
// each file in it, since the watch began. Closes are watched too: the
// kernel merges an event identical to the last one queued, so two opens
// count as two only with their close between them (sequential readers).
func inotifyOpens(t *testing.T, dir string) (count func() (dirOpens int, files map[string]int)) {
	t.Helper()
	fd, err := unix.InotifyInit1(unix.IN_CLOEXEC | unix.IN_NONBLOCK)
	if err != nil {
		t.Skipf("inotify: %v", err)
	}
	t.Cleanup(func() { unix.Close(fd) })
	if _, err := unix.InotifyAddWatch(fd, dir, unix.IN_OPEN|unix.IN_CLOSE_NOWRITE); err != nil {
		t.Fatal(err)
	}
	dirs, files := 0, map[string]int{}
	return func() (int, map[string]int) {
		buf := make([]byte, 64<<10)
		for {
			n, err := unix.Read(fd, buf)
			if errors.Is(err, unix.EAGAIN) {
				return dirs, files
			}
			if err != nil {
				t.Fatal(err)
			}
			for off := 0; off+unix.SizeofInotifyEvent <= n; {
				mask := binary.LittleEndian.Uint32(buf[off+4:])
				nameLen := int(binary.LittleEndian.Uint32(buf[off+12:]))
				name := string(bytes.TrimRight(buf[off+unix.SizeofInotifyEvent:off+unix.SizeofInotifyEvent+nameLen], "\x00"))
				switch {
				case mask&unix.IN_Q_OVERFLOW != 0:
					t.Fatal("inotify queue overflow")
				case mask&unix.IN_OPEN == 0:
				case name == "":
					dirs++
				default:
					files[name]++
				}
				off += unix.SizeofInotifyEvent + nameLen
			}
		}
	}
}

// TestCNIDetectorsShareOneRead: CNIConfig and HostLocalIPAM, run in one
// cycle, read the CNI configuration directory once between them through the node's shared read (cni.Shared,
// wired by cmd/remediate): the kernel (inotify) counts one listing of the
// directory and one open of the file in use. Each read on its own lists
// it twice and opens the file twice; before, HostLocalIPAM also opened the
// file again for its IPAM section (3 opens a cycle).
func TestCNIDetectorsShareOneRead(t *testing.T) {
	ctx := context.Background()
	confDir, data := t.TempDir(), t.TempDir()
	const file = "10-tiny.conflist"
	conf := fmt.Sprintf(`{"cniVersion":"1.0.0","name":"tiny","plugins":[{"type":"bridge","bridge":"cni0","ipam":{"type":"host-local","ranges":[[{"subnet":"10.96.0.0/24","rangeStart":"10.96.0.2","rangeEnd":"10.96.0.5"}]],"dataDir":%q}}]}`, data)
	if err := os.WriteFile(filepath.Join(confDir, file), []byte(conf), 0o644); err != nil {
		t.Fatal(err)
	}
	plugin := fmt.Sprintf(`{"cniVersion":"1.0.0","name":"tiny","type":"bridge","ipam":{"type":"host-local","ranges":[[{"subnet":"10.96.0.0/24","rangeStart":"10.96.0.2","rangeEnd":"10.96.0.5"}]],"dataDir":%q}}`, data)
	id := "7777777777777777777777777777777777777777777777777777777777777777"
	if err := hostLocalADD(t, plugin, id); err != nil {
		t.Fatal(err)
	}
	clk := clocktesting.NewFakePassiveClock(time.Now())
	cycle := func(n *node.Node) (int, int) {
		t.Helper()
		count := inotifyOpens(t, confDir)
		cfg := newIssue3Detector(t, "CNIConfig", n, func(p any) { p.(*CNIConfigParams).RequirePlugins = false })
		ipam := newIssue3Detector(t, "HostLocalIPAM", n, nil)
		// One after the other (the engine runs them concurrently;
		// cni.Shared's own test has concurrent callers share one read):
		// each open is then counted.
		for _, d := range []Detector{cfg, ipam} {
			if fs, err := d.Detect(ctx); err != nil || len(fs) != 0 {
				t.Errorf("%T: %+v %v", d, fs, err)
			}
		}
		if j := ipam.(Judged).Judged(); !bytes.Contains([]byte(j), []byte("1 of 4 addresses")) {
			t.Errorf("HostLocalIPAM judged %q", j)
		}
		dirs, files := count()
		return dirs, files[file]
	}

	// Each its own read (no shared reader).
	alone := &node.Node{Name: "node1", Clock: clk, CNIConfDir: confDir, CNIIPAMDir: data, CRI: &fakeCRI{ids: []string{id}}}
	if dirs, opens := cycle(alone); dirs != 2 || opens != 2 {
		t.Errorf("without the shared read: %d listings, %d opens of %s; want 2 and 2 (the control: is inotify counting?)", dirs, opens, file)
	}
	// Shared, as the daemon wires it.
	sh := cni.NewShared(confDir, "", 2*time.Second)
	n := &node.Node{Name: "node1", Clock: clk, CNIConfDir: confDir, CNIIPAMDir: data, CRI: &fakeCRI{ids: []string{id}}, CNI: sh}
	if dirs, opens := cycle(n); dirs != 1 || opens != 1 {
		t.Errorf("a cycle listed the CNI configuration directory %d times and opened %s %d times; want once each", dirs, file, opens)
	}
	if sh.Reads() != 1 {
		t.Errorf("%d shared reads, want 1", sh.Reads())
	}
}
