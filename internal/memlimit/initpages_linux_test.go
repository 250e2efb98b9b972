package memlimit

import (
	"os"
	"strconv"
	"strings"
	"testing"
)

func rssFile(t *testing.T) int {
	t.Helper()
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		t.Skip(err)
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "RssFile:"); ok {
			n, _ := strconv.Atoi(strings.Fields(v)[0])
			return n
		}
	}
	t.Skip("no RssFile")
	return 0
}

// TestDropInitPages: the test binary's read-only pages leave the RSS and
// the program keeps running (code faulted back in as needed).
func TestDropInitPages(t *testing.T) {
	before := rssFile(t)
	n, err := DropInitPages()
	if err != nil {
		t.Fatal(err)
	}
	after := rssFile(t)
	t.Logf("advised %d KiB; RssFile %d -> %d KiB", n>>10, before, after)
	if n == 0 || after >= before {
		t.Fatalf("nothing dropped: advised %d, RssFile %d -> %d KiB", n, before, after)
	}
	// Still runs: a map, a goroutine, strconv, a closure.
	done := make(chan string)
	go func() { done <- strconv.Itoa(len(map[string]int{"a": 1})) }()
	if <-done != "1" {
		t.Fatal("?")
	}
}
