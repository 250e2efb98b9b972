package main

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/remediate-dev/remediate/internal/cnichains"
	"github.com/remediate-dev/remediate/internal/netnstest"
)

const e2eCNIChainsPolicy = `apiVersion: remediate.dev/v1alpha1
kind: RemediationPolicy
mode: %MODE%
detectorTimeout: 15s
rules:
- name: cni-agent-chains
  detector: {type: CNIAgentChains, families: [IPv4], backends: [legacy]}
  action: {type: RestartNodeAgent, readyTimeout: 10s}
  maxAttempts: 1
`

// TestOnceEndToEndCNIAgentChains runs the binary (`--once -o json`) in a
// test network namespace and a PID namespace of its own, with Flannel's
// rules (detect/testdata/cniagents/flannel.rules) loaded in the kernel
// and a real process named flanneld (a copy of sleep) in that network
// namespace, on one state directory:
//
//  1. healthy: the check is ok and the chains are remembered in the
//     state directory (cni-agent-chains.json);
//  2. nat and filter flushed and their chains deleted (-F, -X): a new
//     process of remediate, from the memory alone, reports the finding on
//     flanneld's process; audit plans RestartNodeAgent as a dry run;
//  3. enforce, with no cluster access: RestartNodeAgent is skipped saying
//     why (it never kills the process itself), flanneld still runs.
func TestOnceEndToEndCNIAgentChains(t *testing.T) {
	ns := netnstest.New(t)
	netnstest.NeedCommands(t, "iptables-legacy-restore", "iptables-legacy-save", "iptables-legacy", "unshare", "sleep")
	dir := t.TempDir()
	t.Setenv("XTABLES_LOCKFILE", filepath.Join(dir, "xtables.lock"))
	rules, err := os.ReadFile("../../detect/testdata/cniagents/flannel.rules")
	if err != nil {
		t.Fatal(err)
	}
	netnstest.Run(t, ns, string(rules), "iptables-legacy-restore", "-w", "5")

	sleep, err := exec.LookPath("sleep")
	if err != nil {
		t.Fatal(err)
	}
	if err := copyExecutable(sleep, filepath.Join(dir, "flanneld")); err != nil {
		t.Fatal(err)
	}
	for _, mode := range []string{"audit", "enforce"} {
		if err := os.WriteFile(filepath.Join(dir, mode+".yaml"), []byte(strings.Replace(e2eCNIChainsPolicy, "%MODE%", mode, 1)), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	script := `set -u
ip netns exec "$NS" "$DIR/flanneld" 300 &
F=$!
echo $F > "$DIR/flanneld.pid"
n=0; while [ "$(basename "$(readlink /proc/$F/exe)")" != flanneld ] && [ $n -lt 100 ]; do n=$((n+1)); sleep 0.05; done
once() {
  ip netns exec "$NS" "$BIN" --once -o json --proc-root /proc --xtables-lock "$DIR/xtables.lock" \
    --policy "$DIR/$1.yaml" --state-dir "$DIR/state" --node-name node1 > "$DIR/$2.json" 2> "$DIR/$2.err"
  echo $? > "$DIR/$2.rc"
}
once audit healthy
cp "$DIR/state/` + cnichains.File + `" "$DIR/memory.json" 2>/dev/null
for t in nat filter; do ip netns exec "$NS" iptables-legacy -w 5 -t $t -F; ip netns exec "$NS" iptables-legacy -w 5 -t $t -X; done
once audit deleted
once enforce enforce
if [ -d /proc/$F ]; then echo alive; else echo gone; fi > "$DIR/after-enforce"
`
	run := runInPIDNamespace(t, dir, script, "NS="+ns)
	read, report := run.read, run.report
	flanneld, _ := strconv.Atoi(read("flanneld.pid"))

	rep := report("healthy")
	if len(rep.Findings) != 0 || len(rep.OK) != 1 || !strings.Contains(rep.OK[0].Judged, "chains and hooks of flannel in place") {
		t.Fatalf("healthy: findings %+v, ok %+v", rep.Findings, rep.OK)
	}
	var mem cnichains.Memory
	if err := json.Unmarshal([]byte(read("memory.json")), &mem); err != nil {
		t.Fatalf("memory: %v", err)
	}
	if s := mem.Get("flannel", "IPv4/legacy"); s.Chains["nat/FLANNEL-POSTRTG"].Rules != 6 || s.Chains["filter/FLANNEL-FWD"].Rules != 2 || len(s.Hooks) != 2 {
		t.Fatalf("remembered %+v", s)
	}

	var target string
	for _, step := range []string{"deleted", "enforce"} {
		rep = report(step)
		if rc := read(step + ".rc"); rc != "2" {
			t.Errorf("%s: exit %s, want 2 (findings)", step, rc)
		}
		if len(rep.Findings) != 1 || rep.Findings[0].Detector != "CNIAgentChains" || rep.Findings[0].Severity != "critical" ||
			int(rep.Findings[0].Evidence["pid"].(float64)) != flanneld {
			t.Fatalf("%s: findings %+v, want one on flanneld pid %d", step, rep.Findings, flanneld)
		}
		f := rep.Findings[0]
		target = f.Target
		for _, want := range []string{"nat chain FLANNEL-POSTRTG is gone (had 6 rules", "filter FORWARD does not jump to FLANNEL-FWD"} {
			if !strings.Contains(f.Message, want) {
				t.Errorf("%s: message lacks %q: %s", step, want, f.Message)
			}
		}
		if len(rep.Decisions) != 1 || rep.Decisions[0].Target != target || rep.Decisions[0].Action != "RestartNodeAgent" {
			t.Fatalf("%s: decisions %+v", step, rep.Decisions)
		}
	}
	rep = report("deleted")
	if d := rep.Decisions[0]; d.Outcome != "dry-run" && d.Outcome != "skipped" {
		t.Errorf("audit: decision %+v, want a dry run (or skipped, no cluster)", d)
	}
	rep = report("enforce")
	if d := rep.Decisions[0]; d.Outcome != "skipped" || !strings.Contains(d.Reason, "no cluster access") {
		t.Errorf("enforce without cluster access: decision %+v, want skipped for no cluster access", d)
	}
	if got := read("after-enforce"); got != "alive" {
		t.Errorf("flanneld after enforce: %s, want alive (only its pod may be restarted)", got)
	}
	if !strings.HasPrefix(target, "process/"+strconv.Itoa(flanneld)+"@") {
		t.Errorf("target %q is not flanneld's process", target)
	}
}
