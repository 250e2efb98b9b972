package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestPolicyCheckRefusesPairsThatCannotWork: the rules issue 9 found
// passing the check but failing or skipping only at run time are refused,
// each at its action type's file:line:col, naming the detectors that can
// feed the action; the working pairs of the examples still pass.
func TestPolicyCheckRefusesPairsThatCannotWork(t *testing.T) {
	pairs := []struct{ det, act, feeders string }{
		{"ConntrackExhaustion", "DeleteIPVSRealServer", "IPVSStaleRealServer"},
		{"IPVSUDPDeadBackend", "DeleteIPVSVirtualServer", "IPVSStaleVirtualServer"},
		{"ConntrackExhaustion", "KillProcess", "HungIPTablesRestore, HungNFT, XtablesLockContention"},
		{"KubeProxySyncStale", "FlushConntrack", "ConntrackStaleServiceEntries, IPVSStaleRealServer, IPVSUDPDeadBackend"},
		{"HungIPTablesRestore", "SetIPVSTimeouts", "IPVSUDPTimeoutHigh"},
	}
	var b strings.Builder
	b.WriteString("apiVersion: remediate.dev/v1alpha1\nkind: RemediationPolicy\nrules:\n")
	for i, p := range pairs {
		fmt.Fprintf(&b, "- name: r%d\n  detector: {type: %s}\n  action: {type: %s}\n", i, p.det, p.act)
	}
	f := filepath.Join(t.TempDir(), "pairs.yaml")
	if err := os.WriteFile(f, []byte(b.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	code, out, errOut := run(t, "policy", "check", f)
	if code != exitError {
		t.Fatalf("check accepted impossible pairs: %d\n%s%s", code, out, errOut)
	}
	for i, p := range pairs {
		want := fmt.Sprintf("pairs.yaml:%d:18: rules[%d].action.type: detector %s cannot feed action %s", 6+3*i, i, p.det, p.act)
		if !strings.Contains(errOut, want) {
			t.Errorf("check output lacks %q:\n%s", want, errOut)
		}
		if !strings.Contains(errOut, "detectors that can: "+p.feeders+")") {
			t.Errorf("check output does not name %s as the feeders of %s:\n%s", p.feeders, p.act, errOut)
		}
	}
	if n := strings.Count(errOut, "cannot feed"); n != len(pairs) {
		t.Errorf("%d refusals, want %d:\n%s", n, len(pairs), errOut)
	}
}

func TestPolicyTypesShowsPairs(t *testing.T) {
	code, out, _ := run(t, "policy", "types")
	if code != exitOK {
		t.Fatalf("types: %d", code)
	}
	for _, want := range []string{
		"PAIRS", "KillProcess                      <- HungIPTablesRestore, HungNFT, XtablesLockContention",
		"FlushConntrack                   <- ConntrackStaleServiceEntries, IPVSStaleRealServer, IPVSUDPDeadBackend", "reports: process", "acts on: conntrack-table",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("types output lacks %q:\n%s", want, out)
		}
	}
}
