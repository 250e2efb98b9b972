package tools

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
)

// ensureCopy copies hostdeps/ensure.sh into a directory uid 65534 can read,
// with packages as its packages.txt, and a fake apt-get (which records its
// arguments in the returned log and exits with aptExit) first in PATH.
func ensureCopy(t *testing.T, packages string, aptExit int) (script, aptLog string, env []string) {
	t.Helper()
	dir, err := os.MkdirTemp("", "remediate-hostdeps-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile("hostdeps/ensure.sh")
	if err != nil {
		t.Fatal(err)
	}
	script = filepath.Join(dir, "ensure.sh")
	aptLog = filepath.Join(dir, "apt-get.log")
	bin := filepath.Join(dir, "bin")
	for name, content := range map[string]string{
		script:                             string(b),
		filepath.Join(dir, "packages.txt"): packages,
		filepath.Join(bin, "apt-get"):      "#!/bin/sh\necho \"$*\" >>" + aptLog + "\necho apt-get says: $1\nexit " + strconv.Itoa(aptExit) + "\n",
	} {
		if err := os.MkdirAll(filepath.Dir(name), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(name, []byte(content), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	return script, aptLog, append(os.Environ(), "PATH="+bin+":"+os.Getenv("PATH"))
}

// TestHostdepsSaysWhatItInstalls: tools/hostdeps/ensure.sh, which `make
// test` (target hostdeps) and .ci/run both run on the one list
// tools/hostdeps/packages.txt, says in one line what it installs (as root,
// apt-get faked), names what is missing without root (installing nothing),
// says nothing when all is present, and shows apt-get's output on failure
// (exit 2).
func TestHostdepsSaysWhatItInstalls(t *testing.T) {
	if _, err := exec.LookPath("dpkg-query"); err != nil {
		t.Skip("not a Debian-like system (no dpkg-query)")
	}
	mk, err := os.ReadFile("../Makefile")
	if err != nil {
		t.Fatal(err)
	}
	ci, err := os.ReadFile("../.ci/run")
	if err != nil {
		t.Fatal(err)
	}
	if !regexp.MustCompile(`(?m)^test: hostdeps\b`).Match(mk) || !regexp.MustCompile(`(?m)^hostdeps:\n\t@tools/hostdeps/ensure\.sh\b`).Match(mk) ||
		!regexp.MustCompile(`(?m)^tools/hostdeps/ensure\.sh$`).Match(ci) {
		t.Error("make test (target hostdeps) and .ci/run must both run tools/hostdeps/ensure.sh")
	}

	const absent = "remediate-test-absent-a remediate-test-absent-b"
	pkgs := "# comment\ncoreutils   always there\nremediate-test-absent-a   lane A\nremediate-test-absent-b   lane B\n"
	run := func(script string, env []string, asNobody bool) (string, int) {
		t.Helper()
		cmd := exec.Command(script)
		cmd.Env = env
		if asNobody {
			cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
		}
		out, err := cmd.CombinedOutput()
		code := 0
		if ee, ok := err.(*exec.ExitError); ok {
			code = ee.ExitCode()
		} else if err != nil {
			t.Fatal(err)
		}
		return string(out), code
	}
	root := os.Geteuid() == 0

	if root {
		script, aptLog, env := ensureCopy(t, pkgs, 0)
		out, code := run(script, env, false)
		want := "hostdeps: installing " + absent + " (apt-get; see tools/hostdeps/packages.txt)\n"
		if code != 0 || out != want {
			t.Errorf("as root with two packages missing: exit %d, output\n%q\nwant exit 0 and the one line\n%q", code, out, want)
		}
		calls, _ := os.ReadFile(aptLog)
		if !strings.Contains(string(calls), "install -y -q --no-install-recommends "+absent) {
			t.Errorf("apt-get called with:\n%s", calls)
		}

		script, _, env = ensureCopy(t, pkgs, 1)
		out, code = run(script, env, false)
		if code != 2 || !strings.Contains(out, "apt-get says: update") || !strings.Contains(out, "hostdeps: apt-get failed installing: "+absent) {
			t.Errorf("as root, apt-get failing: exit %d, output\n%s", code, out)
		}
	}

	script, aptLog, env := ensureCopy(t, pkgs, 0)
	if root {
		out, code := run(script, env, true)
		want := "hostdeps: missing Debian packages: " + absent + " (see tools/hostdeps/packages.txt for the lanes that need each)\n"
		if code != 1 || out != want {
			t.Errorf("without root: exit %d, output\n%q\nwant exit 1 and\n%q", code, out, want)
		}
		if _, err := os.Stat(aptLog); err == nil {
			t.Error("without root, apt-get was run")
		}
	}

	script, _, env = ensureCopy(t, "coreutils   always there\n", 0)
	if out, code := run(script, env, false); code != 0 || out != "" {
		t.Errorf("all present: exit %d, output %q, want silence", code, out)
	}
}

// TestVMLaneProgramsListed: every host program the VM lane needs
// (tools/vm/run.sh's checks, its PROGRAMS, and the VM_EXTRA_PROGRAMS the
// IPVS kube-proxy test adds: ipset, which `make test-vm` once missed with
// a hint naming other packages) comes from a package of
// tools/hostdeps/packages.txt, or from one every Debian has (Essential or
// Priority required). The owning package is asked of dpkg on this host.
func TestVMLaneProgramsListed(t *testing.T) {
	if _, err := exec.LookPath("dpkg-query"); err != nil {
		t.Skip("not a Debian-like system (no dpkg-query)")
	}
	run, err := os.ReadFile("vm/run.sh")
	if err != nil {
		t.Fatal(err)
	}
	vmTest, err := os.ReadFile("../remediate/action/ipvs_kubeproxy_vm_test.go")
	if err != nil {
		t.Fatal(err)
	}
	var progs []string
	for _, re := range []*regexp.Regexp{
		regexp.MustCompile(`(?m)^for c in (.*) \$PROGRAMS; do$`),
		regexp.MustCompile(`(?m)^PROGRAMS="([^"$]*)`),
	} {
		m := re.FindSubmatch(run)
		if m == nil {
			t.Fatalf("tools/vm/run.sh: no match for %s", re)
		}
		progs = append(progs, strings.Fields(string(m[1]))...)
	}
	m := regexp.MustCompile(`"VM_EXTRA_PROGRAMS=([^"]*)"`).FindSubmatch(vmTest)
	if m == nil {
		t.Fatal("ipvs_kubeproxy_vm_test.go: no VM_EXTRA_PROGRAMS")
	}
	progs = append(progs, strings.Fields(string(m[1]))...)
	if !slices.Contains(progs, "ipset") || len(progs) < 10 {
		t.Fatalf("programs read: %v", progs)
	}
	listed := map[string]bool{}
	pk, err := os.ReadFile("hostdeps/packages.txt")
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(pk), "\n") {
		if f := strings.Fields(l); len(f) > 0 && !strings.HasPrefix(f[0], "#") {
			listed[f[0]] = true
		}
	}
	// One dpkg -S for every path (each also without its /usr: merged-/usr
	// systems record either); it lists what it finds, "package: path".
	paths := map[string]string{}
	var args []string
	for _, p := range progs {
		path, err := exec.LookPath(p)
		if err != nil {
			t.Logf("%s: not installed here, cannot ask dpkg which package has it", p)
			continue
		}
		paths[p] = path
		args = append(args, path, strings.TrimPrefix(path, "/usr"))
	}
	out, _ := exec.Command("dpkg", append([]string{"-S"}, args...)...).Output()
	owners := map[string]string{}
	for _, l := range strings.Split(string(out), "\n") {
		if pkg, path, ok := strings.Cut(l, ": "); ok {
			owners[path] = strings.SplitN(pkg, ",", 2)[0]
			owners["/usr"+path] = owners[path]
		}
	}
	for _, p := range progs {
		path, ok := paths[p]
		if !ok {
			continue
		}
		owner := owners[path]
		if owner == "" {
			t.Errorf("%s (%s): dpkg knows no package with it", p, path)
			continue
		}
		if listed[owner] {
			continue
		}
		out, _ := exec.Command("dpkg-query", "-W", "-f=${Essential} ${Priority}", owner).Output()
		if f := strings.Fields(string(out)); len(f) == 2 && (f[0] == "yes" || f[1] == "required") {
			continue
		}
		t.Errorf("the VM lane needs %s, from Debian package %s (%s), which tools/hostdeps/packages.txt does not list", p, owner, out)
	}
}
