package main

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// pidnsRun is the outcome of a script run by runInPIDNamespace: the files
// the script wrote in its directory, read back for the test's assertions.
type pidnsRun struct {
	t   *testing.T
	dir string
}

// runInPIDNamespace writes script to DIR/run.sh and runs it with sh in a
// PID namespace of its own (`unshare --pid --fork --mount-proc`, so the
// processes the script starts are the only ones the binary under test
// sees in /proc, and all of them die with the namespace's init), bounded
// by two minutes. env is added to the test's environment, with DIR, BIN
// (this test binary, which runs as main under REMEDIATE_TEST_AS_MAIN=1)
// set. The test fails with the script's output if the script fails.
func runInPIDNamespace(t *testing.T, dir, script string, env ...string) pidnsRun {
	t.Helper()
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "run.sh"), []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "unshare", "--pid", "--fork", "--mount-proc", "sh", filepath.Join(dir, "run.sh"))
	cmd.Env = append(append(os.Environ(), "DIR="+dir, "BIN="+self, "REMEDIATE_TEST_AS_MAIN=1"), env...)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("pid namespace script: %v\n%s", err, out)
	}
	return pidnsRun{t: t, dir: dir}
}

// read returns the trimmed content of the file name the script wrote.
func (r pidnsRun) read(name string) string {
	r.t.Helper()
	b, err := os.ReadFile(filepath.Join(r.dir, name))
	if err != nil {
		r.t.Fatal(err)
	}
	return strings.TrimSpace(string(b))
}

// report decodes the JSON report of the script's run named step (the
// files STEP.json, STEP.rc and STEP.err written by the script's `once`
// function), logging all three.
func (r pidnsRun) report(step string) e2eReport {
	r.t.Helper()
	var rep e2eReport
	out := r.read(step + ".json")
	r.t.Logf("%s (exit %s):\n%s\nstderr: %s", step, r.read(step+".rc"), out, r.read(step+".err"))
	if err := json.Unmarshal([]byte(out), &rep); err != nil {
		r.t.Fatalf("%s output is not JSON: %v", step, err)
	}
	return rep
}
