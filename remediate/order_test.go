package remediate

import (
	"fmt"
	"reflect"
	"strings"
	"testing"

	"github.com/remediate-dev/remediate/internal/finding"
)

// TestOrderTargets: the issue-13 case. Two warning-level processes with
// lower PIDs came first and took the rule's rate limit; the critical
// restore waiting on the lock must come first, and among equals the holder
// before the waiter before the rest, then the oldest.
func TestOrderTargets(t *testing.T) {
	proc := func(age float64, holds, waits bool) finding.Subject {
		return finding.Subject{Kind: finding.KindProcess, AgeSeconds: age, Process: &finding.Process{HoldsXtablesLock: holds, WaitsOnXtablesLock: waits}}
	}
	in := []finding.Finding{
		{Target: "process/100@1", Severity: finding.Warning, Subject: proc(900, false, false)},
		{Target: "process/101@1", Severity: finding.Warning, Subject: proc(800, false, false)},
		{Target: "process/300@1", Severity: finding.Critical, Subject: proc(60, false, true)},
		{Target: "process/301@1", Severity: finding.Critical, Subject: proc(30, true, false)},
		{Target: "process/302@1", Severity: finding.Critical, Subject: proc(90, false, true)},
		{Target: "process/303@1", Severity: finding.Critical, Subject: proc(999, false, false)},
		{Target: "process/50@1", Severity: finding.Info, Subject: finding.Subject{AgeSeconds: 9999}},
	}
	var got []string
	for _, f := range orderTargets(in) {
		got = append(got, f.Target)
	}
	want := []string{"process/301@1", "process/302@1", "process/300@1", "process/303@1", "process/100@1", "process/101@1", "process/50@1"}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("order = %v\nwant    %v", got, want)
	}
	if in[0].Target != "process/100@1" {
		t.Error("input reordered")
	}
}

func TestCapTargets(t *testing.T) {
	var in []finding.Finding
	for i := 0; i < 20000; i++ {
		in = append(in, finding.Finding{Target: fmt.Sprintf("t/%05d", i), Severity: finding.Warning})
	}
	got := capTargets("KubeProxyUnhealthy", orderTargets(in))
	if len(got) != maxTargetsPerDetector+1 {
		t.Fatalf("%d findings", len(got))
	}
	last := got[len(got)-1]
	if last.Target != summaryTarget || last.Severity != finding.Warning || !strings.Contains(last.Message, "19900 more findings") {
		t.Errorf("summary = %+v", last)
	}
	if small := capTargets("x", in[:3]); len(small) != 3 {
		t.Errorf("small = %d", len(small))
	}
}

func TestBoundFinding(t *testing.T) {
	huge := strings.Repeat("A", 2<<20)
	f := boundFinding(finding.Finding{Target: "process/1@2", Message: "iptables-restore " + huge,
		Evidence: map[string]any{"cmdline": huge, "pid": int32(7), "holdSeconds": 31.0, "holdsXtablesLock": true,
			"holders": []map[string]any{{"cmdline": huge}}}})
	if len(f.Message) > 4200 || !strings.Contains(f.Message, "…[clipped ") {
		t.Errorf("message %d bytes", len(f.Message))
	}
	if s := f.Evidence["cmdline"].(string); len(s) > 4200 {
		t.Errorf("cmdline %d bytes", len(s))
	}
	hs := f.Evidence["holders"].([]any)
	if s := hs[0].(map[string]any)["cmdline"].(string); len(s) > 4200 {
		t.Errorf("holder cmdline %d bytes", len(s))
	}
	if f.Evidence["pid"] != int32(7) || f.Evidence["holdSeconds"] != 31.0 || f.Evidence["holdsXtablesLock"] != true {
		t.Errorf("scalars changed: %v", f.Evidence)
	}
}

// TestWithKind: the engine fills in a finding's kind from its detector
// type's one declared kind, and leaves a kind the detector set, a type of
// several kinds and the over-limit summary alone.
func TestWithKind(t *testing.T) {
	one := []finding.Kind{finding.KindKubeProxy}
	two := []finding.Kind{finding.KindIPVSRealServer, finding.KindConntrackBackend}
	for _, tc := range []struct {
		f        finding.Finding
		declared []finding.Kind
		want     finding.Kind
	}{
		{finding.Finding{Target: "kube-proxy/IPv4"}, one, finding.KindKubeProxy},
		{finding.Finding{Target: "pod/a/b", Subject: finding.Subject{Kind: finding.KindPod}}, one, finding.KindPod},
		{finding.Finding{Target: "ipvs-rs/UDP/10.96.0.10:53/10.244.1.5:53"}, two, ""},
		{finding.Finding{Target: summaryTarget}, one, ""},
		{finding.Finding{Target: "x"}, nil, ""},
	} {
		if got := withKind(tc.f, tc.declared).Subject.Kind; got != tc.want {
			t.Errorf("withKind(%s, %v) = %q, want %q", tc.f.Target, tc.declared, got, tc.want)
		}
	}
}
