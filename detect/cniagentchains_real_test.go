package detect

import (
	"context"
	"github.com/remediate-dev/remediate/internal/finding"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/remediate-dev/remediate/internal/cnichains"
	"github.com/remediate-dev/remediate/internal/iptables"
	"github.com/remediate-dev/remediate/internal/netnstest"
	"github.com/remediate-dev/remediate/internal/procs"
)

// TestRealCNIAgentChains loads each agent's rules (testdata/cniagents,
// written from the agents' sources) into the real kernel of a test
// namespace and runs the detector with the real save commands, a process
// of the agent's name and the memory in a real state directory:
//
//   - healthy: ok;
//   - iptables -F (every table): a finding naming every hook, from the
//     save alone;
//   - then -X: a finding from the memory only (nothing of the agent is
//     left in the save);
//   - a new detector on the same state directory (the daemon restarted):
//     still the finding;
//   - the agent's rules back (it rewrote them on restart): ok;
//   - the agent's process gone: skipped, nothing reported.
func TestRealCNIAgentChains(t *testing.T) {
	netnstest.NeedCommands(t, "iptables-legacy-restore", "iptables-legacy-save", "iptables-legacy")
	t.Setenv("XTABLES_LOCKFILE", filepath.Join(t.TempDir(), "xtables.lock"))
	for _, a := range cnichains.Known() {
		t.Run(a.Name, func(t *testing.T) {
			ns := netnstest.New(t)
			rules, err := os.ReadFile(filepath.Join("testdata", "cniagents", a.Name+".rules"))
			if err != nil {
				t.Fatal(err)
			}
			p := procs.NewFake(1)
			n, clk := newIssue3Node(p)
			agent := fakeProc(4242, 1, a.Processes[0], procT0.Add(-time.Hour), "S", a.Processes[0], "--some-flag")
			p.Add(agent)
			n.IPTables = iptables.New(iptables.Config{Prefix: netnstest.Prefix(ns), Timeout: 20 * time.Second})
			state := t.TempDir()
			n.CNIChains = &cnichains.FileStore{Dir: state}
			build := func() Detector {
				return newIssue3Detector(t, "CNIAgentChains", n, func(p any) {
					pp := p.(*CNIAgentChainsParams)
					pp.Families, pp.Backends = []string{"IPv4"}, []string{"legacy"}
				})
			}
			d := build()
			ctx := context.Background()
			run := func(step string) []finding.Finding {
				t.Helper()
				clk.Step(time.Minute)
				got, err := d.Detect(ctx)
				if err != nil {
					t.Fatalf("%s: %v", step, err)
				}
				for _, f := range got {
					t.Logf("%s: %s: %s", step, f.Target, f.Message)
				}
				return got
			}
			wantFinding := func(step string, got []finding.Finding, kinds ...string) {
				t.Helper()
				if len(got) != 1 || got[0].Target != agent.Target() || got[0].Detector != "CNIAgentChains" || got[0].Severity != finding.Critical {
					t.Fatalf("%s: %+v, want one critical finding on %s", step, got, agent.Target())
				}
				defects := got[0].Evidence["defects"].([]map[string]any)
				seen := map[string]int{}
				for _, df := range defects {
					seen[df["kind"].(string)]++
				}
				for _, k := range kinds {
					if seen[k] == 0 {
						t.Errorf("%s: no %s defect in %v", step, k, defects)
					}
				}
				if seen[cnichains.HookMissing] != len(a.Hooks) {
					t.Errorf("%s: %d hooks missing, want all %d: %v", step, seen[cnichains.HookMissing], len(a.Hooks), defects)
				}
			}

			netnstest.Run(t, ns, string(rules), "iptables-legacy-restore", "-w", "5")
			if got := run("healthy"); len(got) != 0 {
				t.Fatalf("healthy: %+v", got)
			}
			if j := d.(Judged).Judged(); !strings.Contains(j, "chains and hooks of "+a.Name+" in place") {
				t.Errorf("judged %q", j)
			}

			tables := []string{"raw", "mangle", "nat", "filter"}
			for _, tb := range tables {
				netnstest.Run(t, ns, "", "iptables-legacy", "-w", "5", "-t", tb, "-F")
			}
			wantFinding("flushed", run("flushed"), cnichains.HookMissing, cnichains.ChainEmptied)

			for _, tb := range tables {
				netnstest.Run(t, ns, "", "iptables-legacy", "-w", "5", "-t", tb, "-X")
			}
			got := run("deleted")
			wantFinding("deleted", got, cnichains.ChainMissing)
			if !strings.Contains(got[0].Message, "is gone") {
				t.Errorf("deleted: message %q", got[0].Message)
			}

			d = build() // the daemon restarted: the memory is read back
			wantFinding("restarted", run("restarted"), cnichains.ChainMissing)

			netnstest.Run(t, ns, string(rules), "iptables-legacy-restore", "-w", "5")
			if got := run("rewritten"); len(got) != 0 {
				t.Fatalf("rewritten by the agent: %+v", got)
			}

			p.Remove(agent.Pid)
			clk.Step(time.Minute)
			if _, err := d.Detect(ctx); err == nil {
				t.Fatal("agent gone: no skip")
			} else if why, ok := finding.IsSkip(err); !ok || !strings.Contains(why, a.Processes[0]) {
				t.Fatalf("agent gone: %v", err)
			}
		})
	}
}
