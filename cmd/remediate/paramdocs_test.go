package main

import (
	"bytes"
	"os"
	"strings"
	"testing"

	"github.com/remediate-dev/remediate/internal/paramdoc"
)

const paramDocsFile = "paramdocs_gen.go"

// TestParamDocsUpToDate regenerates the parameter docs from the detector
// and action sources; `go generate ./cmd/remediate` (or -update) rewrites
// the file when they changed.
func TestParamDocsUpToDate(t *testing.T) {
	docs, err := paramdoc.Collect("../../detect", "../../remediate/action")
	if err != nil {
		t.Fatal(err)
	}
	want, err := paramdoc.Render("main", "paramDocs", "go generate ./cmd/remediate", docs)
	if err != nil {
		t.Fatal(err)
	}
	if *update {
		if err := os.WriteFile(paramDocsFile, want, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	got, _ := os.ReadFile(paramDocsFile)
	if !bytes.Equal(got, want) {
		t.Fatalf("%s is stale: run go generate ./cmd/remediate", paramDocsFile)
	}
	if len(docs) < 20 {
		t.Fatalf("only %d parameter docs found", len(docs))
	}
}

// TestPolicyTypesExplainsParameters: every parameter of a real detector is
// listed with its default and meaning.
func TestPolicyTypesExplainsParameters(t *testing.T) {
	code, out, _ := run(t, "policy", "types")
	if code != exitOK {
		t.Fatalf("exit %d", code)
	}
	for _, want := range []string{
		"ConntrackExhaustion", "utilizationThreshold (number, default 0.8)", "UtilizationThreshold is count/max",
		"KillProcess", "gracePeriod (duration, default",
		"RestartKubeProxy", "[disruptive: needs a cluster budget slot]",
		"CLITestHung", "findings (integer, default 1)",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("policy types lacks %q", want)
		}
	}
	// The actions that declare they need the API are marked (words
	// joined again across wrapped lines), the node-local ones not.
	flat := strings.Join(strings.Fields(out), " ")
	if !strings.Contains(flat, "maxEntries per run [needs the API: blocked while the cluster view is stale]") {
		t.Error("policy types does not mark FlushConntrack (action.NeedsAPI) as needing the API")
	}
	if i := strings.Index(flat, "RaiseConntrackMax raise"); i < 0 || strings.Contains(flat[i:min(len(flat), i+300)], "[needs the API") {
		t.Error("policy types marks RaiseConntrackMax (node-local) as needing the API, or lacks it")
	}
}
