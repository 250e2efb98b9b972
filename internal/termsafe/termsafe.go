// Package termsafe neutralises text from outside the daemon (a process's
// argv, API objects such as Node conditions, Leases and Events, kube-proxy's
// answers, a bundle from anywhere) before it reaches a terminal. A hostile
// string must not drive the terminal: no escape sequence (CSI, OSC, DCS),
// no C0 or C1 control, no bidi override that reorders what follows, no
// invisible rune. Each such rune is written visibly instead, Go-style
// (\x1b, \r, \u202e, \x9b for a byte that is not UTF-8), so the reader
// sees that it was there.
//
// It is applied at the output boundary: the text renderers write through
// Writer (or Text/Line), so every field is covered by design, not one by
// one. JSON output stays encoding/json's; JSONWriter additionally escapes
// the runes encoding/json leaves raw (DEL, C1, bidi, invisible) as \uXXXX,
// which decodes to the same string.
package termsafe

import (
	"fmt"
	"io"
	"strings"
	"unicode"
	"unicode/utf8"
)

// Text returns s with every non-printing rune written as an escape; newline
// and tab stay (multi-line text).
func Text(s string) string { return escape(s, true) }

// Line returns s on one line: like Text, and newline and tab escaped too,
// so an outside field cannot start a forged line or column.
func Line(s string) string { return escape(s, false) }

// Unsafe reports whether r must not reach a terminal as is: a C0 control
// (newline and tab are the caller's choice), DEL, a C1 control, a bidi
// control, a format (invisible) rune, a line or paragraph separator, or a
// rune that is not graphic (unassigned, private use, surrogate).
func Unsafe(r rune) bool {
	switch {
	case r < 0x20 || r == 0x7f:
		return true
	case r >= 0x80 && r < 0xa0:
		return true
	case unicode.Is(unicode.Bidi_Control, r), unicode.Is(unicode.Cf, r):
		return true
	}
	return !unicode.IsGraphic(r)
}

func escape(s string, multiline bool) string {
	if clean(s, multiline) {
		return s
	}
	var b strings.Builder
	b.Grow(len(s) + 16)
	writeEscaped(&b, s, multiline)
	return b.String()
}

// clean reports whether s needs no escaping (the common case: no copy).
func clean(s string, multiline bool) bool {
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c >= 0x20 && c < 0x7f || multiline && (c == '\n' || c == '\t') {
			continue
		}
		if c < 0x80 {
			return false
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && size == 1 || Unsafe(r) {
			return false
		}
		i += size - 1
	}
	return true
}

func writeEscaped(b *strings.Builder, s string, multiline bool) {
	for i := 0; i < len(s); {
		r, size := utf8.DecodeRuneInString(s[i:])
		switch {
		case r == utf8.RuneError && size == 1:
			fmt.Fprintf(b, `\x%02x`, s[i])
		case multiline && (r == '\n' || r == '\t'):
			b.WriteRune(r)
		case r == '\n':
			b.WriteString(`\n`)
		case r == '\t':
			b.WriteString(`\t`)
		case r == '\r':
			b.WriteString(`\r`)
		case r < 0x80 && Unsafe(r):
			fmt.Fprintf(b, `\x%02x`, r)
		case Unsafe(r) && r <= 0xffff:
			fmt.Fprintf(b, `\u%04x`, r)
		case Unsafe(r):
			fmt.Fprintf(b, `\U%08x`, r)
		default:
			b.WriteString(s[i : i+size])
		}
		i += size
	}
}

// Writer neutralises everything written through it with Text (newline and
// tab stay) before passing it on. It keeps no state: a rune split across
// two writes is shown as its bytes (\xe2...), never passed raw.
type Writer struct{ W io.Writer }

// NewWriter returns a Writer on w; a *Writer is returned as is.
func NewWriter(w io.Writer) io.Writer {
	if _, ok := w.(*Writer); ok {
		return w
	}
	return &Writer{W: w}
}

// Write implements io.Writer; it reports len(p) on success.
func (w *Writer) Write(p []byte) (int, error) {
	s := string(p)
	if _, err := io.WriteString(w.W, Text(s)); err != nil {
		return 0, err
	}
	return len(p), nil
}

// JSONWriter passes encoding/json's output on with the runes it leaves raw
// and a terminal would act on (DEL, C1, bidi and invisible format runes,
// a C0 control other than newline and tab) written as \uXXXX escapes:
// inside a JSON string they decode to the same text, and JSON's structure
// is ASCII, so nothing else changes. Invalid UTF-8 (encoding/json never
// writes it) becomes \ufffd, as encoding/json itself would decode it.
type JSONWriter struct{ W io.Writer }

// Write implements io.Writer; it reports len(p) on success.
func (w *JSONWriter) Write(p []byte) (int, error) {
	if _, err := io.WriteString(w.W, jsonEscape(string(p))); err != nil {
		return 0, err
	}
	return len(p), nil
}

// jsonEscape writes every unsafe rune of s but newline and tab as a JSON
// \uXXXX escape (a surrogate pair above U+FFFF) and invalid UTF-8 as
// \ufffd.
func jsonEscape(s string) string {
	if clean(s, true) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); {
		r, size := utf8.DecodeRuneInString(s[i:])
		switch {
		case r == utf8.RuneError && size == 1:
			b.WriteString(`\ufffd`)
		case r == '\n' || r == '\t' || !Unsafe(r):
			b.WriteString(s[i : i+size])
		case r <= 0xffff:
			fmt.Fprintf(&b, `\u%04x`, r)
		default:
			r1, r2 := utf16Pair(r)
			fmt.Fprintf(&b, `\u%04x\u%04x`, r1, r2)
		}
		i += size
	}
	return b.String()
}

// Stream neutralises a byte stream cut anywhere (another process's
// output, text or JSON: a remote --once run's): like JSONWriter, so JSON
// stays the same value and text shows \u001b for ESC; a rune split
// between two writes is held until its end arrives. Flush writes what is
// still held (as \ufffd: it never ended). Not safe for concurrent use.
type Stream struct {
	W    io.Writer
	held []byte
}

// Write implements io.Writer; it reports len(p) on success.
func (s *Stream) Write(p []byte) (int, error) {
	data := append(s.held, p...)
	cut := len(data)
	// Hold an incomplete rune at the end (at most UTFMax-1 bytes).
	for k := 1; k < utf8.UTFMax && k <= len(data); k++ {
		if utf8.RuneStart(data[len(data)-k]) {
			if !utf8.FullRune(data[len(data)-k:]) {
				cut = len(data) - k
			}
			break
		}
	}
	s.held = append([]byte(nil), data[cut:]...)
	if _, err := io.WriteString(s.W, jsonEscape(string(data[:cut]))); err != nil {
		return 0, err
	}
	return len(p), nil
}

// Flush writes what is held.
func (s *Stream) Flush() error {
	if len(s.held) == 0 {
		return nil
	}
	_, err := io.WriteString(s.W, jsonEscape(string(s.held)))
	s.held = nil
	return err
}

// utf16Pair is r's UTF-16 surrogate pair (r > 0xffff).
func utf16Pair(r rune) (rune, rune) {
	r -= 0x10000
	return 0xd800 + (r>>10)&0x3ff, 0xdc00 + r&0x3ff
}
