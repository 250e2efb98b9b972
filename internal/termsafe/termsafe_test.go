package termsafe

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
	"unicode/utf8"
)

// hostile are strings an attacker controls (a condition message, a Lease's
// holder, a process's argv) that would drive a terminal if printed raw.
var hostile = []string{
	"\x1b[2J\x1b[H all good",                      // clear screen, home
	"\x1b]0;title\x07",                            // OSC window title
	"\x1b]8;;http://evil\x1b\\link\x1b]8;;\x1b\\", // OSC 8 hyperlink
	"ok\rFAKE",                      // overwrite the line
	"hidden\x1b[8mtext",             // conceal
	"\u009b2J",                      // C1 CSI as UTF-8
	"\x9b2J",                        // C1 CSI as a raw byte
	"admin\u202egnp.exe",            // RLO
	"a\u2066b\u2069c\u200fd\u061ce", // isolates, RLM, ALM
	"zero\u200bwidth\ufeffbom",      // invisible
	"del\x7f\x08\x08",               // DEL, backspaces
	"line\u2028sep",                 // line separator
	"\x1bP+q\x1b\\",                 // DCS
	"bad\xff\xfeutf8",               // invalid UTF-8
	"astral private \U000F0000 end", // private use, astral
}

// check is the property every neutralised string has.
func check(t *testing.T, in, out string, multiline bool) {
	t.Helper()
	if !utf8.ValidString(out) {
		t.Fatalf("%q -> %q: not UTF-8", in, out)
	}
	for i := 0; i < len(out); i++ {
		c := out[i]
		if c == 0x7f || c < 0x20 && !(multiline && (c == '\n' || c == '\t')) {
			t.Fatalf("%q -> %q: byte 0x%02x at %d", in, out, c, i)
		}
	}
	for _, r := range out {
		if Unsafe(r) && !(multiline && (r == '\n' || r == '\t')) {
			t.Fatalf("%q -> %q: rune %U", in, out, r)
		}
	}
}

func TestHostileNeutralised(t *testing.T) {
	for _, h := range hostile {
		for _, ml := range []bool{true, false} {
			out := escape(h, ml)
			check(t, h, out, ml)
			if out == h {
				t.Errorf("%q unchanged", h)
			}
		}
	}
	for in, want := range map[string]string{
		"\x1b[2J\x1b[H all good": `\x1b[2J\x1b[H all good`,
		"ok\rFAKE":               `ok\rFAKE`,
		"admin\u202egnp.exe":     `admin\u202egnp.exe`,
		"\u009b2J":               `\u009b2J`,
		"\x9b2J":                 `\x9b2J`,
		"a\tb\nc":                `a\tb\nc`,
	} {
		if got := Line(in); got != want {
			t.Errorf("Line(%q) = %q, want %q", in, got, want)
		}
	}
	if got := Text("a\tb\nc\x1b"); got != "a\tb\nc\\x1b" {
		t.Errorf("Text kept %q", got)
	}
}

// What is ordinary stays byte for byte (and is not copied).
func TestOrdinaryUnchanged(t *testing.T) {
	for _, s := range []string{"", "kube-proxy --v=2 --hostname-override node-1", "NODE\tSTATUS\n",
		"Ünïcödé — “quotes” 日本語 emoji 🙂 U+FFFD \ufffd", `C:\path\x1b literal backslashes`} {
		if got := Text(s); got != s {
			t.Errorf("Text(%q) = %q", s, got)
		}
	}
}

func TestWriter(t *testing.T) {
	var b bytes.Buffer
	w := NewWriter(&b)
	if NewWriter(w) != w {
		t.Error("a Writer wrapped twice")
	}
	for _, h := range hostile {
		if n, err := w.Write([]byte(h + "\n")); err != nil || n != len(h)+1 {
			t.Fatalf("Write = %d, %v", n, err)
		}
	}
	// A rune cut between two writes is shown, never passed raw.
	rlo := []byte("\u202e")
	w.Write(rlo[:1])
	w.Write(rlo[1:])
	check(t, "writer", b.String(), true)
}

func TestJSONWriterRoundTrip(t *testing.T) {
	v := map[string]any{"msg": hostile, "ok": "plain — 日本語"}
	var b bytes.Buffer
	enc := json.NewEncoder(&JSONWriter{W: &b})
	enc.SetIndent("", "  ")
	if err := enc.Encode(v); err != nil {
		t.Fatal(err)
	}
	check(t, "json", b.String(), true)
	var back map[string]any
	if err := json.Unmarshal(b.Bytes(), &back); err != nil {
		t.Fatalf("not JSON: %v\n%s", err, b.String())
	}
	var plain bytes.Buffer
	json.NewEncoder(&plain).Encode(v)
	var want map[string]any
	json.Unmarshal(plain.Bytes(), &want)
	wb, _ := json.Marshal(want)
	bb, _ := json.Marshal(back)
	if !bytes.Equal(wb, bb) {
		t.Errorf("decodes to something else:\n%s\n%s", bb, wb)
	}
	if !strings.Contains(b.String(), `\u202e`) || !strings.Contains(b.String(), `\u009b`) {
		t.Errorf("bidi/C1 not escaped:\n%s", b.String())
	}
}

// Neutralised output never holds a byte below 0x20 (but newline and tab
// in Text), DEL, a C1 control, a bidi control or an invisible rune, and
// neutralising twice changes nothing. JSONWriter's output of a JSON
// encoding is the same JSON value.
func FuzzNeutralise(f *testing.F) {
	for _, h := range hostile {
		f.Add(h)
	}
	f.Add("plain text\twith tab\n")
	f.Fuzz(func(t *testing.T, s string) {
		for _, ml := range []bool{true, false} {
			out := escape(s, ml)
			check(t, s, out, ml)
			if again := escape(out, ml); again != out {
				t.Fatalf("not idempotent: %q -> %q -> %q", s, out, again)
			}
		}
		var b bytes.Buffer
		if err := json.NewEncoder(&JSONWriter{W: &b}).Encode(s); err != nil {
			t.Fatal(err)
		}
		check(t, s, b.String(), true)
		var back, want string
		if err := json.Unmarshal(b.Bytes(), &back); err != nil {
			t.Fatalf("%q: not JSON: %v", b.String(), err)
		}
		wb, _ := json.Marshal(s)
		json.Unmarshal(wb, &want)
		if back != want {
			t.Fatalf("JSON %q decodes to %q, want %q", b.String(), back, want)
		}
		// A stream cut in two anywhere gives the same as JSONWriter.
		var whole, cut bytes.Buffer
		(&JSONWriter{W: &whole}).Write([]byte(s))
		st := &Stream{W: &cut}
		st.Write([]byte(s[:len(s)/2]))
		st.Write([]byte(s[len(s)/2:]))
		st.Flush()
		if cut.String() != whole.String() {
			t.Fatalf("stream %q, whole %q", cut.String(), whole.String())
		}
	})
}

// A stream cut anywhere (an exec's output in chunks) is neutralised the
// same as whole, runes split between chunks kept.
func TestStreamCutAnywhere(t *testing.T) {
	in := "report — “ok” 日本語 🙂\x1b[2J\u202e\u009b end\n" + `{"a":"\u202e"}`
	var whole bytes.Buffer
	(&JSONWriter{W: &whole}).Write([]byte(in))
	for step := 1; step <= 5; step++ {
		var b bytes.Buffer
		s := &Stream{W: &b}
		for i := 0; i < len(in); i += step {
			s.Write([]byte(in[i:min(i+step, len(in))]))
		}
		s.Flush()
		if b.String() != whole.String() {
			t.Errorf("step %d: %q, want %q", step, b.String(), whole.String())
		}
		check(t, in, b.String(), true)
	}
	var b bytes.Buffer
	s := &Stream{W: &b}
	s.Write([]byte("x\xe2\x80"))
	s.Flush()
	if b.String() != `x\ufffd\ufffd` {
		t.Errorf("a never-ended rune: %q", b.String())
	}
}
