package layering

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"path/filepath"
	"strings"
	"testing"
)

// eachSource parses every non-test Go file under the repository's dirs
// (relative to its root), except those skip names, and hands each to
// check; fewer than minFiles read fails the test (a broken walk would
// otherwise pass every check built on it).
func eachSource(t *testing.T, dirs []string, minFiles int, skip func(path string) bool, check func(fset *token.FileSet, f *ast.File)) {
	t.Helper()
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	files := 0
	for _, dir := range dirs {
		err := filepath.WalkDir(filepath.Join(root, dir), func(path string, d fs.DirEntry, err error) error {
			if err != nil || d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
				return err
			}
			if skip != nil && skip(filepath.ToSlash(path)) {
				return nil
			}
			files++
			fset := token.NewFileSet()
			f, err := parser.ParseFile(fset, path, nil, 0)
			if err != nil {
				return err
			}
			check(fset, f)
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	if files < minFiles {
		t.Fatalf("only %d files read under %v: is the walk broken?", files, dirs)
	}
}
