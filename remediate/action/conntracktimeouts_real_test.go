//go:build linux

package action_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"go.uber.org/zap/zaptest"
	"k8s.io/utils/clock"

	"github.com/remediate-dev/remediate/internal/conntrack"
	"github.com/remediate-dev/remediate/internal/conntrack/conntracktest"
	"github.com/remediate-dev/remediate/internal/netnstest"
	"github.com/remediate-dev/remediate/internal/node"
	"github.com/remediate-dev/remediate/remediate"
	"github.com/remediate-dev/remediate/remediate/journal"
)

// injectedMax reports a chosen nf_conntrack_max: on this kernel (6.18) the
// limit is global and read-only inside a child network namespace (EACCES),
// so a test cannot fill a namespace's table to a limit of its own. The
// count, the dump and the timeouts are the namespace's, for real.
type injectedMax struct {
	*conntrack.Real
	max uint64
}

func (m injectedMax) Usage(ctx context.Context) (conntrack.Usage, error) {
	u, err := m.Real.Usage(ctx)
	u.Max = m.max
	return u, err
}

const ctTimeoutPolicy = `apiVersion: remediate.dev/v1alpha1
kind: RemediationPolicy
mode: MODE
rules:
- name: conntrack-timeouts
  detector: {type: ConntrackExhaustion, utilizationThreshold: 0.85, reportDrift: false}
  action: {type: SetConntrackTimeouts, udpStreamTimeout: 60s, tcpTimeWaitTimeout: 60s}
  verifyAfter: 1m
`

// TestRealConntrackTimeoutsFromBreakdown: a table in a test-made namespace
// filled by replied UDP flows to one destination. Through the policy
// loader and the engine: the finding's breakdown names the destination; in
// audit mode the decision is a dry-run and the namespace's
// nf_conntrack_udp_timeout_stream is unchanged; in enforce mode it is
// lowered (read back from inside the namespace), TIME_WAIT (not dominant)
// and the host's values are untouched, and the journal's intent carries
// the command that restores the previous value, which works.
func TestRealConntrackTimeoutsFromBreakdown(t *testing.T) {
	ns := netnstest.New(t)
	need := conntrack.Available("/proc")
	if _, err := exec.LookPath("sysctl"); need == nil && err != nil {
		need = fmt.Errorf("needs sysctl (procps): %w", err)
	}
	if need != nil {
		if os.Getenv("REMEDIATE_E2E_REQUIRED") != "" {
			t.Fatalf("REMEDIATE_E2E_REQUIRED is set but: %v", need)
		}
		t.Skip(need)
	}
	nsf, err := os.Open(filepath.Join("/run/netns", ns))
	if err != nil {
		t.Fatal(err)
	}
	defer nsf.Close()
	fd := int(nsf.Fd())
	readNS := func(key string) string {
		t.Helper()
		return strings.TrimSpace(netnstest.Run(t, ns, "", "cat", "/proc/sys/net/netfilter/"+key))
	}
	hostBefore, err := os.ReadFile("/proc/sys/net/netfilter/nf_conntrack_udp_timeout_stream")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { // a broken adapter must not leave the host changed
		if now, err := os.ReadFile("/proc/sys/net/netfilter/nf_conntrack_udp_timeout_stream"); err == nil && string(now) != string(hostBefore) {
			_ = os.WriteFile("/proc/sys/net/netfilter/nf_conntrack_udp_timeout_stream", hostBefore, 0)
		}
	})
	before, beforeTW := readNS("nf_conntrack_udp_timeout_stream"), readNS("nf_conntrack_tcp_timeout_time_wait")
	if before == "60" {
		t.Fatal("the namespace starts at 60 s: the test could not tell a change")
	}

	type S = conntracktest.Spec
	conntracktest.Create(t, fd, conntracktest.Flows(2000, S{Proto: conntrack.ProtoUDP, Client: "10.1.0.1:20000", Dst: "10.96.0.10:53",
		Reply: "10.244.1.5:53", Status: conntrack.StatusSeenReply})...)
	conntracktest.Create(t, fd, conntracktest.Flows(150, S{Proto: conntrack.ProtoTCP, Client: "10.2.0.1:20000", Dst: "10.96.0.1:443",
		Reply: "10.244.1.6:6443", Status: conntrack.StatusSeenReply | conntrack.StatusAssured, TCPState: conntrack.TCPStateEstablished})...)
	conntracktest.Create(t, fd, conntracktest.Flows(100, S{Proto: conntrack.ProtoUDP, Client: "10.3.0.1:20000", Dst: "10.96.0.20:514",
		Reply: "10.244.1.7:514"})...)

	ct := injectedMax{Real: conntrack.New(conntrack.Config{NetNS: fd}), max: 2400} // 2250/2400 = 94%
	n := &node.Node{Name: "test", ProcRoot: "/proc", Clock: clock.RealClock{}, Log: zaptest.NewLogger(t), Conntrack: ct}
	dir := t.TempDir()
	run := func(mode string) (*remediate.Report, []journal.Record) {
		t.Helper()
		return onceCycle(t, n, strings.Replace(ctTimeoutPolicy, "MODE", mode, 1), filepath.Join(dir, "state-"+mode))
	}
	check := func(mode string, rep *remediate.Report, want remediate.Outcome) {
		t.Helper()
		if len(rep.Findings) != 1 || !strings.Contains(rep.Findings[0].Message, "filled by udp/stream 89%") ||
			!strings.Contains(rep.Findings[0].Message, "top destination udp/10.96.0.10:53 (2000 entries") {
			t.Fatalf("%s: findings %+v", mode, rep.Findings)
		}
		comp, ok, err := conntrack.DecodeComposition(rep.Findings[0].Evidence)
		if err != nil || !ok || comp.Total != 2250 || comp.Count(conntrack.ClassUDPStream) != 2000 || comp.TopDestinations[0].Endpoint.String() != "udp/10.96.0.10:53" {
			t.Fatalf("%s: breakdown %+v (%v)", mode, comp, err)
		}
		if len(rep.Decisions) != 1 || rep.Decisions[0].Outcome != want ||
			!strings.Contains(rep.Decisions[0].Reason, "nf_conntrack_udp_timeout_stream") {
			t.Fatalf("%s: decisions %+v", mode, rep.Decisions)
		}
	}
	restore := "sysctl -w net.netfilter.nf_conntrack_udp_timeout_stream=" + before
	journaled := func(recs []journal.Record, kind string) bool {
		for _, r := range recs {
			if r.Kind == kind && r.Details["restoreCommand"] == restore {
				return true
			}
		}
		return false
	}

	rep, recs := run("audit")
	check("audit", rep, remediate.OutcomeDryRun)
	if got := readNS("nf_conntrack_udp_timeout_stream"); got != before {
		t.Fatalf("audit mode changed udp_timeout_stream %s -> %s", before, got)
	}
	if !journaled(recs, journal.KindDryRun) {
		t.Errorf("audit: no dry-run record with %q: %+v", restore, recs)
	}

	rep, recs = run("enforce")
	check("enforce", rep, remediate.OutcomeExecuted)
	if got := readNS("nf_conntrack_udp_timeout_stream"); got != "60" {
		t.Errorf("enforce: udp_timeout_stream %s, want 60", got)
	}
	if got := readNS("nf_conntrack_tcp_timeout_time_wait"); got != beforeTW {
		t.Errorf("enforce: TIME_WAIT (1%% of the table) changed %s -> %s", beforeTW, got)
	}
	if hostAfter, _ := os.ReadFile("/proc/sys/net/netfilter/nf_conntrack_udp_timeout_stream"); string(hostAfter) != string(hostBefore) {
		t.Errorf("the host's udp_timeout_stream changed %q -> %q", hostBefore, hostAfter)
	}
	if !journaled(recs, journal.KindIntent) || !journaled(recs, journal.KindOutcome) {
		t.Errorf("enforce: intent/outcome without %q: %+v", restore, recs)
	}
	// The journaled command undoes it.
	if out, err := exec.Command("ip", append([]string{"netns", "exec", ns}, strings.Fields(restore)...)...).CombinedOutput(); err != nil {
		t.Fatalf("%s: %v: %s", restore, err, out)
	}
	if got := readNS("nf_conntrack_udp_timeout_stream"); got != before {
		t.Errorf("after the restore command: %s, want %s", got, before)
	}
}
