package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestPolicyCheckNotesDeprecatedTypes: a policy that still says
// RestartKubeProxy is valid (exit 0, "ok") and `policy check` says, at the
// type's position, that it is deprecated and runs as RestartNodeAgent;
// `policy types` marks it; the examples use the one action (no note).
func TestPolicyCheckNotesDeprecatedTypes(t *testing.T) {
	dir := t.TempDir()
	old := filepath.Join(dir, "old.yaml")
	if err := os.WriteFile(old, []byte("apiVersion: remediate.dev/v1alpha1\nkind: RemediationPolicy\nrules:\n- name: stale\n  detector: {type: KubeProxySyncStale}\n"+
		"  action: {type: RestartKubeProxy, namespace: kube-system, labelSelector: k8s-app=kube-proxy, readyTimeout: 50s}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	code, out, errOut := run(t, "policy", "check", old)
	if code != exitOK || !strings.Contains(out, old+": ok") {
		t.Fatalf("a RestartKubeProxy policy refused: %d %s %s", code, out, errOut)
	}
	if want := "old.yaml:6:18: rules[0].action.type: RestartKubeProxy is deprecated: it runs as RestartNodeAgent"; !strings.Contains(errOut, want) {
		t.Fatalf("check output lacks %q:\n%s", want, errOut)
	}
	code, out, _ = run(t, "policy", "types")
	i := strings.Index(out, "\n  RestartKubeProxy\n")
	if code != exitOK || i < 0 || !strings.Contains(out[i:i+600], "DEPRECATED (runs as RestartNodeAgent)") {
		t.Fatalf("types does not mark RestartKubeProxy deprecated: %d\n%s", code, out)
	}
	files, _ := filepath.Glob("../../examples/*.yaml")
	if code, _, errOut := run(t, append([]string{"policy", "check"}, files...)...); code != exitOK || errOut != "" {
		t.Fatalf("examples: %d, notes:\n%s", code, errOut)
	}
}
