package docs

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"

	"github.com/remediate-dev/remediate/remediate/action"
)

const (
	design           = "docs/DESIGN.md"
	checklistHeading = "### Adding a detector, an action or an adapter"
)

// demand is what another test requires of a new type: the file it makes
// someone edit and the test that fails until they do. mentions is text of
// the test function's source that shows it reads that file, so this list
// cannot silently name a test that no longer checks it.
type demand struct{ file, test, mentions string }

// demands are the files the other tests require of a new detector, action
// or adapter. TestDesignChecklistIsTrue finds every test that enumerates
// the registered types (enumerating) and fails when one is not here.
var demands = []demand{
	{"detect/<type>.go", "TestDetectorFilesNamedAfterTheirTypes", `"detect"`},
	{"detect/<type>.go", "TestDetectorsHoldNoModel", `"detect"`},
	{"detect/<type>.go", "TestDetectorFilesStandAlone", `"detect"`},
	{"detect/clusterview_test.go", "TestUsesClusterViewDeclared", "UsesClusterView"},
	{"remediate/action/<type>.go", "TestAPIReadersDeclare", `parseDir(t, ".")`},
	{"internal/node/node.go", "TestAPIReadersDeclare", "apiFields()"},
	{"cmd/remediate/paramdocs_gen.go", "TestParamDocsUpToDate", "paramDocsFile"},
	{"README.md", "TestREADMEListsEveryDetector", `"README.md"`},
	{"docs/DETECTORS.md", "TestDETECTORSNamesEveryType", "detectorsDoc"},
	{"examples/RUNBOOK.md", "TestRunbookAnchorsMatchTypes", "runbook"},
	{"examples/RUNBOOK.md", "TestRunbookFindingIndex", "runbook"},
	{"examples/RUNBOOK.md", "TestPolicyTypesPrintsRunbookAnchors", "runbookFile"},
	{"examples/audit.yaml", "TestEnforceKeepsAuditDetections", `"audit.yaml"`},
	{"examples/enforce.yaml", "TestEnforceKeepsAuditDetections", `"enforce.yaml"`},
	{"examples/audit.yaml", "TestExamplePoliciesAreValid", `"../../examples/*.yaml"`},
	{"deploy/helm/remediate/files/audit.yaml", "TestChartPolicyFilesMatchExamples", `ChartDir(), "files"`},
	{"deploy/helm/remediate/files/enforce.yaml", "TestChartPolicyFilesMatchExamples", `ChartDir(), "files"`},
	{"cmd/remediate/pairs_test.go", "TestPolicyTypesShowsPairs", `"PAIRS"`},
	{"docs/METRICS.md", "TestMetricsMatchREADME", "METRICS.md"},
	{"deploy/alerts/remediate.rules.yaml", "TestAlertsPromtool", "remediate.rules.yaml"},
	{"deploy/alerts/remediate.rules_test.yaml", "TestAlertsRunbook", `"remediate.rules_test.yaml"`},
	{"deploy/helm/remediate/files/remediate.rules.yaml", "TestChartAlertsMatch", "remediate.rules.yaml"},
	{"internal/layering/layering_test.go", "TestNoImportFromAHigherFloor", "floorOf("},
}

// notDemands enumerate the registered types but require nothing of a new
// one.
var notDemands = map[string]string{
	"TestAPIReadersDeclareFindsPlanted": "checks the check on planted sources",
	"TestDesignChecklistIsTrue":         "the discovery itself (it reads Define calls)",
	"TestDesignChecklistFindsPlanted":   "checks the discovery on planted sources",
}

// TestDesignChecklistIsTrue: docs/DESIGN.md's "Adding a detector, an
// action or an adapter" table names every file another test demands of a
// new type, on one row with that test; every file, directory and test it
// names exists; and every test that enumerates the registered types is a
// known demand.
func TestDesignChecklistIsTrue(t *testing.T) {
	root := ".."
	section, err := checklistSection(read(t, design))
	if err != nil {
		t.Fatal(err)
	}
	tests, err := testFuncs(root)
	if err != nil {
		t.Fatal(err)
	}
	if len(tests) < 300 {
		t.Fatalf("only %d test functions found: is the walk broken?", len(tests))
	}
	exists := func(rel string) bool { _, err := os.Stat(filepath.Join(root, rel)); return err == nil }
	for _, p := range checklistProblems(section, demands, exists, tests) {
		t.Error(p)
	}
	for _, d := range demands {
		tf, ok := tests[d.test]
		if ok && !strings.Contains(tf.body, d.mentions) {
			t.Errorf("%s (%s) no longer contains %q: does it still demand %s? update demands in docs/design_test.go", d.test, tf.file, d.mentions, d.file)
		}
	}
	known := map[string]bool{}
	for _, d := range demands {
		known[d.test] = true
	}
	found := 0
	for _, name := range sortedTestNames(tests) {
		if !tests[name].enumerates {
			continue
		}
		found++
		if !known[name] && notDemands[name] == "" {
			t.Errorf("%s (%s) enumerates the registered types, so it demands something of a new one: add it to demands in docs/design_test.go and its file to %s's table", name, tests[name].file, design)
		}
	}
	if found < 5 {
		t.Errorf("only %d tests enumerate the registered types: is the discovery broken?", found)
	}
}

// TestDesignChecklistFindsPlanted: the check names a demanded file the
// table omits, a file and a test that do not exist, a demand whose test
// is on another row, and finds a test enumerating types through a helper.
func TestDesignChecklistFindsPlanted(t *testing.T) {
	section := "| for | what | file or command | kept true by |\n|---|---|---|---|\n" +
		"| detector | code | `detect/<type>.go`, `detect/nosuch.go` | `TestDetectorFilesNamedAfterTheirTypes`, `TestNoSuch` |\n" +
		"| detector | docs | `docs/METRICS.md` | — |\n" +
		"| detector | metrics | `docs/PERFORMANCE.md` | `TestMetricsMatchREADME` |\n"
	ds := []demand{
		{"detect/<type>.go", "TestDetectorFilesNamedAfterTheirTypes", ""},
		{"README.md", "TestREADMEListsEveryDetector", ""},
		{"docs/METRICS.md", "TestMetricsMatchREADME", ""},
	}
	exists := func(rel string) bool { return rel == "detect" || strings.HasPrefix(rel, "docs/") }
	tests := map[string]testFunc{"TestDetectorFilesNamedAfterTheirTypes": {}, "TestREADMEListsEveryDetector": {}, "TestMetricsMatchREADME": {}}
	got := strings.Join(checklistProblems(section, ds, exists, tests), "\n")
	for _, want := range []string{"names detect/nosuch.go, which does not exist", "names test TestNoSuch, which does not exist",
		"no row names README.md with TestREADMEListsEveryDetector", "no row names docs/METRICS.md with TestMetricsMatchREADME"} {
		if !strings.Contains(got, want) {
			t.Errorf("problems lack %q:\n%s", want, got)
		}
	}
	if n := strings.Count(got, "\n") + 1; n != 4 {
		t.Errorf("%d problems, want 4:\n%s", n, got)
	}

	const src = `package x
func names(t *testing.T) (out []string) {
	for _, ty := range detect.Types() { out = append(out, ty.Name) }
	return out
}
func TestUsesHelper(t *testing.T) { _ = names(t) }
func TestDirect(t *testing.T) { _ = action.Types() }
func TestNeither(t *testing.T) { _ = detect.Lookup("X") }`
	idx := map[string]testFunc{}
	if err := addTestFuncs(idx, map[string][]byte{"x_test.go": []byte(src)}); err != nil {
		t.Fatal(err)
	}
	var enum []string
	for _, n := range sortedTestNames(idx) {
		if idx[n].enumerates {
			enum = append(enum, n)
		}
	}
	if !slices.Equal(enum, []string{"TestDirect", "TestUsesHelper"}) {
		t.Errorf("enumerating %v, want [TestDirect TestUsesHelper]", enum)
	}
}

const detectorsDoc = "docs/DETECTORS.md"

// TestDETECTORSNamesEveryType: docs/DETECTORS.md names every detector type
// and every action type that is not an old name of another.
func TestDETECTORSNamesEveryType(t *testing.T) {
	doc := read(t, detectorsDoc)
	for _, n := range detectorNames(t) {
		if !strings.Contains(doc, "`"+n+"`") {
			t.Errorf("%s does not name detector %s: add its row (the full conditions)", detectorsDoc, n)
		}
	}
	for _, n := range actionNames(t) {
		if ty, _ := action.Lookup(n); ty.ReplacedBy == "" && !strings.Contains(doc, "`"+n+"`") {
			t.Errorf("%s does not name action %s: name it in the remedy column of the detectors it serves", detectorsDoc, n)
		}
	}
}

// checklistSection is the text of the checklist section of DESIGN.md.
func checklistSection(md string) (string, error) {
	i := strings.Index(md, "\n"+checklistHeading+"\n")
	if i < 0 {
		return "", fmt.Errorf("%s has no %q section", design, checklistHeading)
	}
	rest := md[i+1+len(checklistHeading):]
	if j := regexp.MustCompile(`\n#{2,3} `).FindStringIndex(rest); j != nil {
		rest = rest[:j[0]]
	}
	return rest, nil
}

var (
	backticked = regexp.MustCompile("`([^`\n]+)`")
	testName   = regexp.MustCompile(`^Test[A-Z0-9]\w*$`)
)

// checklistProblems checks the section's table: every backticked path in
// its "file or command" column exists (for a placeholder such as
// detect/<type>.go: its directory), every backticked test name in the
// section exists, and each demand has a row naming both its file and its
// test.
func checklistProblems(section string, ds []demand, exists func(rel string) bool, tests map[string]testFunc) []string {
	var out []string
	var rows [][]string
	for _, line := range strings.Split(section, "\n") {
		if !strings.HasPrefix(line, "| ") {
			continue
		}
		cells := strings.Split(strings.Trim(line, "| "), " | ")
		if len(cells) != 4 {
			out = append(out, fmt.Sprintf("%s: row with %d cells, want 4 (for, what, file or command, kept true by): %s", design, len(cells), line))
			continue
		}
		rows = append(rows, cells)
		for _, m := range backticked.FindAllStringSubmatch(cells[2], -1) {
			p := m[1]
			if strings.Contains(p, " ") {
				continue // a command
			}
			check := p
			if i := strings.Index(p, "<"); i >= 0 {
				check = strings.TrimSuffix(p[:i], "/")
			}
			if !exists(strings.TrimSuffix(check, "/")) {
				out = append(out, fmt.Sprintf("%s names %s, which does not exist", design, p))
			}
		}
	}
	if len(rows) < 2 {
		out = append(out, fmt.Sprintf("%s: the checklist has %d table rows", design, len(rows)))
	}
	for _, m := range backticked.FindAllStringSubmatch(section, -1) {
		if testName.MatchString(m[1]) {
			if _, ok := tests[m[1]]; !ok {
				out = append(out, fmt.Sprintf("%s names test %s, which does not exist", design, m[1]))
			}
		}
	}
	for _, d := range ds {
		ok := slices.ContainsFunc(rows, func(r []string) bool {
			return strings.Contains(r[2], "`"+d.file+"`") && strings.Contains(r[3], "`"+d.test+"`")
		})
		if !ok {
			out = append(out, fmt.Sprintf("%s: no row names %s with %s, which demands it of a new type", design, d.file, d.test))
		}
	}
	return out
}

// testFunc is one Test function of the module.
type testFunc struct {
	file, body string
	// enumerates: it, or a function of its file it calls, walks the
	// registered detector or action types (detect.Types, action.Types,
	// Types() inside those packages) or their Define calls.
	enumerates bool
}

// testFuncs indexes every Test function of the module under root.
func testFuncs(root string) (map[string]testFunc, error) {
	byDir := map[string]map[string][]byte{}
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (strings.HasPrefix(d.Name(), ".") && path != root || d.Name() == "testdata" || d.Name() == "_output") {
			return filepath.SkipDir
		}
		if d.IsDir() || !strings.HasSuffix(path, "_test.go") {
			return nil
		}
		src, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, path)
		dir := filepath.Dir(rel)
		if byDir[dir] == nil {
			byDir[dir] = map[string][]byte{}
		}
		byDir[dir][filepath.ToSlash(rel)] = src
		return nil
	})
	if err != nil {
		return nil, err
	}
	out := map[string]testFunc{}
	for _, files := range byDir {
		if err := addTestFuncs(out, files); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// addTestFuncs adds the Test functions of one directory's test files
// (file name -> source); helpers are followed across its files.
func addTestFuncs(out map[string]testFunc, files map[string][]byte) error {
	type fn struct {
		decl *ast.FuncDecl
		file string
		pkg  string
		fset *token.FileSet
	}
	funcs := map[string]fn{} // by package and name
	for file, src := range files {
		fset := token.NewFileSet()
		f, err := parser.ParseFile(fset, file, src, 0)
		if err != nil {
			return err
		}
		for _, d := range f.Decls {
			if fd, ok := d.(*ast.FuncDecl); ok && fd.Recv == nil && fd.Body != nil {
				funcs[f.Name.Name+"."+fd.Name.Name] = fn{fd, file, f.Name.Name, fset}
			}
		}
	}
	memo := map[string]bool{}
	var enumerates func(key string, seen map[string]bool) bool
	enumerates = func(key string, seen map[string]bool) bool {
		if v, ok := memo[key]; ok {
			return v
		}
		if seen[key] {
			return false
		}
		seen[key] = true
		me := funcs[key]
		inTypesPkg := me.pkg == "detect" || me.pkg == "action"
		found := false
		ast.Inspect(me.decl.Body, func(n ast.Node) bool {
			switch x := n.(type) {
			case *ast.SelectorExpr:
				if id, ok := x.X.(*ast.Ident); ok && (id.Name == "detect" || id.Name == "action") && x.Sel.Name == "Types" {
					found = true
				}
			case *ast.CallExpr:
				if id, ok := x.Fun.(*ast.Ident); ok {
					if inTypesPkg && id.Name == "Types" {
						found = true
					} else if _, ok := funcs[me.pkg+"."+id.Name]; ok && enumerates(me.pkg+"."+id.Name, seen) {
						found = true
					}
				}
			case *ast.BasicLit:
				if s, err := strconv.Unquote(x.Value); err == nil && x.Kind == token.STRING && s == "Define" {
					found = true
				}
			}
			return !found
		})
		memo[key] = found
		return found
	}
	for key, f := range funcs {
		name := f.decl.Name.Name
		if !strings.HasPrefix(name, "Test") || name == "TestMain" {
			continue
		}
		src := files[f.file]
		body := string(src[f.fset.Position(f.decl.Pos()).Offset:f.fset.Position(f.decl.End()).Offset])
		tf := testFunc{file: f.file, body: body, enumerates: enumerates(key, map[string]bool{})}
		if prev, ok := out[name]; ok { // the same name in another package
			tf = testFunc{file: prev.file + ", " + tf.file, body: prev.body + "\n" + body, enumerates: prev.enumerates || tf.enumerates}
		}
		out[name] = tf
	}
	return nil
}

func sortedTestNames(m map[string]testFunc) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// TestDesignListsTheKit: docs/DESIGN.md's code layout names every file of
// detect/'s kit (detect/kit_*.go, what more than one detector uses), and
// no kit file that is not there: a newcomer looking for a shared helper
// reads that table.
func TestDesignListsTheKit(t *testing.T) {
	files, err := filepath.Glob(filepath.Join("..", "detect", "kit_*.go"))
	if err != nil {
		t.Fatal(err)
	}
	var have []string
	for _, f := range files {
		if !strings.HasSuffix(f, "_test.go") {
			have = append(have, filepath.Base(f))
		}
	}
	if len(have) < 5 {
		t.Fatalf("only %d kit files in detect/: is the glob broken?", len(have))
	}
	named := map[string]bool{}
	for _, m := range regexp.MustCompile("`(kit_[a-z0-9_]+\\.go)`").FindAllStringSubmatch(read(t, design), -1) {
		named[m[1]] = true
	}
	for _, f := range have {
		if !named[f] {
			t.Errorf("%s does not name detect/%s: add it to the kit's table (Code layout)", design, f)
		}
		delete(named, f)
	}
	for f := range named {
		t.Errorf("%s names the kit file %s, which detect/ does not have", design, f)
	}
}
