// Package clip bounds strings that come from outside the daemon (command
// lines, HTTP bodies, file contents) before they go into findings, the
// journal, logs or the Node: a hostile process chooses its argv, a broken
// endpoint its body. A clipped string says so and how much was cut.
package clip

import (
	"fmt"
	"strings"
	"unicode"
	"unicode/utf8"
)

// Max is the default bound for one outside string in a finding or a
// journal record.
const Max = 4096

// String returns s when it is at most max bytes, else its first bytes (cut
// on a UTF-8 boundary) followed by a marker "…[clipped N bytes]". The
// result is at most max bytes plus the marker (under 32 bytes).
func String(s string, max int) string {
	if max < 0 {
		max = 0
	}
	if len(s) <= max {
		return s
	}
	cut := max
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + fmt.Sprintf("…[clipped %d bytes]", len(s)-cut)
}

// Join joins parts with sep and clips the result to max bytes without
// building more than about max bytes (an argv of many megabytes is never
// copied whole).
func Join(parts []string, sep string, max int) string {
	if max < 0 {
		max = 0
	}
	total := 0
	for i, p := range parts {
		if i > 0 {
			total += len(sep)
		}
		total += len(p)
	}
	var b strings.Builder
	for i, p := range parts {
		if b.Len() > max+utf8.UTFMax {
			break
		}
		if i > 0 {
			b.WriteString(sep)
		}
		if room := max + utf8.UTFMax + 1 - b.Len(); room >= 0 && len(p) > room {
			p = p[:room]
		}
		b.WriteString(p)
	}
	s := b.String()
	if total <= max {
		return s
	}
	cut := min(max, len(s))
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + fmt.Sprintf("…[clipped %d bytes]", total-cut)
}

// Excerpt is a short printable excerpt of a body for a message: at most max
// runes, control and non-printable characters replaced by '.', quoted.
func Excerpt(b []byte, max int) string {
	var sb strings.Builder
	n := 0
	for len(b) > 0 && n < max {
		r, size := utf8.DecodeRune(b)
		b = b[size:]
		if r == utf8.RuneError || !unicode.IsPrint(r) {
			r = '.'
		}
		sb.WriteRune(r)
		n++
	}
	s := fmt.Sprintf("%q", sb.String())
	if len(b) > 0 {
		s += fmt.Sprintf("…[%d more bytes]", len(b))
	}
	return s
}

// Values clips every string in a details map (recursively through maps
// and slices) to max bytes and keeps at most 64 elements of each slice and
// 64 keys of each map.
func Values(d map[string]any, max int) map[string]any {
	if d == nil {
		return nil
	}
	out := make(map[string]any, min(len(d), 65))
	for k, v := range d {
		if len(out) == 64 {
			out["…"] = fmt.Sprintf("%d more keys", len(d)-64)
			break
		}
		out[String(k, 256)] = value(v, max)
	}
	return out
}

func value(v any, max int) any {
	switch x := v.(type) {
	case string:
		return String(x, max)
	case []string:
		return items(x, func(s string) any { return String(s, max) })
	case []any:
		return items(x, func(e any) any { return value(e, max) })
	case []map[string]any:
		return items(x, func(e map[string]any) any { return Values(e, max) })
	case map[string]any:
		return Values(x, max)
	case fmt.Stringer:
		return String(x.String(), max)
	}
	return v
}

// items clips each of the first 64 elements of x and marks how many more
// there were.
func items[T any](x []T, clip func(T) any) []any {
	n := min(len(x), 64)
	out := make([]any, 0, n+1)
	for _, e := range x[:n] {
		out = append(out, clip(e))
	}
	if len(x) > n {
		out = append(out, fmt.Sprintf("…[%d more]", len(x)-n))
	}
	return out
}
