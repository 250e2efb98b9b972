package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

const ipvsE2EPolicy = `apiVersion: remediate.dev/v1alpha1
kind: RemediationPolicy
mode: enforce
rules:
- name: ipvs-stale-real-server
  detector: {type: IPVSStaleRealServer, requireIPVSMode: false}
  action: {type: DeleteIPVSRealServer}
- name: ipvs-stale-virtual-server
  detector: {type: IPVSStaleVirtualServer}
  action: {type: DeleteIPVSVirtualServer}
- name: ipvs-missing-virtual-server
  detector: {type: IPVSMissingVirtualServer}
- name: ipvs-udp-dead-backend
  detector: {type: IPVSUDPDeadBackend}
- name: ipvs-udp-timeout
  detector: {type: IPVSUDPTimeoutHigh, requireIPVSMode: false}
  action: {type: SetIPVSTimeouts, udpTimeout: 30s}
`

// `remediate --once -o json` in enforce mode with the real IPVS adapter on
// this kernel, which has no ip_vs: every IPVS rule is skipped with
// "IPVS unavailable: ...", nothing is found and nothing claims to have acted.
func TestOnceIPVSUnavailableEndToEnd(t *testing.T) {
	if _, err := os.Stat("/proc/net/ip_vs"); err == nil {
		t.Skip("ip_vs is loaded here: this test covers kernels without it (and must not change a real IPVS table)")
	}
	dir := t.TempDir()
	pol := filepath.Join(dir, "policy.yaml")
	if err := os.WriteFile(pol, []byte(ipvsE2EPolicy), 0o644); err != nil {
		t.Fatal(err)
	}
	code, out, errOut := run(t, "--once", "--sample", "0", "-o", "json", "--policy", pol, "--state-dir", filepath.Join(dir, "state"), "--node-name", "n1")
	if code != 0 {
		t.Fatalf("exit %d, want 0 (no findings)\n%s\n%s", code, out, errOut)
	}
	var rep struct {
		Findings  []json.RawMessage `json:"findings"`
		Decisions []json.RawMessage `json:"decisions"`
		Skipped   []struct {
			Rule   string `json:"rule"`
			Reason string `json:"reason"`
		} `json:"skipped"`
	}
	if err := json.Unmarshal([]byte(out), &rep); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	if len(rep.Findings) != 0 || len(rep.Decisions) != 0 {
		t.Fatalf("findings %s, decisions %s: want none", rep.Findings, rep.Decisions)
	}
	skipped := map[string]string{}
	for _, s := range rep.Skipped {
		skipped[s.Rule] = s.Reason
	}
	for _, rule := range []string{"ipvs-stale-real-server", "ipvs-stale-virtual-server", "ipvs-missing-virtual-server", "ipvs-udp-dead-backend", "ipvs-udp-timeout"} {
		if r := skipped[rule]; !strings.HasPrefix(r, "IPVS unavailable: ") {
			t.Errorf("rule %s: skipped reason %q, want IPVS unavailable", rule, r)
		}
	}
}
