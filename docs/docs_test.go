// Package docs holds the consistency tests of the documentation: README.md
// stays one screen's worth and lists every detector type once, linked to
// its runbook entry; examples/RUNBOOK.md has an anchor for every detector
// and action type and a finding index naming each detector; every relative
// link of README.md, docs/*.md and the runbook lands on a file and, for a
// Markdown file, on one of its anchors; docs/DETECTORS.md names every type,
// and docs/DESIGN.md's checklist for adding a type names every file the
// other tests demand of one (design_test.go). The package has no code,
// only these tests.
package docs

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"

	"github.com/remediate-dev/remediate/detect"
	"github.com/remediate-dev/remediate/remediate/action"
)

// maxREADMELines is issue 29's bound: what it is, quick start, what it
// detects, deploy, --once, configuration, where to read more. Everything
// else has a home under docs/.
const maxREADMELines = 300

const runbook = "examples/RUNBOOK.md"

func read(t *testing.T, rel string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("..", rel))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

var anchorID = regexp.MustCompile(`<a id="([^"]+)"></a>`)

// anchors are the explicit <a id> anchors of a Markdown text and the ids
// GitHub gives its headings.
func anchors(md string) map[string]bool {
	ids := map[string]bool{}
	for _, m := range anchorID.FindAllStringSubmatch(md, -1) {
		ids[m[1]] = true
	}
	inFence := false
	for _, line := range strings.Split(md, "\n") {
		if strings.HasPrefix(line, "```") {
			inFence = !inFence
			continue
		}
		if inFence || !strings.HasPrefix(line, "#") {
			continue
		}
		h := strings.TrimLeft(line, "#")
		if !strings.HasPrefix(h, " ") {
			continue
		}
		ids[slug(h)] = true
	}
	return ids
}

// slug is GitHub's heading id: lower case, punctuation dropped, spaces to
// hyphens.
func slug(h string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(strings.TrimSpace(h)) {
		switch {
		case r == ' ':
			b.WriteByte('-')
		case r == '-' || r == '_' || r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r > 127 && r != '—' && r != '≠' && r != '→' && r != '↔':
			b.WriteRune(r)
		}
	}
	return b.String()
}

func detectorAnchor(name string) string { return "detector-" + strings.ToLower(name) }
func actionAnchor(name string) string   { return "action-" + strings.ToLower(name) }

func detectorNames(t *testing.T) []string {
	var out []string
	for _, ty := range detect.Types() {
		out = append(out, ty.Name)
	}
	if len(out) < 30 {
		t.Fatalf("only %d detector types registered", len(out))
	}
	return out
}

func actionNames(t *testing.T) []string {
	var out []string
	for _, ty := range action.Types() {
		out = append(out, ty.Name)
	}
	if len(out) < 10 {
		t.Fatalf("only %d action types registered", len(out))
	}
	return out
}

// TestREADMEIsOneScreen: README.md has at most maxREADMELines lines.
func TestREADMEIsOneScreen(t *testing.T) {
	n := strings.Count(read(t, "README.md"), "\n")
	if n > maxREADMELines {
		t.Errorf("README.md has %d lines, at most %d: move detail to docs/ (TESTING.md, PERFORMANCE.md, DESIGN.md, ...) and link it", n, maxREADMELines)
	}
}

var runbookLink = regexp.MustCompile(`\(` + regexp.QuoteMeta(runbook) + `#(detector-[a-z0-9]+)\)`)

// TestREADMEListsEveryDetector: every registered detector type has exactly
// one README line, linking its runbook anchor and naming the type, and
// every detector anchor the README links is a registered type.
func TestREADMEListsEveryDetector(t *testing.T) {
	readme := read(t, "README.md")
	lines := map[string][]string{} // anchor -> README lines linking it
	for _, line := range strings.Split(readme, "\n") {
		for _, m := range runbookLink.FindAllStringSubmatch(line, -1) {
			lines[m[1]] = append(lines[m[1]], line)
		}
	}
	known := map[string]bool{}
	for _, name := range detectorNames(t) {
		a := detectorAnchor(name)
		known[a] = true
		switch ls := lines[a]; {
		case len(ls) == 0:
			t.Errorf("README.md has no line for detector %s: add a row to \"What it detects\" linking [`%s`](%s#%s)", name, name, runbook, a)
		case len(ls) > 1:
			t.Errorf("README.md links %s#%s on %d lines, want one line per detector", runbook, a, len(ls))
		case !strings.Contains(ls[0], "`"+name+"`"):
			t.Errorf("README.md's line for %s does not name it: %s", name, ls[0])
		}
	}
	for a := range lines {
		if !known[a] {
			t.Errorf("README.md links %s#%s, which is no registered detector type", runbook, a)
		}
	}
}

// TestRunbookAnchorsMatchTypes: examples/RUNBOOK.md defines
// <a id="detector-NAME"> for every detector type and <a id="action-NAME">
// for every action type (what `remediate policy types` prints), and no
// detector- or action- anchor of a type that does not exist.
func TestRunbookAnchorsMatchTypes(t *testing.T) {
	rb := read(t, runbook)
	ids := map[string]bool{}
	for _, m := range anchorID.FindAllStringSubmatch(rb, -1) {
		if ids[m[1]] {
			t.Errorf("%s defines anchor %s twice", runbook, m[1])
		}
		ids[m[1]] = true
	}
	want := map[string]string{}
	for _, n := range detectorNames(t) {
		want[detectorAnchor(n)] = "detector " + n
	}
	for _, n := range actionNames(t) {
		want[actionAnchor(n)] = "action " + n
	}
	for a, what := range want {
		if !ids[a] {
			t.Errorf("%s has no anchor for %s: add <a id=%q></a> before its section", runbook, what, a)
		}
	}
	for id := range ids {
		if (strings.HasPrefix(id, "detector-") || strings.HasPrefix(id, "action-")) && want[id] == "" {
			t.Errorf("%s defines anchor %s, which is no registered type", runbook, id)
		}
	}
}

// TestRunbookFindingIndex: the runbook's finding index (after the symptom
// index, before §0) has one row per detector type linking its anchor, and
// links every action type.
func TestRunbookFindingIndex(t *testing.T) {
	rb := read(t, runbook)
	start := strings.Index(rb, "## Finding index")
	zero := strings.Index(rb, "\n## 0. ")
	sym := strings.Index(rb, "## Symptom index")
	if start < 0 || zero < 0 || start > zero || sym < 0 || sym > start {
		t.Fatalf("no '## Finding index' between '## Symptom index' and '## 0.' (symptoms %d, index %d, §0 %d)", sym, start, zero)
	}
	index := rb[start:zero]
	for _, n := range detectorNames(t) {
		row := fmt.Sprintf("| `%s` | [", n)
		link := "(#" + detectorAnchor(n) + ")"
		if c := strings.Count(index, row); c != 1 {
			t.Errorf("the finding index has %d rows for %s, want 1", c, n)
		}
		if !strings.Contains(index, link) {
			t.Errorf("the finding index does not link %s", link)
		}
	}
	for _, n := range actionNames(t) {
		if !strings.Contains(index, "(#"+actionAnchor(n)+")") {
			t.Errorf("the finding index does not link action %s", n)
		}
	}
}

var (
	mdLink   = regexp.MustCompile(`\]\(([^)\s]+)\)`)
	codeSpan = regexp.MustCompile("``[^`]+``|`[^`\n]+`")
)

// stripCode drops fenced code blocks and inline code spans, whose
// brackets are not links.
func stripCode(md string) string {
	var b strings.Builder
	inFence := false
	for _, line := range strings.Split(md, "\n") {
		if strings.HasPrefix(strings.TrimSpace(line), "```") {
			inFence = !inFence
			continue
		}
		if !inFence {
			b.WriteString(codeSpan.ReplaceAllString(line, "``"))
			b.WriteByte('\n')
		}
	}
	return b.String()
}

// TestDocLinksResolve: every relative link of README.md, docs/*.md and the
// runbook names an existing file, and a fragment names an anchor of the
// Markdown file it points into (explicit <a id> or a heading).
func TestDocLinksResolve(t *testing.T) {
	files := []string{"README.md", runbook}
	ds, err := filepath.Glob(filepath.Join("..", "docs", "*.md"))
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range ds {
		files = append(files, filepath.ToSlash(strings.TrimPrefix(d, ".."+string(filepath.Separator))))
	}
	if !slices.Contains(files, "docs/TESTING.md") {
		t.Fatalf("docs/TESTING.md missing from %v", files)
	}
	cache := map[string]map[string]bool{}
	var bad []string
	for _, f := range files {
		md := stripCode(read(t, f))
		for _, m := range mdLink.FindAllStringSubmatch(md, -1) {
			target := m[1]
			if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
				continue
			}
			path, frag, _ := strings.Cut(target, "#")
			rel := f
			if path != "" {
				rel = filepath.ToSlash(filepath.Join(filepath.Dir(f), path))
				if _, err := os.Stat(filepath.Join("..", rel)); err != nil {
					bad = append(bad, fmt.Sprintf("%s: link %s: %v", f, target, err))
					continue
				}
			}
			if frag == "" || !strings.HasSuffix(rel, ".md") {
				continue
			}
			ids, ok := cache[rel]
			if !ok {
				ids = anchors(read(t, rel))
				cache[rel] = ids
			}
			if !ids[frag] {
				bad = append(bad, fmt.Sprintf("%s: link %s: %s has no anchor #%s", f, target, rel, frag))
			}
		}
	}
	sort.Strings(bad)
	for _, b := range bad {
		t.Error(b)
	}
}
