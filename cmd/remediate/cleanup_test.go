package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// Without cluster access cleanup fails (exit 1) and says why; the
// cleanup itself is proven on the real apiserver (internal/kube/e2e
// testFleet).
func TestCleanupWithoutCluster(t *testing.T) {
	var out, errb bytes.Buffer
	code := Run(context.Background(), []string{"cleanup", "--kubeconfig", filepath.Join(t.TempDir(), "none")}, &out, &errb)
	if code != exitError || !strings.Contains(errb.String(), "remediate cleanup:") {
		t.Errorf("exit %d, stderr %q", code, errb.String())
	}
	if code := Run(context.Background(), []string{"cleanup", "--bogus"}, &out, &errb); code != exitError {
		t.Errorf("unknown flag: exit %d", code)
	}
}

// Like kubectl, cleanup uses $KUBECONFIG when --kubeconfig is not given
// (the error names that file: without it, "not running in a pod").
func TestCleanupUsesKUBECONFIG(t *testing.T) {
	bad := filepath.Join(t.TempDir(), "env-kubeconfig")
	if err := os.WriteFile(bad, []byte("apiVersion: v1\nkind: Config\nclusters: [\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Setenv("KUBECONFIG", bad)
	var out, errb bytes.Buffer
	code := Run(context.Background(), []string{"cleanup"}, &out, &errb)
	if code != exitError || !strings.Contains(errb.String(), "--kubeconfig "+bad) {
		t.Errorf("exit %d, stderr %q: $KUBECONFIG %s not used", code, errb.String(), bad)
	}
	// --kubeconfig wins over $KUBECONFIG.
	other := filepath.Join(t.TempDir(), "flag-kubeconfig")
	errb.Reset()
	code = Run(context.Background(), []string{"cleanup", "--kubeconfig", other}, &out, &errb)
	if code != exitError || !strings.Contains(errb.String(), other) || strings.Contains(errb.String(), bad) {
		t.Errorf("--kubeconfig given: exit %d, stderr %q", code, errb.String())
	}
	t.Setenv("KUBECONFIG", bad+string(filepath.ListSeparator)+other)
	errb.Reset()
	code = Run(context.Background(), []string{"cleanup"}, &out, &errb)
	if code != exitError || !strings.Contains(errb.String(), "names 2 files") {
		t.Errorf("$KUBECONFIG with two files: exit %d, stderr %q", code, errb.String())
	}
}

// Out of a pod with neither --kubeconfig nor $KUBECONFIG, cleanup names
// both ways of giving it a cluster (it said only "no --kubeconfig given",
// though $KUBECONFIG works too).
func TestCleanupWithoutClusterNamesKUBECONFIG(t *testing.T) {
	t.Setenv("KUBECONFIG", "")
	t.Setenv("KUBERNETES_SERVICE_HOST", "")
	var out, errb bytes.Buffer
	code := Run(context.Background(), []string{"cleanup"}, &out, &errb)
	want := "remediate cleanup: no cluster access: not running in a pod (KUBERNETES_SERVICE_HOST/PORT unset) and no --kubeconfig given, $KUBECONFIG unset\n"
	if code != exitError || errb.String() != want {
		t.Errorf("exit %d, stderr %q, want %q", code, errb.String(), want)
	}
}
