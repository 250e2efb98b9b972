package remediate

import (
	"fmt"
	"reflect"
	"strings"
	"testing"

	"github.com/remediate-dev/remediate/detect"
)

// TestOrderTargets: the issue-13 case. Two warning-level processes with
// lower PIDs came first and took the rule's rate limit; the critical
// restore waiting on the lock must come first, and among equals the holder
// before the waiter before the rest, then the oldest.
func TestOrderTargets(t *testing.T) {
	in := []detect.Finding{
		{Target: "process/100@1", Severity: detect.Warning, Evidence: map[string]any{"ageSeconds": 900.0}},
		{Target: "process/101@1", Severity: detect.Warning, Evidence: map[string]any{"ageSeconds": 800.0}},
		{Target: "process/300@1", Severity: detect.Critical, Evidence: map[string]any{"ageSeconds": 60.0, "waitsOnXtablesLock": true}},
		{Target: "process/301@1", Severity: detect.Critical, Evidence: map[string]any{"ageSeconds": 30.0, "holdsXtablesLock": true}},
		{Target: "process/302@1", Severity: detect.Critical, Evidence: map[string]any{"ageSeconds": 90.0, "waitsOnXtablesLock": true}},
		{Target: "process/303@1", Severity: detect.Critical, Evidence: map[string]any{"ageSeconds": 999.0}},
		{Target: "process/50@1", Severity: detect.Info, Evidence: map[string]any{"ageSeconds": 9999.0}},
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
	var in []detect.Finding
	for i := 0; i < 20000; i++ {
		in = append(in, detect.Finding{Target: fmt.Sprintf("t/%05d", i), Severity: detect.Warning})
	}
	got := capTargets("KubeProxyUnhealthy", orderTargets(in))
	if len(got) != maxTargetsPerDetector+1 {
		t.Fatalf("%d findings", len(got))
	}
	last := got[len(got)-1]
	if last.Target != summaryTarget || last.Severity != detect.Warning || !strings.Contains(last.Message, "19900 more findings") {
		t.Errorf("summary = %+v", last)
	}
	if small := capTargets("x", in[:3]); len(small) != 3 {
		t.Errorf("small = %d", len(small))
	}
}

func TestBoundFinding(t *testing.T) {
	huge := strings.Repeat("A", 2<<20)
	f := boundFinding(detect.Finding{Target: "process/1@2", Message: "iptables-restore " + huge,
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
