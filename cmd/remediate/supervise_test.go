package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/remediate-dev/remediate/detect"
	"github.com/remediate-dev/remediate/internal/finding"
	"github.com/remediate-dev/remediate/internal/node"
)

type crashParams struct {
	How string `yaml:"how"`
}

type crashDetector struct{ how string }

func (d crashDetector) Detect(ctx context.Context) ([]finding.Finding, error) {
	switch d.how {
	case "fatal":
		var mu sync.Mutex
		mu.Unlock() // fatal error: sync: unlock of unlocked mutex (not recoverable)
	case "panic":
		go func() { panic("boom in a goroutine of our own") }()
		time.Sleep(5 * time.Second)
	}
	return nil, nil
}

func init() {
	detect.Define("CLITestCrash", "test detector that crashes the process",
		func(p *crashParams, _ *node.Node) (detect.Detector, error) { return crashDetector{p.How}, nil })
}

// TestOnceExitCodeOfACrash: a Go fatal error or a panic outside the
// engine's recovery exited 2, the code for "findings present" (issue 13).
// Through the real main(): 0 clean, 2 findings, 1 for each crash.
func TestOnceExitCodeOfACrash(t *testing.T) {
	dir := t.TempDir()
	policy := func(name, detector string) string {
		p := filepath.Join(dir, name+".yaml")
		body := fmt.Sprintf("apiVersion: remediate.dev/v1alpha1\nkind: RemediationPolicy\ninterval: 10s\nrules:\n- name: r\n  detector: %s\n", detector)
		if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	for _, c := range []struct {
		name, detector string
		want           int
		stderr         string
	}{
		{"clean", "{type: CLITestHung, findings: 0}", exitOK, ""},
		{"findings", "{type: CLITestHung, findings: 1}", exitFindings, ""},
		{"fatal", "{type: CLITestCrash, how: fatal}", exitError, "fatal error: sync: unlock of unlocked mutex"},
		{"panic", "{type: CLITestCrash, how: panic}", exitError, "panic: boom in a goroutine of our own"},
	} {
		t.Run(c.name, func(t *testing.T) {
			cmd := exec.Command(os.Args[0], "--once", "--policy", policy(c.name, c.detector), "--state-dir", filepath.Join(dir, c.name), "--node-name", "n1")
			cmd.Env = append(os.Environ(), "REMEDIATE_TEST_AS_MAIN=1")
			var stderr strings.Builder
			cmd.Stderr = &stderr
			err := cmd.Run()
			code := 0
			var ee *exec.ExitError
			if errors.As(err, &ee) {
				code = ee.ExitCode()
			} else if err != nil {
				t.Fatal(err)
			}
			if code != c.want || !strings.Contains(stderr.String(), c.stderr) {
				t.Errorf("exit %d, want %d; stderr:\n%.2000s", code, c.want, stderr.String())
			}
		})
	}
}
