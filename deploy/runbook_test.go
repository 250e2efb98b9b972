package deploy

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// The runbook opens with a symptom index (before §0) whose every link
// lands on an anchor of the runbook, covering the symptoms on-call names
// first; "kube-proxy healthy but a Service does not work" has an entry of
// its own that links onwards.
func TestRunbookSymptomIndex(t *testing.T) {
	b, err := os.ReadFile(filepath.Join(Dir(), "..", "examples", "RUNBOOK.md"))
	if err != nil {
		t.Fatal(err)
	}
	rb := string(b)
	start := strings.Index(rb, "## Symptom index")
	zero := strings.Index(rb, "## 0. ")
	if start < 0 || zero < 0 || start > zero {
		t.Fatalf("no '## Symptom index' before '## 0.' (index at %d, §0 at %d)", start, zero)
	}
	index := rb[start:zero]
	ids := map[string]bool{}
	for _, m := range regexp.MustCompile(`<a id="([^"]+)"></a>`).FindAllStringSubmatch(rb, -1) {
		ids[m[1]] = true
	}
	links := regexp.MustCompile(`\]\(#([^)]+)\)`).FindAllStringSubmatch(index, -1)
	if len(links) < 10 {
		t.Errorf("the index links %d sections", len(links))
	}
	for _, l := range links {
		if !ids[l[1]] {
			t.Errorf("index links #%s, which no <a id> of the runbook defines", l[1])
		}
	}
	for _, symptom := range []string{"ContainerCreating", "kube-proxy healthy, but a Service does not work", "table full", "dead backend"} {
		if !strings.Contains(index, symptom) {
			t.Errorf("the index has no row for %q", symptom)
		}
	}
	// The entry for a healthy kube-proxy and a broken Service.
	i := strings.Index(rb, `<a id="s-service-broken"></a>`)
	if i < zero {
		t.Fatal("no entry s-service-broken after the index")
	}
	entry := rb[i:]
	if j := strings.Index(entry[1:], "\n<a id="); j > 0 {
		entry = entry[:j]
	}
	for _, l := range regexp.MustCompile(`\]\(#([^)]+)\)`).FindAllStringSubmatch(entry, -1) {
		if !ids[l[1]] {
			t.Errorf("s-service-broken links #%s, which does not exist", l[1])
		}
	}
	for _, rule := range []string{"service-path-probe", "dataplane-drift", "kube-proxy-not-hearing-api", "endpointslices"} {
		if !strings.Contains(entry, rule) {
			t.Errorf("s-service-broken does not mention %s", rule)
		}
	}
}
