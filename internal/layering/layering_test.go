package layering

import (
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

const module = "github.com/remediate-dev/remediate/"

// floors, bottom up, by package path prefix (the longest match wins). A
// package may import lower floors, and its own floor only within the same
// prefix (internal/node bundles the other adapters): detect and
// remediate/action are siblings and import neither each other nor anything
// above.
var floors = map[string]int{
	"internal/finding":                 0,
	"internal/boundedfile":             0, // the one file opener, for every floor
	"policy":                           1,
	"internal":                         1,
	"detect":                           2,
	"remediate/action":                 2,
	"remediate/guardrails":             3,
	"remediate/journal":                3,
	"remediate":                        4,
	"remediate/daemon":                 5,
	"remediate/exporters":              5,
	"cmd":                              6,
	"internal/testing":                 6, // test harnesses may use anything
	"internal/testing/deploytest":      7, // installs deploy/ (floor 6) on a test control plane
	"internal/testing/clusterload":     8, // bench-fleet: runs daemons as deploytest's ServiceAccount
	"internal/kube/e2e":                6,
	"tools":                            6,
	"deploy":                           6,
	"internal/layering":                6,
	"internal/netnstest":               6,
	"internal/cluster/clustertest":     6,
	"internal/conntrack/conntracktest": 6,
}

func floorOf(pkg string) (int, string, bool) {
	best, f := "", 0
	for p, n := range floors {
		if (pkg == p || strings.HasPrefix(pkg, p+"/")) && len(p) > len(best) {
			best, f = p, n
		}
	}
	return f, best, best != ""
}

// TestNoImportFromAHigherFloor parses every non-test file of the module.
func TestNoImportFromAHigherFloor(t *testing.T) {
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	checked := 0
	err = filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if n := d.Name(); n == "_output" || n == "bin" || n == "testdata" || (strings.HasPrefix(n, ".") && path != root) {
				return filepath.SkipDir
			}
			if _, err := os.Stat(filepath.Join(path, "go.mod")); err == nil && path != root {
				return filepath.SkipDir // another module (tools/controlplane)
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		rel, _ := filepath.Rel(root, filepath.Dir(path))
		pkg := filepath.ToSlash(rel)
		from, fromKey, ok := floorOf(pkg)
		if !ok {
			t.Errorf("%s: package %s has no floor: add it to floors and docs/DESIGN.md (Code layout)", path, pkg)
			return nil
		}
		f, err := parser.ParseFile(token.NewFileSet(), path, nil, parser.ImportsOnly)
		if err != nil {
			return err
		}
		for _, imp := range f.Imports {
			ip, _ := strconv.Unquote(imp.Path.Value)
			dep, ours := strings.CutPrefix(ip, module)
			if !ours {
				continue
			}
			checked++
			to, toKey, ok := floorOf(dep)
			switch {
			case !ok:
				t.Errorf("%s imports %s, which has no floor", path, dep)
			case to > from:
				t.Errorf("%s (floor %d) imports %s (floor %d): a higher floor", pkg, from, dep, to)
			case to == from && toKey != fromKey:
				t.Errorf("%s imports its sibling %s (both floor %d)", pkg, dep, to)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if checked < 50 {
		t.Fatalf("only %d imports checked: is the walk broken?", checked)
	}
}
