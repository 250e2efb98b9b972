package detect

import (
	"context"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/remediate-dev/remediate/internal/iptables"
	"github.com/remediate-dev/remediate/internal/procs"
)

func TestPickKubeProxy(t *testing.T) {
	p := func(pid int32, netns string) procs.Process {
		return procs.Process{Pid: pid, Comm: "kube-proxy", NetNS: netns}
	}
	const self, other = "net:[1]", "net:[2]"
	for _, c := range []struct {
		name    string
		ps      []procs.Process
		self    string
		pid     int32
		wantErr string
	}{
		{"none", nil, self, 0, "no process named kube-proxy"},
		// Issue 27, item 9: the only one, in another namespace, is not
		// this node's (on main it was taken).
		{"the only one, in another namespace", []procs.Process{p(7, other)}, self, 0, "no kube-proxy of this node: 1 processes named kube-proxy, none this node's: pid 7 runs in another network namespace"},
		{"the only one, its namespace unknown", []procs.Process{p(7, "")}, self, 7, ""},
		{"the only one in this network namespace", []procs.Process{p(7, other), p(9, self)}, self, 9, ""},
		{"several, none here (kind's nested clusters)", []procs.Process{p(7, other), p(9, other)}, self, 0, "2 processes named kube-proxy, none this node's"},
		{"several here", []procs.Process{p(7, self), p(9, self)}, self, 0, "2 may be this node's"},
		{"several, this namespace unknown", []procs.Process{p(7, ""), p(9, "")}, "", 0, "cannot tell which"},
		{"an impostor here", []procs.Process{{Pid: 7, Comm: "kube-proxy", NetNS: self, Exe: "/tmp/x/bash"}}, self, 0, "pid 7's executable is /tmp/x/bash, not a kube-proxy"},
	} {
		got, err := pickKubeProxy(c.ps, c.self)
		if c.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), c.wantErr) {
				t.Errorf("%s: %+v, %v; want an error containing %q", c.name, got, err, c.wantErr)
			}
			continue
		}
		if err != nil || got.Pid != c.pid {
			t.Errorf("%s: %+v, %v; want PID %d", c.name, got, err, c.pid)
		}
	}
}

// TestKubeProxyIPTables: kube-proxy's process is found and its iptables
// read from its own root (/proc/<pid>/root), not the host's; the two
// detectors that use it agree.
func TestKubeProxyIPTables(t *testing.T) {
	pf := procs.NewFake(999)
	pf.Add(fakeProc(50, 1, "kube-proxy", procT0.Add(-time.Hour), "S", "kube-proxy"))
	n, _ := newIssue3Node(pf)
	n.ProcRoot = fakeProcRoot(t, map[int]map[string]string{1: debianRoot("nft", "1.8.9"), 50: debianRoot("legacy", "1.8.7")})
	kp, err := kubeProxyIPTables(context.Background(), n, nil)
	if err != nil {
		t.Fatal(err)
	}
	if kp.Who != "kube-proxy" || kp.Pid != 50 || kp.In.Root != filepath.Join(n.ProcRoot, "50", "root") ||
		kp.In.Backend != iptables.Legacy || kp.In.Version != "1.8.7" {
		t.Fatalf("kube-proxy's iptables = %+v", kp)
	}
	if host := readPartyIPTables(nil, "host", 0, hostRoot(n)); host.In.Backend != iptables.NFT || host.In.Root != filepath.Join(n.ProcRoot, "1", "root") {
		t.Fatalf("host's iptables = %+v", host)
	}
	_, kp2, _, _ := readIPTablesParties(context.Background(), n, nil, nil)
	if kp2 == nil || kp2.Pid != kp.Pid || kp2.In.Describe() != kp.In.Describe() {
		t.Fatalf("readIPTablesParties' kube-proxy = %+v, kubeProxyIPTables' %+v", kp2, kp)
	}

	// A second kube-proxy in another network namespace (a nested
	// cluster's): this node's is still the one in the daemon's.
	nested := fakeProc(70, 1, "kube-proxy", procT0.Add(-time.Hour), "S", "kube-proxy")
	nested.NetNS = "net:[4026532999]"
	pf.Add(nested)
	if kp, err := kubeProxyIPTables(context.Background(), n, nil); err != nil || kp.Pid != 50 {
		t.Fatalf("with a nested kube-proxy: %+v, %v", kp, err)
	}

	// No process lister: said, not guessed.
	n.Procs = nil
	if _, err := kubeProxyIPTables(context.Background(), n, nil); err == nil {
		t.Fatal("no error without a process lister")
	}
}
