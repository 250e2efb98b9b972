//go:build linux

package action

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	clocktesting "k8s.io/utils/clock/testing"

	"github.com/remediate-dev/remediate/detect"
	"github.com/remediate-dev/remediate/internal/conntrack"
	"github.com/remediate-dev/remediate/internal/conntrack/conntracktest"
	"github.com/remediate-dev/remediate/internal/finding"
	"github.com/remediate-dev/remediate/internal/node"
	"github.com/remediate-dev/remediate/internal/sysctl"
)

func flowKeys(flows []conntrack.Flow) []string {
	var out []string
	for _, f := range flows {
		out = append(out, fmt.Sprintf("%d %s>%s reply %s", f.Proto, f.OrigSrc, f.OrigDst, f.ReplySrc))
	}
	sort.Strings(out)
	return out
}

func nflows(n int, proto uint8, clientNet string, base uint16, vip, backend string) []conntrack.Flow {
	client := netip.AddrPortFrom(netip.MustParseAddr(clientNet), base).String()
	return conntracktest.Flows(n, conntracktest.Spec{Proto: proto, Client: client, Dst: vip, Reply: backend})
}

// End to end on the real kernel, in a namespace the test owns: the detector
// reads the namespace's utilization, FlushConntrack plans (changing
// nothing) then deletes exactly the UDP entries answered by the dead
// backend's port, and leaves TCP entries to it, entries of other backends
// and of its other ports.
func TestConntrackRealKernelDetectAndFlush(t *testing.T) {
	fd := conntracktest.NetNS(t)
	dead := nflows(20, conntrack.ProtoUDP, "10.0.0.5", 20000, "10.96.0.10:53", "10.0.1.1:53")
	tcp := nflows(3, conntrack.ProtoTCP, "10.0.0.6", 21000, "10.96.0.10:53", "10.0.1.1:53")
	other := nflows(4, conntrack.ProtoUDP, "10.0.0.7", 22000, "10.96.0.10:53", "10.0.1.2:53")
	otherPort := nflows(2, conntrack.ProtoUDP, "10.0.0.8", 23000, "10.96.0.11:5353", "10.0.1.1:5353")
	var all []conntrack.Flow
	for _, l := range [][]conntrack.Flow{dead, tcp, other, otherPort} {
		all = append(all, l...)
	}
	conntracktest.Create(t, fd, all...)

	ct := conntrack.New(conntrack.Config{NetNS: fd})
	n := &node.Node{Conntrack: ct, Clock: clocktesting.NewFakePassiveClock(time.Now())}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()

	dt, _ := detect.Lookup(detect.ConntrackExhaustionName)
	dp := dt.NewParams().(*detect.ConntrackExhaustionParams)
	dp.UtilizationThreshold, dp.CriticalUtilization = 1e-6, 1
	d, err := dt.New(dp, n)
	if err != nil {
		t.Fatal(err)
	}
	findings, err := d.Detect(ctx)
	if err != nil || len(findings) != 1 || findings[0].Evidence["count"] != uint64(len(all)) {
		t.Fatalf("detect on the namespace's table = %+v, %v; want count %d", findings, err, len(all))
	}

	at, _ := Lookup(FlushConntrackName)
	a, err := at.New(&FlushConntrackParams{MaxEntries: 1000}, n)
	if err != nil {
		t.Fatal(err)
	}
	f := withRefs(finding.Finding{Target: "endpoint/10.0.1.1:53", Evidence: map[string]any{"backendIP": "10.0.1.1", "backendPort": 53, "protocol": "UDP"}})
	p, err := a.Plan(ctx, f)
	if err != nil || !strings.Contains(p.Summary, "delete 20 ") {
		t.Fatalf("plan = %+v, %v", p, err)
	}
	if got := flowKeys(conntracktest.Table(t, fd)); fmt.Sprint(got) != fmt.Sprint(flowKeys(all)) {
		t.Fatalf("Plan changed the table")
	}
	r, err := a.Execute(ctx, f)
	if err != nil || r.Details["deleted"] != 20 {
		t.Fatalf("execute = %+v, %v", r, err)
	}
	want := flowKeys(append(append(append([]conntrack.Flow{}, tcp...), other...), otherPort...))
	if got := flowKeys(conntracktest.Table(t, fd)); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("table after flush:\n got %v\nwant %v", got, want)
	}
}

// RaiseConntrackMax through the real adapter on a temporary proc/sys root
// (nf_conntrack_max is read-only in a child namespace), then a simulated
// kube-proxy restart shows up as drift and is restored.
func TestRaiseConntrackMaxRealAdapterTempRoots(t *testing.T) {
	procRoot, sysRoot, stateDir := t.TempDir(), t.TempDir(), t.TempDir()
	if err := sysctl.WriteFixture(procRoot, conntrack.MaxKey, "131072"); err != nil {
		t.Fatal(err)
	}
	hp := filepath.Join(sysRoot, conntrack.HashSizePath)
	if err := os.MkdirAll(filepath.Dir(hp), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(hp, []byte("32768\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	ct := conntrack.New(conntrack.Config{ProcRoot: procRoot, SysRoot: sysRoot, StateDir: stateDir})
	n := &node.Node{Conntrack: ct, ProcRoot: procRoot}
	ctx := context.Background()
	a := newRaiseWith(t, n, 16<<30)
	r, err := a.Execute(ctx, tableFinding(131072))
	if err != nil {
		t.Fatal(err)
	}
	if v, _ := sysctl.ReadUintFile(filepath.Join(procRoot, "sys/net/netfilter/nf_conntrack_max")); v != 262144 {
		t.Fatalf("nf_conntrack_max file = %d (%s)", v, r.Summary)
	}
	if v, _ := sysctl.ReadUintFile(hp); v != 65536 {
		t.Fatalf("hashsize file = %d", v)
	}
	rec, ok, err := ct.LastSetMax(ctx)
	if err != nil || !ok || rec.Max != 262144 || rec.HashSize != 65536 {
		t.Fatalf("record = %+v %v %v", rec, ok, err)
	}
	// kube-proxy restarts and writes its own sizing.
	if err := sysctl.WriteFixture(procRoot, conntrack.MaxKey, "131072"); err != nil {
		t.Fatal(err)
	}
	if v, _ := ct.Max(ctx); v != 131072 {
		t.Fatal("fixture not rewritten")
	}
	// The detector sees the drift (its count comes from netlink in the
	// test's own namespace, the max from the temporary proc root).
	if os.Geteuid() == 0 && conntrack.Available("/proc") == nil {
		n.Clock = clocktesting.NewFakePassiveClock(time.Now())
		dt, _ := detect.Lookup(detect.ConntrackExhaustionName)
		d, err := dt.New(dt.NewParams(), n)
		if err != nil {
			t.Fatal(err)
		}
		fs, err := d.Detect(ctx)
		if err != nil {
			t.Fatal(err)
		}
		var found bool
		for _, f := range fs {
			found = found || f.Target == detect.ConntrackDriftTarget && f.Evidence["lastSetMax"] == uint64(262144) && f.Evidence["max"] == uint64(131072)
		}
		if !found {
			t.Fatalf("no drift finding in %+v", fs)
		}
	}
	drift := withRefs(finding.Finding{Target: detect.ConntrackDriftTarget, Evidence: map[string]any{"max": uint64(131072), "lastSetMax": rec.Max}})
	if _, err := a.Execute(ctx, drift); err != nil {
		t.Fatal(err)
	}
	if v, _ := ct.Max(ctx); v != 262144 {
		t.Fatalf("after restore nf_conntrack_max = %d", v)
	}
}

func newRaiseWith(t *testing.T, n *node.Node, mem uint64) Action {
	t.Helper()
	typ, _ := Lookup(RaiseConntrackMaxName)
	a, err := typ.New(typ.NewParams(), n)
	if err != nil {
		t.Fatal(err)
	}
	a.(*raiseConntrackMax).memTotal = func(context.Context) (uint64, error) { return mem, nil }
	return a
}
