package main

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/remediate-dev/remediate/detect"
	"github.com/remediate-dev/remediate/remediate/action"
)

// TestPolicyTypesPrintsRunbookAnchors: `remediate policy types` prints, for
// every detector and action type, the runbook anchor of its section, and
// each anchor the output names exists in examples/RUNBOOK.md (this test
// binary's own CLITest* types have none and are left out).
func TestPolicyTypesPrintsRunbookAnchors(t *testing.T) {
	code, out, _ := run(t, "policy", "types")
	if code != exitOK {
		t.Fatalf("exit %d", code)
	}
	rb, err := os.ReadFile(filepath.Join("..", "..", runbookFile))
	if err != nil {
		t.Fatal(err)
	}
	ids := map[string]bool{}
	for _, m := range regexp.MustCompile(`<a id="([^"]+)"></a>`).FindAllStringSubmatch(string(rb), -1) {
		ids[m[1]] = true
	}
	printed := map[string]bool{}
	for _, m := range regexp.MustCompile(`(?m)^    runbook: `+regexp.QuoteMeta(runbookFile)+`#(\S+)$`).FindAllStringSubmatch(out, -1) {
		printed[m[1]] = true
	}
	var want []string
	for _, ty := range detect.Types() {
		want = append(want, "detector-"+strings.ToLower(ty.Name))
	}
	for _, ty := range action.Types() {
		want = append(want, "action-"+strings.ToLower(ty.Name))
	}
	n := 0
	for _, a := range want {
		if !printed[a] {
			t.Errorf("policy types prints no runbook anchor #%s", a)
		}
		if strings.Contains(a, "-clitest") {
			continue
		}
		n++
		if !ids[a] {
			t.Errorf("policy types prints %s#%s, which %s does not define (add <a id=%q></a> before the type's section)", runbookFile, a, runbookFile, a)
		}
	}
	if n < 40 {
		t.Errorf("only %d real types", n)
	}
}
