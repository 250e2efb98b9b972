package journal

import (
	"strings"
	"testing"
	"time"
)

// `remediate journal` prints Format's line: a record quoting a process's
// argv (target, error, details) shows its escape sequences escaped, on
// one line. On main they reached the terminal raw.
func TestFormatNeutralisesEscapes(t *testing.T) {
	r := Record{Time: time.Unix(0, 0), Kind: KindOutcome, Rule: "r", Action: "KillProcess",
		Target: "pid 9 (iptables-restore \x1b[2J\x1b[H)", Outcome: "executed\u202e",
		Summary: "ok\rFAKE", Error: "e\nnext", Details: map[string]any{"argv": "\u009b8m"}}
	got := Format(r)
	for i := 0; i < len(got); i++ {
		if c := got[i]; c < 0x20 || c == 0x7f {
			t.Fatalf("byte 0x%02x reaches the terminal: %q", c, got)
		}
	}
	for _, r := range got {
		if r >= 0x80 && r < 0xa0 || r >= 0x202a && r <= 0x202e {
			t.Fatalf("rune %U reaches the terminal: %q", r, got)
		}
	}
	for _, want := range []string{`\x1b[2J\x1b[H`, `\u202e`, `ok\rFAKE`, `e\nnext`, `\u009b8m`} {
		if !strings.Contains(got, want) {
			t.Errorf("%s not shown escaped: %s", want, got)
		}
	}
}
