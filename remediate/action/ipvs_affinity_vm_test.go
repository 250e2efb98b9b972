//go:build linux

package action

import (
	"fmt"
	"net/netip"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/remediate-dev/remediate/detect"
	"github.com/remediate-dev/remediate/internal/finding"
	"github.com/remediate-dev/remediate/internal/testing/vm"
)

// affinityLab is the UDP affinity fault of the field guide on a real
// kernel: a UDP virtual server 10.96.0.10:53 (rr, NAT) with backends b1 and
// b2, and a client whose socket (fixed source port) IPVS pinned to one of
// them, "dead" (the other is "live").
type affinityLab struct {
	client, dead, live *vm.Host
	servers            map[string]*vm.Server
	u                  *vm.UDPClient
	vip                netip.AddrPort
}

var affinityVIP = netip.AddrPortFrom(vm.VIPDNS, 53)

// newAffinityLab builds the fault; persistent adds -p 60 (kube-proxy's
// sessionAffinity: ClientIP); useCT sets net.ipv4.vs.conntrack=1 and
// installs nft rules using conntrack (as kube-proxy's IPVS mode does), so
// IPVS flows get nf_conntrack entries.
func newAffinityLab(t *testing.T, persistent, useCT bool) *affinityLab {
	vm.Require(t)
	lab := vm.SharedLab(t)
	l := &affinityLab{client: lab.Hosts["client"], vip: affinityVIP, servers: map[string]*vm.Server{}}
	for _, b := range []string{"b1", "b2"} {
		l.servers[b] = vm.Serve(t, lab.Hosts[b], 5353)
	}
	args := []string{"ipvsadm", "-A", "-u", l.vip.String(), "-s", "rr"}
	if persistent {
		args = append(args, "-p", "60")
	}
	vm.Sh(t, args...)
	for _, b := range []string{"b1", "b2"} {
		vm.Sh(t, "ipvsadm", "-a", "-u", l.vip.String(), "-r", netip.AddrPortFrom(lab.Hosts[b].V4, 5353).String(), "-m", "-w", "1")
	}
	if useCT {
		vm.WriteSysctl(t, "net/ipv4/vs/conntrack", "1")
		vm.Sh(t, "nft", "add table inet vmtest")
		t.Cleanup(func() { vm.Sh(t, "nft", "delete table inet vmtest") })
		vm.Sh(t, "nft", "add chain inet vmtest cfwd { type filter hook forward priority 0 ; }")
		vm.Sh(t, "nft", "add rule inet vmtest cfwd ct state established,related counter accept")
		vm.Sh(t, "nft", "add chain inet vmtest cin { type filter hook input priority 0 ; }")
		vm.Sh(t, "nft", "add rule inet vmtest cin ct state new,established counter accept")
	}
	l.u = vm.NewUDPClient(t, l.client, vm.ClientPort(), l.vip)
	got, err := l.u.Query(2 * time.Second)
	if err != nil {
		t.Fatal(err)
	}
	switch got {
	case "b1":
		l.dead, l.live = lab.Hosts["b1"], lab.Hosts["b2"]
	case "b2":
		l.dead, l.live = lab.Hosts["b2"], lab.Hosts["b1"]
	default:
		t.Fatalf("first query answered by %q:\n%s", got, vm.Sh(t, "ipvsadm", "-Lnc"))
	}
	if useCT {
		if out := vm.Sh(t, "conntrack", "-L", "-p", "udp"); !strings.Contains(out, "dport=53") {
			t.Fatalf("no nf_conntrack entry for the IPVS flow with ct in use:\n%s", out)
		}
	}
	return l
}

// kill stops the dead backend's server: the pod is gone.
func (l *affinityLab) kill() { l.servers[l.dead.Name].Stop() }

func (l *affinityLab) deadRS() string { return netip.AddrPortFrom(l.dead.V4, 5353).String() }

// deleteRS removes the dead backend from the virtual server (what
// kube-proxy does when the endpoint goes).
func (l *affinityLab) deleteRS(t *testing.T) {
	vm.Sh(t, "ipvsadm", "-d", "-u", l.vip.String(), "-r", l.deadRS())
}

// queries sends n queries, 300 ms apart, and returns who answered each:
// "live", "dead" or "-" for no answer.
func (l *affinityLab) queries(t *testing.T, n int) []string {
	var out []string
	for i := 0; i < n; i++ {
		got, err := l.u.Query(300 * time.Millisecond)
		if err != nil {
			t.Fatal(err)
		}
		switch got {
		case "":
			got = "-"
		case l.live.Name:
			got = "live"
		case l.dead.Name:
			got = "dead"
		}
		out = append(out, got)
	}
	return out
}

// pinnedToDead reports whether the client's flow still has an entry on the
// dead backend in /proc/net/ip_vs_conn, and the entries of the client's
// port.
func (l *affinityLab) pinnedToDead(t *testing.T) (bool, []string) {
	var out []string
	pinned := false
	port := fmt.Sprintf("%04X", l.u.LocalPort())
	dead := fmt.Sprintf("%02X%02X%02X%02X", l.dead.V4.As4()[0], l.dead.V4.As4()[1], l.dead.V4.As4()[2], l.dead.V4.As4()[3])
	for _, line := range strings.Split(vm.Sh(t, "cat", "/proc/net/ip_vs_conn"), "\n") {
		f := strings.Fields(line)
		if len(f) > 7 && f[0] == "UDP" && f[2] == port {
			out = append(out, line)
			pinned = pinned || f[5] == dead
		}
	}
	return pinned, out
}

// TestVMUDPAffinityRemedies measures, on the real kernel, which remedy
// frees a UDP client pinned by IPVS to a dead backend. Each case is the
// same fault (one backend dead, the client keeps its socket) and one
// candidate; "want" matches the answers to the client's next three queries
// ("live", "dead", "-" for none). With nf_conntrack in use the packet that
// expires the entry is dropped when the old conntrack entry is still
// confirmed (ip_vs_conn_uses_old_conntrack), which we saw in some runs
// and not in others. The results
// are recorded in ClearIPVSUDPAffinity's doc (ipvsudpaffinity.go) and
// examples/RUNBOOK.md.
func TestVMUDPAffinityRemedies(t *testing.T) {
	cases := []struct {
		name             string
		persistent, ct   bool
		remedy           func(t *testing.T, l *affinityLab)
		want             string
		stillPinnedEntry bool
	}{
		{name: "nothing (real server still programmed)", remedy: func(*testing.T, *affinityLab) {},
			want: "- - -", stillPinnedEntry: true},
		{name: "real server deleted, expire_nodest_conn=0", remedy: func(t *testing.T, l *affinityLab) { l.deleteRS(t) },
			want: "- - -", stillPinnedEntry: true},
		{name: "conntrack -F (ct in use, real server deleted)", ct: true, remedy: func(t *testing.T, l *affinityLab) {
			l.deleteRS(t)
			vm.Sh(t, "conntrack", "-F")
		}, want: "- - -", stillPinnedEntry: true},
		{name: "expire_nodest_conn=1, real server still programmed", remedy: func(t *testing.T, l *affinityLab) {
			vm.WriteSysctl(t, "net/ipv4/vs/expire_nodest_conn", "1")
		}, want: "- - -", stillPinnedEntry: true},
		{name: "weight 0 + expire_quiescent_template=1", remedy: func(t *testing.T, l *affinityLab) {
			vm.WriteSysctl(t, "net/ipv4/vs/expire_quiescent_template", "1")
			vm.Sh(t, "ipvsadm", "-e", "-u", l.vip.String(), "-r", l.deadRS(), "-m", "-w", "0")
		}, want: "- - -", stillPinnedEntry: true},
		{name: "weight 0 + expire_quiescent_template=1, persistent service", persistent: true, remedy: func(t *testing.T, l *affinityLab) {
			vm.WriteSysctl(t, "net/ipv4/vs/expire_quiescent_template", "1")
			vm.Sh(t, "ipvsadm", "-e", "-u", l.vip.String(), "-r", l.deadRS(), "-m", "-w", "0")
		}, want: "- - -", stillPinnedEntry: true},
		{name: "UDP timeout 2s while the client keeps asking", remedy: func(t *testing.T, l *affinityLab) {
			l.deleteRS(t)
			vm.Sh(t, "ipvsadm", "--set", "900", "120", "2")
		}, want: "- - -", stillPinnedEntry: true},
		{name: "real server deleted + expire_nodest_conn=1", remedy: func(t *testing.T, l *affinityLab) {
			l.deleteRS(t)
			vm.WriteSysctl(t, "net/ipv4/vs/expire_nodest_conn", "1")
		}, want: "live live live"},
		{name: "real server deleted + expire_nodest_conn=1, ct in use", ct: true, remedy: func(t *testing.T, l *affinityLab) {
			l.deleteRS(t)
			vm.WriteSysctl(t, "net/ipv4/vs/expire_nodest_conn", "1")
		}, want: "(-|live) live live"},
		{name: "real server deleted + expire_nodest_conn=1, persistent service", persistent: true, remedy: func(t *testing.T, l *affinityLab) {
			l.deleteRS(t)
			vm.WriteSysctl(t, "net/ipv4/vs/expire_nodest_conn", "1")
		}, want: "live live live"},
	}
	var table []string
	for _, c := range cases {
		t.Run(strings.ReplaceAll(c.name, " ", "_"), func(t *testing.T) {
			l := newAffinityLab(t, c.persistent, c.ct)
			l.kill()
			if got := strings.Join(l.queries(t, 1), " "); got != "-" {
				t.Fatalf("dead backend killed, before any remedy: %s answered", got)
			}
			c.remedy(t, l)
			got := strings.Join(l.queries(t, 3), " ")
			stillDead, entries := l.pinnedToDead(t)
			table = append(table, fmt.Sprintf("| %s | %s | %v |", c.name, got, stillDead))
			if !regexp.MustCompile("^"+c.want+"$").MatchString(got) || stillDead != c.stillPinnedEntry {
				t.Errorf("next queries answered by %q (want %q); entry on the dead backend %v (want %v); entries %v\n%s",
					got, c.want, stillDead, c.stillPinnedEntry, entries, vm.Sh(t, "ipvsadm", "-Lnc"))
			}
		})
	}
	t.Logf("measured (answers to the next 3 queries, '-' = none; entry still on the dead backend):\n%s", strings.Join(table, "\n"))
}

// TestVMClearIPVSUDPAffinity is the remedy end to end on the real kernel,
// set up as kube-proxy's IPVS mode runs (nf_conntrack in use): a client
// pinned to a backend that dies and leaves the endpoints while kube-proxy
// misses the update; IPVSUDPDeadBackend (real adapter, real connection
// table) finds it, ClearIPVSUDPAffinity deletes the real server and sets
// expire_nodest_conn, and the client's next packets reach the live backend
// with no new socket. Afterwards the detector finds nothing.
func TestVMClearIPVSUDPAffinity(t *testing.T) {
	l := newAffinityLab(t, false, true)
	n, view := vmActNode(t, l.dead.V4.String(), l.live.V4.String())
	ctx := vmCtx(t)
	l.kill()
	setDNS(view, l.live.V4.String())
	if got := strings.Join(l.queries(t, 2), " "); got != "- -" {
		t.Fatalf("pinned client before the remedy: %s", got)
	}

	typ, _ := detect.Lookup("IPVSUDPDeadBackend")
	d, err := typ.New(typ.NewParams(), n)
	if err != nil {
		t.Fatal(err)
	}
	fs, err := d.Detect(ctx)
	if err != nil {
		t.Fatal(err)
	}
	target := detect.DeadBackendTarget("UDP", netip.AddrPortFrom(l.dead.V4, 5353))
	if len(fs) != 1 || fs[0].Target != target {
		t.Fatalf("findings %+v, want %s", fs, target)
	}

	a := newIPVSAction(t, ClearIPVSUDPAffinityName, n, nil)
	p, err := a.Plan(ctx, fs[0])
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("plan: %s", p.Summary)
	if !ipvsadmHas(t, l.deadRS()) || vm.ReadSysctl(t, "net/ipv4/vs/expire_nodest_conn") != "0" {
		t.Fatal("Plan changed the kernel")
	}
	res, err := a.Execute(ctx, fs[0])
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("result: %s %v", res.Summary, res.Details)
	if ipvsadmHas(t, l.deadRS()) || vm.ReadSysctl(t, "net/ipv4/vs/expire_nodest_conn") != "1" {
		t.Fatalf("after Execute:\n%s", vm.Sh(t, "ipvsadm", "-Ln"))
	}
	// The same socket: the first packet expires the entry (and may be
	// dropped, as nf_conntrack is in use), the next ones reach the live
	// backend.
	if got := strings.Join(l.queries(t, 3), " "); !regexp.MustCompile("^(-|live) live live$").MatchString(got) {
		t.Fatalf("client after the remedy: %s\n%s", got, vm.Sh(t, "ipvsadm", "-Lnc"))
	}
	if pinned, entries := l.pinnedToDead(t); pinned {
		t.Fatalf("still pinned: %v", entries)
	}
	fs, err = d.Detect(ctx)
	if err != nil || len(fs) != 0 {
		t.Fatalf("after the remedy: %+v, %v", fs, err)
	}
	_, err = a.Execute(ctx, withRefs(finding.Finding{Target: target, Evidence: map[string]any{"backendIP": l.dead.V4.String(), "backendPort": 5353, "protocol": "UDP"}}))
	wantSkip(t, err, "any more")
}
