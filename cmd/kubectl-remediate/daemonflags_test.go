package main

import (
	"os"
	"regexp"
	"slices"
	"testing"
)

// TestDaemonFlagsCoverTheChart: every path the chart's DaemonSet gives the
// daemon (an argument --flag=/path) is taken over by the one-shot run, or
// `kubectl remediate` judges the node with the pod's defaults instead of
// the mounts (HostLocalIPAM read no store: --cni-ipam-dir was missing).
func TestDaemonFlagsCoverTheChart(t *testing.T) {
	for _, file := range []string{"../../deploy/helm/remediate/templates/daemonset.yaml", "../../deploy/base/daemonset.yaml"} {
		b, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		found := 0
		for _, m := range regexp.MustCompile(`(?m)^\s*- (--[a-z-]+)=/`).FindAllStringSubmatch(string(b), -1) {
			found++
			if !slices.Contains(daemonFlags, m[1]) {
				t.Errorf("%s gives the daemon %s=/...; daemonFlags does not take it over", file, m[1])
			}
		}
		if found < 5 {
			t.Fatalf("%s: %d path arguments found; the pattern no longer matches the manifest", file, found)
		}
	}
}
