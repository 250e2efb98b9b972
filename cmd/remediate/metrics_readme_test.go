package main

import (
	"bufio"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"
)

// TestMetricsMatchREADME runs the real binary (this test binary as main)
// and scrapes /metrics as soon as it answers, before the first cycle: every
// remediate_* family docs/METRICS.md (the list) or any other document
// (README.md, docs/*.md) names is exported, with the policy's label values
// at 0, and every remediate_* family exported is in docs/METRICS.md.
func TestMetricsMatchREADME(t *testing.T) {
	names := func(file string) map[string]bool {
		b, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		out := map[string]bool{}
		for _, m := range regexp.MustCompile("`(remediate_[a-z_]+)").FindAllStringSubmatch(string(b), -1) {
			out[m[1]] = true
		}
		return out
	}
	documented := names("../../docs/METRICS.md")
	if len(documented) < 8 {
		t.Fatalf("docs/METRICS.md names only %d metrics", len(documented))
	}
	docs, err := filepath.Glob("../../docs/*.md")
	if err != nil {
		t.Fatal(err)
	}
	named := map[string]string{}
	for _, f := range append(docs, "../../README.md") {
		for m := range names(f) {
			named[m] = strings.TrimPrefix(f, "../../")
		}
	}

	dir := t.TempDir()
	pol := filepath.Join(dir, "policy.yaml")
	// A long interval: the first cycle is minutes away, so the scrape sees
	// what is exported before any event.
	src := strings.Replace(fmt.Sprintf(testPolicy, "enforce", 1), "interval: 1s", "interval: 1h\njitter: 0.5", 1)
	if err := os.WriteFile(pol, []byte(src), 0o644); err != nil {
		t.Fatal(err)
	}
	addr := freeAddr(t)
	cmd := mainCmd(os.Args[0], "--policy", pol, "--state-dir", filepath.Join(dir, "state"), "--metrics-addr", addr, "--node-name", "node1")
	cmd.Stderr = io.Discard
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	var body string
	waitFor(t, "/metrics", func() bool {
		resp, err := http.Get("http://" + addr + "/metrics")
		if err != nil {
			return false
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		body = string(b)
		return resp.StatusCode == 200
	})

	exported := map[string]bool{}
	sc := bufio.NewScanner(strings.NewReader(body))
	for sc.Scan() {
		if f := strings.Fields(sc.Text()); len(f) >= 3 && f[0] == "#" && f[1] == "TYPE" && strings.HasPrefix(f[2], "remediate_") {
			exported[f[2]] = true
		}
	}
	var missing, undocumented []string
	for m := range documented {
		if !exported[m] {
			missing = append(missing, m)
		}
	}
	for m, f := range named {
		if !exported[m] && !documented[m] {
			missing = append(missing, m+" ("+f+")")
		}
	}
	for m := range exported {
		if !documented[m] {
			undocumented = append(undocumented, m)
		}
	}
	sort.Strings(missing)
	sort.Strings(undocumented)
	if len(missing) > 0 || len(undocumented) > 0 {
		t.Errorf("the docs and /metrics disagree: documented but not exported at start %v; exported but not in docs/METRICS.md %v\n%s", missing, undocumented, body)
	}
	// Known label values at 0 before any event.
	for _, s := range []string{
		`remediate_findings{detector="CLITestHung",rule="hung-restore",severity="critical"} 0`,
		`remediate_decisions_total{action="CLITestKill",outcome="executed",rule="hung-restore"} 0`,
		`remediate_action_duration_seconds_count{action="CLITestKill"} 0`,
		`remediate_detector_errors_total{detector="CLITestNeedsAPI",rule="api-check"} 0`,
		`remediate_detector_skipped{detector="CLITestHung",rule="clean-check"} 0`,
		`remediate_guardrail_blocks_total{guardrail="cooldown",rule="hung-restore"} 0`,
		`remediate_guardrail_blocks_total{guardrail="cluster-budget",rule="hung-restore"} 0`,
		`remediate_escalated_targets{rule="hung-restore"} 0`,
		`remediate_policy_reloads_total{result="invalid"} 0`,
		`remediate_last_cycle_timestamp_seconds 0`,
	} {
		if !strings.Contains(body, s+"\n") {
			t.Errorf("/metrics lacks %s", s)
		}
	}
}
