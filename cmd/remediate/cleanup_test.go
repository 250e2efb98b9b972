package main

import (
	"bytes"
	"context"
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
