package tools

import (
	"bufio"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
)

// progress.sh says what it builds, a line per PROGRESS_EVERY seconds while
// it runs (here 1 s; the build waits for the test to have seen one), then
// how long it took, and exits with the command's status.
func TestProgressSaysWhatAndHowLong(t *testing.T) {
	dir := t.TempDir()
	release := filepath.Join(dir, "release")
	cmd := exec.Command("./progress.sh", "the thing", "sh", "-c", `while [ ! -e "$1" ]; do sleep 0.1; done; exit 3`, "sh", release)
	cmd.Env = append(os.Environ(), "PROGRESS_EVERY=1")
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	sc := bufio.NewScanner(out)
	var lines []string
	for sc.Scan() {
		lines = append(lines, sc.Text())
		if strings.HasPrefix(sc.Text(), "the thing: still building, ") {
			break
		}
	}
	if err := os.WriteFile(release, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	rest, _ := io.ReadAll(out)
	lines = append(lines, strings.Split(strings.TrimSpace(string(rest)), "\n")...)
	err = cmd.Wait()
	if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 3 {
		t.Errorf("exit %v, want the command's 3", err)
	}
	if len(lines) < 3 || !strings.HasPrefix(lines[0], "the thing: building") ||
		!regexp.MustCompile(`^the thing: still building, \d+s so far$`).MatchString(lines[1]) ||
		!regexp.MustCompile(`^the thing: FAILED after \d+s \(exit 3\)$`).MatchString(lines[len(lines)-1]) {
		t.Errorf("output:\n%s", strings.Join(lines, "\n"))
	}

	b, err := exec.Command("./progress.sh", "quick", "true").Output()
	if err != nil || !regexp.MustCompile(`(?s)^quick: building.*\nquick: done in \d+s\n$`).Match(b) {
		t.Errorf("a quick build: %v\n%s", err, b)
	}
}

// Without root, testlanes.sh (run by make test first) names each lane it
// skips and why, one line each; as root it names none of them.
func TestTestLanesSaysWhatIsSkipped(t *testing.T) {
	lanes := []string{"real-kernel lane", "control-plane lane", "VM lane", "privilege tests"}
	run := func(asNobody bool) string {
		t.Helper()
		// A copy uid 65534 can read (the work tree may not be).
		dir, err := os.MkdirTemp("", "remediate-testlanes-")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { os.RemoveAll(dir) })
		os.Chmod(dir, 0o755)
		os.Mkdir(filepath.Join(dir, "hostdeps"), 0o755)
		for _, f := range []string{"testlanes.sh", "hostdeps/packages.txt"} {
			b, err := os.ReadFile(f)
			if err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(dir, f), b, 0o755); err != nil {
				t.Fatal(err)
			}
		}
		cmd := exec.Command(filepath.Join(dir, "testlanes.sh"))
		if asNobody {
			cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
		}
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("testlanes.sh: %v\n%s", err, out)
		}
		return string(out)
	}
	root := os.Geteuid() == 0
	out := run(root)
	for _, l := range lanes {
		if n := strings.Count(out, "make test: skipping the "+l+" "); n != 1 {
			t.Errorf("without root, %q said %d times:\n%s", l, n, out)
		}
	}
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		if !strings.Contains(line, ": need") && !strings.Contains(line, "missing") {
			t.Errorf("a line without its reason: %q", line)
		}
	}
	if root {
		out := run(false)
		for _, l := range lanes {
			if strings.Contains(out, l) {
				t.Errorf("as root, %q said skipped:\n%s", l, out)
			}
		}
	}
}
