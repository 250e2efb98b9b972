package main

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// TestHelpEverywhere: every command answers --help (and `help CMD`) on
// stdout with exit 0, naming its own usage line; the root's help names every
// subcommand.
func TestHelpEverywhere(t *testing.T) {
	cmds := [][]string{{}, {"policy"}, {"policy", "check"}, {"policy", "show"}, {"policy", "types"}, {"journal"}, {"cleanup"}, {"version"},
		{"completion"}, {"completion", "bash"}}
	for _, c := range cmds {
		for _, form := range [][]string{append(append([]string{}, c...), "--help"), append([]string{"help"}, c...)} {
			code, out, errOut := run(t, form...)
			want := "remediate " + strings.Join(c, " ")
			if code != exitOK || !strings.Contains(out, "Usage:\n  "+strings.TrimSpace(want)) || errOut != "" {
				t.Errorf("%q: exit %d, stderr %q, stdout:\n%s", form, code, errOut, out)
			}
		}
	}
	_, out, _ := run(t, "--help")
	for _, sub := range []string{"policy", "journal", "cleanup", "version", "completion", "help"} {
		if !strings.Contains(out, "\n  "+sub+" ") {
			t.Errorf("root help does not name %q:\n%s", sub, out)
		}
	}
	// The column is as wide as the longest flag: any run of spaces.
	if !regexp.MustCompile(`--node-name string +this node's name \(default \$NODE_NAME, else the hostname\)\n`).MatchString(out) {
		t.Errorf("--node-name help:\n%s", out)
	}
}

// TestVersionAndCompletion: --version and `version` agree; completion
// scripts come out for the usual shells and complete subcommands.
func TestVersionAndCompletion(t *testing.T) {
	for _, args := range [][]string{{"--version"}, {"version"}} {
		if code, out, _ := run(t, args...); code != exitOK || out != "remediate "+version+"\n" {
			t.Errorf("%q: exit %d %q", args, code, out)
		}
	}
	for _, sh := range []string{"bash", "zsh", "fish", "powershell"} {
		if code, out, _ := run(t, "completion", sh); code != exitOK || !strings.Contains(out, "remediate") || len(out) < 500 {
			t.Errorf("completion %s: exit %d, %d bytes", sh, code, len(out))
		}
	}
	code, out, _ := run(t, "__complete", "pol")
	if code != exitOK || !strings.Contains(out, "policy") {
		t.Errorf("completing 'pol': %d %q", code, out)
	}
	code, out, _ = run(t, "__complete", "--once", "-o", "")
	if code != exitOK || !strings.Contains(out, "text\njson\n") {
		t.Errorf("completing -o: %d %q", code, out)
	}
}

// TestUsageErrors: each documented command-line mistake is named on stderr
// with a pointer to the right --help, nothing on stdout, exit 1.
func TestUsageErrors(t *testing.T) {
	dir := t.TempDir()
	pol := writePolicy(t, dir, "audit", 0)
	cases := []struct {
		args []string
		msg  string
		help string
	}{
		{[]string{"--statedir", "/tmp/x"}, "unknown flag: --statedir", "remediate"},
		{[]string{"--once", "--policy"}, "flag needs an argument: --policy", "remediate"},
		{[]string{"--once", "-o"}, "flag needs an argument: 'o' in -o", "remediate"},
		{[]string{"--once", "--policy", pol, "-o", "yaml"}, `--output must be text or json, got "yaml"`, "remediate"},
		{[]string{"--once=maybe"}, `invalid argument "maybe" for "--once" flag`, "remediate"},
		{[]string{"bogus"}, `unknown command "bogus" for "remediate" (commands: bundle, cleanup, completion, journal, policy, version)`, "remediate"},
		{[]string{"jornal"}, `unknown command "jornal" for "remediate": did you mean "journal"? (commands: bundle, cleanup, completion, journal, policy, version)`, "remediate"},
		{[]string{"clean"}, `unknown command "clean" for "remediate": did you mean "cleanup"?`, "remediate"},
		{[]string{"policy", "chek"}, `unknown command "chek" for "remediate policy": did you mean "check"?`, "remediate policy"},
		{[]string{"journal", "--bogus"}, "unknown flag: --bogus", "remediate journal"},
		{[]string{"journal", "-o", "yaml"}, `--output must be text or json, got "yaml"`, "remediate journal"},
		{[]string{"journal", "extra"}, `unexpected argument "extra" for "remediate journal"`, "remediate journal"},
		{[]string{"policy"}, `"remediate policy" needs a subcommand: check, show or types`, "remediate policy"},
		{[]string{"policy", "bogus"}, `unknown command "bogus" for "remediate policy" (commands: check, show, types)`, "remediate policy"},
		{[]string{"policy", "check"}, `"remediate policy check" needs at least one FILE`, "remediate policy check"},
		{[]string{"policy", "check", "--strict", pol}, "unknown flag: --strict", "remediate policy check"},
		{[]string{"policy", "show"}, `"remediate policy show" needs FILE`, "remediate policy show"},
		{[]string{"policy", "show", pol, pol}, `"remediate policy show" takes one FILE, got 2 arguments`, "remediate policy show"},
		{[]string{"policy", "types", "x"}, `unexpected argument "x" for "remediate policy types"`, "remediate policy types"},
		{[]string{"version", "--short"}, "unknown flag: --short", "remediate version"},
		{[]string{"completion", "tcsh"}, `unknown command "tcsh" for "remediate completion" (commands: bash, fish, powershell, zsh)`, "remediate completion"},
		{[]string{"completion"}, `"remediate completion" needs a shell: bash, zsh, fish or powershell`, "remediate completion"},
	}
	for _, c := range cases {
		code, out, errOut := run(t, c.args...)
		want := "Error: " + c.msg + "\nSee '" + c.help + " --help' for usage.\n"
		if code != exitError || out != "" || !strings.HasPrefix(errOut, "Error: "+c.msg) || !strings.HasSuffix(errOut, "See '"+c.help+" --help' for usage.\n") {
			t.Errorf("%q: exit %d\nstdout %q\nstderr %q\nwant   %q", c.args, code, out, errOut, want)
		}
	}
	// Not usage mistakes: the command ran and says what went wrong.
	code, _, errOut := run(t, "policy", "show", filepath.Join(dir, "missing.yaml"))
	if code != exitError || !strings.Contains(errOut, "missing.yaml") || strings.Contains(errOut, "--help") {
		t.Errorf("show missing file: %d %q", code, errOut)
	}
	// A state dir that is not there (a typo) is an error, not "the journal
	// is empty": during an incident that reads as "the daemon did nothing".
	code, jout, errOut := run(t, "journal", "--state-dir", filepath.Join(dir, "nope"))
	if code != exitError || jout != "" || !strings.Contains(errOut, "--state-dir "+filepath.Join(dir, "nope")+": no such file or directory") {
		t.Errorf("journal of a missing dir: exit %d\nstdout %q\nstderr %q", code, jout, errOut)
	}
	// An existing state dir without a journal yet is empty, and says so.
	code, jout, _ = run(t, "journal", "--state-dir", dir)
	if code != exitOK || !strings.Contains(jout, "is empty") {
		t.Errorf("journal of an empty state dir: exit %d %q", code, jout)
	}
}

// TestPolicyErrorsNameDefaults: a conflict with a value the file does not
// set points at what the file wrote and names the default and its value.
func TestPolicyErrorsNameDefaults(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "p.yaml")
	os.WriteFile(p, []byte(`apiVersion: remediate.dev/v1alpha1
kind: RemediationPolicy
interval: 5s
rules:
- name: x
  detector: {type: ConntrackExhaustion, utilizationThreshold: 0.97}
`), 0o644)
	code, _, errOut := run(t, "policy", "check", p)
	for _, want := range []string{
		p + ":3:11: interval: 5s is shorter than detectorTimeout (not set: its default is 10s); set detectorTimeout to at most 5s, or a longer interval",
		p + ":6:13: rules[0].detector.criticalUtilization: must be >= utilizationThreshold (not set: its default is 0.95)",
	} {
		if code != exitError || !strings.Contains(errOut, want) {
			t.Errorf("exit %d, output lacks %q:\n%s", code, want, errOut)
		}
	}
}
