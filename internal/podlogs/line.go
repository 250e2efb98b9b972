package podlogs

import (
	"bytes"
	"errors"
	"time"
)

// Line is one CRI log line: "<RFC3339Nano time> <stream> <tag> <text>",
// stream stdout or stderr, tag F (a full line) or P (a partial one, the
// runtime split a long line).
type Line struct {
	Time   time.Time
	Stream string
	// Partial is the P tag.
	Partial bool
	Text    string
}

// maxLineText bounds a line's text (longer is cut).
const maxLineText = 16 << 10

var errLine = errors.New("not a CRI log line")

// ParseLine parses one CRI log line (without its newline).
func ParseLine(b []byte) (Line, error) {
	ts, rest, ok := bytes.Cut(b, []byte{' '})
	if !ok {
		return Line{}, errLine
	}
	t, err := time.Parse(time.RFC3339Nano, string(ts))
	if err != nil {
		return Line{}, errLine
	}
	stream, rest, ok := bytes.Cut(rest, []byte{' '})
	if !ok || (string(stream) != "stdout" && string(stream) != "stderr") {
		return Line{}, errLine
	}
	tag, text, ok := bytes.Cut(rest, []byte{' '})
	if !ok {
		// "... stdout F" with an empty text has no last space in some runtimes.
		tag, text = rest, nil
	}
	// The tag may carry more flags after ":" (reserved); the first is F or P.
	tagS, _, _ := bytes.Cut(tag, []byte{':'})
	if string(tagS) != "F" && string(tagS) != "P" {
		return Line{}, errLine
	}
	if len(text) > maxLineText {
		text = text[:maxLineText]
	}
	return Line{Time: t, Stream: string(stream), Partial: string(tagS) == "P", Text: string(bytes.TrimRight(text, "\r"))}, nil
}

// ParseLines parses a log file's bytes, joining partial lines to the full
// line that ends them; skipped counts the lines that did not parse.
func ParseLines(b []byte) (out []Line, skipped int) {
	var pending *Line
	for len(b) > 0 {
		var ln []byte
		if i := bytes.IndexByte(b, '\n'); i >= 0 {
			ln, b = b[:i], b[i+1:]
		} else {
			ln, b = b, nil
		}
		if len(ln) == 0 {
			continue
		}
		l, err := ParseLine(ln)
		if err != nil {
			skipped++
			continue
		}
		if pending != nil && pending.Stream == l.Stream {
			if len(pending.Text) < maxLineText {
				pending.Text += l.Text
				if len(pending.Text) > maxLineText {
					pending.Text = pending.Text[:maxLineText]
				}
			}
			pending.Partial = l.Partial
			l = *pending
			pending = nil
		}
		if l.Partial {
			pending = &l
			continue
		}
		out = append(out, l)
	}
	if pending != nil {
		out = append(out, *pending)
	}
	return out, skipped
}
