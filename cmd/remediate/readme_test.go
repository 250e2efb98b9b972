package main

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// The README's command-line block lists every subcommand (cleanup was
// missing), and the make fuzz default it states is the Makefile's.
func TestREADMECommandsAndFuzzDefault(t *testing.T) {
	b, err := os.ReadFile(filepath.Join("..", "..", "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	readme := string(b)
	i := strings.Index(readme, "## Command line")
	if i < 0 {
		t.Fatal("README has no '## Command line' section")
	}
	block := readme[i:]
	if j := strings.Index(block[3:], "\n## "); j > 0 {
		block = block[:j+3]
	}
	root := newRootCmd(nil, nil)
	for _, c := range root.Commands() {
		if !c.IsAvailableCommand() && c.Name() != "help" {
			continue
		}
		if !strings.Contains(block, "remediate "+c.Name()) {
			t.Errorf("README's command line section does not list `remediate %s`", c.Name())
		}
	}
	mk, err := os.ReadFile(filepath.Join("..", "..", "Makefile"))
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^FUZZTIME \?= (\S+)`).FindSubmatch(mk)
	if m == nil {
		t.Fatal("Makefile sets no FUZZTIME")
	}
	rm := regexp.MustCompile(`make fuzz .*FUZZTIME \(default (\S+?)\)`).FindStringSubmatch(readme)
	if rm == nil || rm[1] != string(m[1]) {
		t.Errorf("README says make fuzz defaults to %v, the Makefile to %s", rm, m[1])
	}
}
