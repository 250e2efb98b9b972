package cni

import (
	"bufio"
	"os"
	"strings"
	"testing"
	"unicode/utf8"
)

// TestClassifyFailureUpstreamTexts classifies the messages of
// testdata/sandbox_failures.txt: the upstream error texts (repository,
// path and commit cited there) inside the kubelet's and containerd's
// wrapping.
func TestClassifyFailureUpstreamTexts(t *testing.T) {
	f, err := os.Open("testdata/sandbox_failures.txt")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	seen := map[FailureKind]int{}
	sc := bufio.NewScanner(f)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		kind, msg, ok := strings.Cut(line, "\t")
		if !ok {
			t.Fatalf("bad line %q", line)
		}
		msg = strings.ReplaceAll(msg, `\n`, "\n")
		if got := ClassifyFailure(msg); got != FailureKind(kind) {
			t.Errorf("ClassifyFailure(%q) = %s, want %s", msg, got, kind)
		}
		seen[FailureKind(kind)]++
	}
	for _, k := range []FailureKind{FailureIPAMExhausted, FailurePluginMissing, FailureConfig, FailureAgentUnreachable, FailureXtablesLock, FailureUnknown} {
		if seen[k] == 0 {
			t.Errorf("no case of %s", k)
		}
	}
}

func TestFailureTally(t *testing.T) {
	var tl FailureTally
	if _, ok := tl.Top(); ok {
		t.Fatal("empty tally has a top")
	}
	tl.Add("rpc error: code = DeadlineExceeded", 9, 1)
	tl.Add("failed to allocate for range 0: no IP addresses available in range set: 10.0.0.2-10.0.0.3", 3, 5)
	tl.Add("no IP addresses available in range set: 10.0.0.2-10.0.0.3\nsecond", 2, 7)
	tl.Add("failed to find plugin \"bridge\" in path [/opt/cni/bin]", 0, 2) // 0 counts as 1
	top, ok := tl.Top()
	if !ok || top.Kind != FailureIPAMExhausted || top.Count != 5 || top.Example != "no IP addresses available in range set: 10.0.0.2-10.0.0.3 second" {
		t.Fatalf("top %+v (known kinds win over Unknown's 9)", top)
	}
	cs := tl.Counts()
	if len(cs) != 3 || cs[0].Kind != FailureUnknown || cs[0].Count != 9 || cs[2].Kind != FailurePluginMissing || cs[2].Count != 1 {
		t.Fatalf("counts %+v", cs)
	}
	var only FailureTally
	only.Add("weird", 1, 0)
	if top, _ := only.Top(); top.Kind != FailureUnknown {
		t.Fatalf("only unknown: %+v", top)
	}
}

func TestSanitizeFailure(t *testing.T) {
	for in, want := range map[string]string{
		"a\n\tb\x00\x1b[31mc  d\r\n": "a b [31mc d",
		"\xff\xfeok":                 "?ok",
		"":                           "",
	} {
		if got := SanitizeFailure(in); got != want {
			t.Errorf("SanitizeFailure(%q) = %q, want %q", in, got, want)
		}
	}
	full := "Failed to create pod sandbox: rpc error: code = Unknown desc = failed to setup network for sandbox \"5d1b0b4f0a9e8c2a3f7b6d5e4c3b2a1908f7e6d5c4b3a29180f7e6d5c4b3a291\": plugin type=\"bridge\" failed (add): failed to allocate for range 0: no IP addresses available in range set: 10.244.0.2-10.244.0.3"
	if got, want := SanitizeFailure(full), `failed to setup network for sandbox "5d1b0b4f0a9e": plugin type="bridge" failed (add): failed to allocate for range 0: no IP addresses available in range set: 10.244.0.2-10.244.0.3`; got != want {
		t.Errorf("got %q, want %q", got, want)
	}
	if got := SanitizeFailure(strings.Repeat("é", 10000)); len(got) > MaxFailureMessage+32 || !utf8.ValidString(got) {
		t.Errorf("long: %d bytes, valid %v", len(got), utf8.ValidString(got))
	}
}

// FuzzClassifyFailure: any text classifies without panic to a known kind,
// and sanitises to bounded, printable, valid UTF-8 without newlines.
func FuzzClassifyFailure(f *testing.F) {
	if b, err := os.ReadFile("testdata/sandbox_failures.txt"); err == nil {
		for _, l := range strings.Split(string(b), "\n") {
			if _, msg, ok := strings.Cut(l, "\t"); ok {
				f.Add(msg)
			}
		}
	}
	f.Add("\x00\n\xff")
	f.Fuzz(func(t *testing.T, msg string) {
		switch ClassifyFailure(msg) {
		case FailureIPAMExhausted, FailurePluginMissing, FailureConfig, FailureAgentUnreachable, FailureXtablesLock, FailureUnknown:
		default:
			t.Fatalf("kind %q", ClassifyFailure(msg))
		}
		s := SanitizeFailure(msg)
		if len(s) > MaxFailureMessage+32 || !utf8.ValidString(s) || strings.ContainsAny(s, "\n\r\t\x00") {
			t.Fatalf("sanitised %q", s)
		}
		var tl FailureTally
		tl.Add(msg, 3, 1)
		if top, ok := tl.Top(); !ok || top.Count != 3 {
			t.Fatalf("tally %+v", top)
		}
	})
}
