package detect

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"github.com/remediate-dev/remediate/internal/finding"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	clocktesting "k8s.io/utils/clock/testing"

	"github.com/remediate-dev/remediate/internal/cri"
	"github.com/remediate-dev/remediate/internal/node"
)

type fakeCRI struct {
	ids []string
	err error
}

func (f *fakeCRI) ListPodSandboxes(context.Context) ([]cri.Sandbox, error) {
	var out []cri.Sandbox
	for _, id := range f.ids {
		out = append(out, cri.Sandbox{ID: id})
	}
	return out, f.err
}

func (f *fakeCRI) Endpoint() string { return "fake" }

// hostLocalADD runs the real host-local plugin (Debian's
// containernetworking-plugins) with CNI_COMMAND=ADD, as the runtime does.
func hostLocalADD(t *testing.T, conf, id string) error {
	t.Helper()
	bin := ""
	for _, d := range []string{os.Getenv("REMEDIATE_CNI_BIN"), "/usr/lib/cni", "/opt/cni/bin"} {
		if d != "" {
			if _, err := os.Stat(filepath.Join(d, "host-local")); err == nil {
				bin = filepath.Join(d, "host-local")
				break
			}
		}
	}
	if bin == "" {
		t.Skip("no host-local plugin binary (apt-get install containernetworking-plugins, or REMEDIATE_CNI_BIN)")
	}
	c := exec.Command(bin)
	c.Env = []string{"CNI_COMMAND=ADD", "CNI_CONTAINERID=" + id, "CNI_NETNS=/proc/self/ns/net", "CNI_IFNAME=eth0", "CNI_PATH=" + filepath.Dir(bin)}
	c.Stdin = strings.NewReader(conf)
	var out bytes.Buffer
	c.Stdout, c.Stderr = &out, &out
	if err := c.Run(); err != nil {
		return fmt.Errorf("%v: %s", err, out.String())
	}
	return nil
}

// TestHostLocalIPAM: the real host-local plugin fills a four-address
// range in a test data directory named by the conflist in use; the
// detector finds nothing at 3 of 4 (75 % < 90 %), a warning at 3 of 4 with
// warnPercent 70, critical when full, and the one allocation whose
// container ID the runtime does not have as leaked (not while younger
// than leakGrace); without a CRI the leak check is skipped with the
// reason.
func TestHostLocalIPAM(t *testing.T) {
	ctx := context.Background()
	confDir, data := t.TempDir(), t.TempDir()
	conf := fmt.Sprintf(`{"cniVersion":"1.0.0","name":"tiny","plugins":[{"type":"bridge","bridge":"cni0","ipam":{"type":"host-local","ranges":[[{"subnet":"10.98.0.0/24","rangeStart":"10.98.0.2","rangeEnd":"10.98.0.5"}]],"dataDir":%q}},{"type":"portmap","capabilities":{"portMappings":true}}]}`, data)
	if err := os.WriteFile(filepath.Join(confDir, "10-tiny.conflist"), []byte(conf), 0o644); err != nil {
		t.Fatal(err)
	}
	// The runtime hands each plugin its own configuration (libcni).
	plugin := fmt.Sprintf(`{"cniVersion":"1.0.0","name":"tiny","type":"bridge","ipam":{"type":"host-local","ranges":[[{"subnet":"10.98.0.0/24","rangeStart":"10.98.0.2","rangeEnd":"10.98.0.5"}]],"dataDir":%q}}`, data)
	ids := []string{strings.Repeat("1", 64), strings.Repeat("2", 64), strings.Repeat("3", 64), strings.Repeat("4", 64)}
	for _, id := range ids[:3] {
		if err := hostLocalADD(t, plugin, id); err != nil {
			t.Fatal(err)
		}
	}
	clk := clocktesting.NewFakePassiveClock(time.Now())
	crt := &fakeCRI{ids: ids[:3]}
	n := &node.Node{Name: "node1", Clock: clk, CNIConfDir: confDir, CNIIPAMDir: "/nonexistent", CRI: crt}
	d := newIssue3Detector(t, "HostLocalIPAM", n, nil)
	fs, err := d.Detect(ctx)
	if err != nil || len(fs) != 0 {
		t.Fatalf("3 of 4: %+v %v", fs, err)
	}
	if j := d.(Judged).Judged(); !strings.Contains(j, "3 of 4 addresses of 10.98.0.2-10.98.0.5") || !strings.Contains(j, "0 of 3 allocations belong to no sandbox") {
		t.Errorf("judged %q", j)
	}
	warn := newIssue3Detector(t, "HostLocalIPAM", n, func(p any) { p.(*HostLocalIPAMParams).WarnPercent = 70 })
	fs, err = warn.Detect(ctx)
	if err != nil || len(fs) != 1 || fs[0].Severity != finding.Warning || fs[0].Target != "cni-ipam/tiny" || !strings.Contains(fs[0].Message, "nearly exhausted: 3 of 4 addresses") {
		t.Fatalf("warn: %+v %v", fs, err)
	}
	// Full; the fourth container is not in the runtime (leaked), but
	// young.
	if err := hostLocalADD(t, plugin, ids[3]); err != nil {
		t.Fatal(err)
	}
	fs, err = d.Detect(ctx)
	if err != nil || len(fs) != 1 || fs[0].Severity != finding.Critical || !strings.Contains(fs[0].Message, "exhausted: new pods get no address") {
		t.Fatalf("full: %+v %v", fs, err)
	}
	if !strings.Contains(fmt.Sprint(fs[0].Evidence["leakCheck"]), "1 more younger than 5m0s") {
		t.Errorf("young leak: %v", fs[0].Evidence["leakCheck"])
	}
	// Past the grace: leaked, named.
	clk.SetTime(time.Now().Add(10 * time.Minute))
	fs, err = d.Detect(ctx)
	if err != nil || len(fs) != 2 {
		t.Fatalf("leaked: %+v %v", fs, err)
	}
	l := fs[1]
	if l.Target != "cni-ipam/tiny/leaked" || l.Evidence["leaked"] != 1 || !strings.Contains(l.Message, "10.98.0.5 (444444444444)") {
		t.Errorf("leak finding %+v", l)
	}
	if a := l.Evidence["addresses"].([]map[string]any)[0]; a["containerID"] != ids[3] || a["ifName"] != "eth0" {
		t.Errorf("leaked address %v", a)
	}
	if !strings.Contains(fs[0].Message, "1 of them leaked") {
		t.Errorf("usage message %q", fs[0].Message)
	}
	// The runtime unreachable, or no CRI: the check is skipped, saying why.
	crt.err = errors.New("ListPodSandbox on /run/containerd/containerd.sock: connection refused")
	fs, _ = d.Detect(ctx)
	if len(fs) != 1 || !strings.Contains(fmt.Sprint(fs[0].Evidence["leakCheck"]), "leak check skipped: ListPodSandbox") {
		t.Errorf("cri down: %+v", fs)
	}
	n.CRI, n.Unavailable = nil, map[string]string{"cri": "no --cri-socket"}
	fs, _ = d.Detect(ctx)
	if len(fs) != 1 || fs[0].Evidence["leakCheck"] != "leak check skipped: no --cri-socket" {
		t.Errorf("no cri: %+v", fs)
	}
	// Not host-local: skipped.
	os.WriteFile(filepath.Join(confDir, "10-tiny.conflist"), []byte(`{"cniVersion":"1.0.0","name":"k8s-pod-network","plugins":[{"type":"calico","ipam":{"type":"calico-ipam"}}]}`), 0o644)
	if _, err := d.Detect(ctx); err == nil || !strings.Contains(err.Error(), "does not use host-local IPAM") {
		t.Errorf("calico-ipam: %v", err)
	}
}

// TestHostLocalIPAMStoreAsMounted: in the pod the configuration's dataDir
// (a host path) is not there; the store is read where it is mounted
// (--cni-ipam-dir), and a store found nowhere is a skip, never "nothing
// allocated" (the chart's pod judged an unmounted store empty).
func TestHostLocalIPAMStoreAsMounted(t *testing.T) {
	ctx := context.Background()
	confDir, mounted := t.TempDir(), t.TempDir()
	hostPath := filepath.Join(t.TempDir(), "not-here", "networks")
	ranges := `"ranges":[[{"subnet":"10.97.0.0/24","rangeStart":"10.97.0.2","rangeEnd":"10.97.0.5"}]]`
	conf := fmt.Sprintf(`{"cniVersion":"1.0.0","name":"tiny","plugins":[{"type":"bridge","bridge":"cni0","ipam":{"type":"host-local",%s,"dataDir":%q}}]}`, ranges, hostPath)
	if err := os.WriteFile(filepath.Join(confDir, "10-tiny.conflist"), []byte(conf), 0o644); err != nil {
		t.Fatal(err)
	}
	// The real plugin writes the store; the daemon sees it at "mounted".
	plugin := fmt.Sprintf(`{"cniVersion":"1.0.0","name":"tiny","type":"bridge","ipam":{"type":"host-local",%s,"dataDir":%q}}`, ranges, mounted)
	ids := []string{strings.Repeat("5", 64), strings.Repeat("6", 64)}
	for _, id := range ids {
		if err := hostLocalADD(t, plugin, id); err != nil {
			t.Fatal(err)
		}
	}
	clk := clocktesting.NewFakePassiveClock(time.Now())
	n := &node.Node{Name: "node1", Clock: clk, CNIConfDir: confDir, CNIIPAMDir: mounted, CRI: &fakeCRI{ids: ids}}
	d := newIssue3Detector(t, "HostLocalIPAM", n, nil)
	if fs, err := d.Detect(ctx); err != nil || len(fs) != 0 {
		t.Fatalf("mounted store: %+v %v", fs, err)
	}
	if j := d.(Judged).Judged(); !strings.Contains(j, "2 of 4 addresses of 10.97.0.2-10.97.0.5") {
		t.Errorf("judged %q, want the mounted store's 2 of 4", j)
	}
	// Neither the configuration's dataDir nor --cni-ipam-dir here.
	n2 := &node.Node{Name: "node1", Clock: clk, CNIConfDir: confDir, CNIIPAMDir: filepath.Join(mounted, "absent"), CRI: &fakeCRI{ids: ids}}
	d2 := newIssue3Detector(t, "HostLocalIPAM", n2, nil)
	fs, err := d2.Detect(ctx)
	why, skipped := finding.IsSkip(err)
	if !skipped || len(fs) != 0 || !strings.Contains(why, "host-local data directory not found here") {
		t.Fatalf("no store anywhere: %+v %v, want a skip", fs, err)
	}
}

// TestHostLocalIPAMHungCRI: the runtime's socket accepts and never
// answers (a real unix socket); the full range is still reported as
// critical within the detector's deadline, and the leak check says it
// could not run and why. Before, the CRI call had the detector's whole
// deadline (cri.DefaultTimeout = detectorTimeout = 10s), so the detector
// ran out of time with it and the exhaustion finding was lost.
func TestHostLocalIPAMHungCRI(t *testing.T) {
	confDir, data := t.TempDir(), t.TempDir()
	conf := fmt.Sprintf(`{"cniVersion":"1.0.0","name":"tiny","plugins":[{"type":"bridge","bridge":"cni0","ipam":{"type":"host-local","ranges":[[{"subnet":"10.98.0.0/24","rangeStart":"10.98.0.2","rangeEnd":"10.98.0.3"}]],"dataDir":%q}}]}`, data)
	if err := os.WriteFile(filepath.Join(confDir, "10-tiny.conflist"), []byte(conf), 0o644); err != nil {
		t.Fatal(err)
	}
	plugin := fmt.Sprintf(`{"cniVersion":"1.0.0","name":"tiny","type":"bridge","ipam":{"type":"host-local","ranges":[[{"subnet":"10.98.0.0/24","rangeStart":"10.98.0.2","rangeEnd":"10.98.0.3"}]],"dataDir":%q}}`, data)
	for _, id := range []string{strings.Repeat("1", 64), strings.Repeat("2", 64)} {
		if err := hostLocalADD(t, plugin, id); err != nil {
			t.Fatal(err)
		}
	}
	sock := filepath.Join(t.TempDir(), "containerd.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	var held []net.Conn
	var mu sync.Mutex
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			held = append(held, c) // accepted, never read nor answered
			mu.Unlock()
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		mu.Lock()
		defer mu.Unlock()
		for _, c := range held {
			c.Close()
		}
	})
	n := &node.Node{Name: "node1", Clock: clocktesting.NewFakePassiveClock(time.Now()), CNIConfDir: confDir, CNIIPAMDir: "/nonexistent", CRI: cri.New(sock, 0)}
	d := newIssue3Detector(t, "HostLocalIPAM", n, nil)
	// As the engine runs a detector: its deadline (a short
	// detectorTimeout), the CRI client's own timeout (10s) longer.
	const timeout = 2 * time.Second
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	start := time.Now()
	fs, err := d.Detect(ctx)
	took := time.Since(start)
	if ctx.Err() != nil {
		t.Fatalf("Detect returned after the detector's deadline (%s, took %s): the engine drops its findings", timeout, took)
	}
	if err != nil || len(fs) != 1 || fs[0].Severity != finding.Critical || !strings.Contains(fs[0].Message, "exhausted") {
		t.Fatalf("findings %+v, err %v: want the critical exhaustion finding", fs, err)
	}
	if lc := fmt.Sprint(fs[0].Evidence["leakCheck"]); !strings.Contains(lc, "leak check skipped: the runtime did not answer within") || !strings.Contains(lc, "hung CRI socket") {
		t.Errorf("leakCheck %q: want why it could not run", lc)
	}
}
