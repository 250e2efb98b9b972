package clip

import (
	"strconv"
	"strings"
	"testing"
	"unicode/utf8"
)

func TestString(t *testing.T) {
	if got := String("short", 10); got != "short" {
		t.Errorf("got %q", got)
	}
	long := strings.Repeat("a", 2<<20)
	got := String(long, Max)
	if len(got) > Max+32 || !strings.HasPrefix(got, strings.Repeat("a", Max)) || !strings.HasSuffix(got, "…[clipped 2093056 bytes]") {
		t.Errorf("got len %d suffix %q", len(got), got[len(got)-30:])
	}
	// never splits a rune
	got = String(strings.Repeat("é", 10), 5)
	if !utf8.ValidString(got) || !strings.HasPrefix(got, "éé…") {
		t.Errorf("got %q", got)
	}
}

func TestJoin(t *testing.T) {
	if got := Join([]string{"a", "b"}, " ", 10); got != "a b" {
		t.Errorf("got %q", got)
	}
	argv := []string{"iptables-restore", strings.Repeat("x", 2<<20), "y"}
	got := Join(argv, " ", Max)
	if len(got) > Max+32 || !strings.HasPrefix(got, "iptables-restore xxx") || !strings.Contains(got, "…[clipped ") {
		t.Errorf("got len %d", len(got))
	}
	want := len("iptables-restore ") + 2<<20 + 2 - Max
	if !strings.HasSuffix(got, "[clipped "+strconv.Itoa(want)+" bytes]") {
		t.Errorf("suffix %q, want %d clipped", got[len(got)-30:], want)
	}
}

func TestExcerpt(t *testing.T) {
	got := Excerpt([]byte("secret\x1b[31m\nok"), 8)
	if got != `"secret.["…[6 more bytes]` {
		t.Errorf("got %s", got)
	}
}

func FuzzClip(f *testing.F) {
	f.Add("abc", 2)
	f.Add("ééé", 3)
	f.Fuzz(func(t *testing.T, s string, max int) {
		if max > 1<<16 || max < -1 {
			return
		}
		got := String(s, max)
		if len(got) > max+40 && max >= 0 {
			t.Fatalf("String(%d bytes, %d) = %d bytes", len(s), max, len(got))
		}
		if utf8.ValidString(s) && !utf8.ValidString(got) {
			t.Fatalf("invalid UTF-8 from valid input")
		}
		j := Join([]string{s, s}, " ", max)
		if max >= 0 && len(j) > max+40 {
			t.Fatalf("Join = %d bytes", len(j))
		}
		e := Excerpt([]byte(s), max)
		if max >= 0 && utf8.RuneCountInString(e) > 4*max+60 {
			t.Fatalf("Excerpt = %d", len(e))
		}
	})
}
