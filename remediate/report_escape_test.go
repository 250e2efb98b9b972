package remediate

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/remediate-dev/remediate/internal/finding"
)

// terminalUnsafe returns the first byte or rune of out a terminal would act
// on (C0 but newline and tab, DEL, C1, bidi controls), or "".
func terminalUnsafe(out string) string {
	for i := 0; i < len(out); i++ {
		if c := out[i]; c == 0x7f || c < 0x20 && c != '\n' && c != '\t' {
			return out[i : i+1]
		}
	}
	for _, r := range out {
		if r >= 0x80 && r < 0xa0 || r >= 0x202a && r <= 0x202e || r >= 0x2066 && r <= 0x2069 {
			return string(r)
		}
	}
	return ""
}

// A process chooses its argv, and findings quote it: --once's text report
// shows it escaped, each cell on its line; -o json decodes to the same
// text and is safe to print. On main the text report printed the escape
// sequences raw.
func TestReportTextNeutralisesEscapes(t *testing.T) {
	argv := "iptables-restore \x1b[2J\x1b[Hall good\u202e \u009b"
	r := &Report{Node: "n1", Mode: "audit", Time: time.Unix(0, 0),
		Findings: []ReportFinding{{Rule: "r", Finding: finding.Finding{Detector: "d", Severity: finding.Critical,
			Target: "pid 7 (" + argv + ")\nFINDINGS: none", Message: "stuck: " + argv}}},
		Decisions: []Decision{{Rule: "r", Action: "a", Target: "x\ry", Outcome: OutcomeBlocked, Reason: argv}},
		Warnings:  []string{"w\x1b]0;t\x07"},
	}
	var b bytes.Buffer
	if err := r.WriteText(&b); err != nil {
		t.Fatal(err)
	}
	if bad := terminalUnsafe(b.String()); bad != "" {
		t.Errorf("%q reaches the terminal:\n%s", bad, b.String())
	}
	if !strings.Contains(b.String(), `\x1b[2J\x1b[Hall good\u202e`) {
		t.Errorf("argv not shown escaped:\n%s", b.String())
	}
	for _, l := range strings.Split(b.String(), "\n") {
		if strings.HasPrefix(l, "FINDINGS: none") {
			t.Errorf("forged line %q", l)
		}
	}
	var j bytes.Buffer
	if err := r.WriteJSON(&j); err != nil {
		t.Fatal(err)
	}
	if bad := terminalUnsafe(j.String()); bad != "" {
		t.Errorf("%q reaches the terminal in JSON:\n%s", bad, j.String())
	}
	var back Report
	if err := json.Unmarshal(j.Bytes(), &back); err != nil || back.Decisions[0].Reason != argv {
		t.Errorf("JSON decodes to %q (%v), want %q", back.Decisions[0].Reason, err, argv)
	}
}
