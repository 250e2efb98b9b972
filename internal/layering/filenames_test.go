package layering

import (
	"go/ast"
	"go/token"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// detectorFileMismatches are the files of detect/ that define detector
// types (detect.Define("Type", ...)) none of which their name says: a file
// is named after a type it defines, lower case, underscores ignored
// (kubeproxy_syncstale.go holds KubeProxySyncStale). A newcomer looking
// for a detector opens the file of its name.
func detectorFileMismatches(fset *token.FileSet, f *ast.File) (file string, types []string, ok bool) {
	ast.Inspect(f, func(n ast.Node) bool {
		call, isCall := n.(*ast.CallExpr)
		if !isCall || len(call.Args) == 0 {
			return true
		}
		if id, isIdent := call.Fun.(*ast.Ident); !isIdent || id.Name != "Define" {
			return true
		}
		if lit, isLit := call.Args[0].(*ast.BasicLit); isLit && lit.Kind == token.STRING {
			if s, err := strconv.Unquote(lit.Value); err == nil {
				types = append(types, s)
			}
		}
		return true
	})
	file = filepath.Base(fset.Position(f.Pos()).Filename)
	name := strings.ReplaceAll(strings.TrimSuffix(file, ".go"), "_", "")
	for _, ty := range types {
		if strings.ToLower(ty) == name {
			return file, types, true
		}
	}
	return file, types, len(types) == 0
}

// TestDetectorFilesNamedAfterTheirTypes: every file of detect/ that
// defines detectors is named after one of them.
func TestDetectorFilesNamedAfterTheirTypes(t *testing.T) {
	defining := 0
	eachSource(t, []string{"detect"}, 20, nil, func(fset *token.FileSet, f *ast.File) {
		file, types, ok := detectorFileMismatches(fset, f)
		if len(types) > 0 {
			defining++
		}
		if !ok {
			t.Errorf("detect/%s defines %v but is named after none of them (name it %s.go)", file, types, strings.ToLower(types[0]))
		}
	})
	if defining < 20 {
		t.Fatalf("only %d files of detect/ define detectors: is the Define match broken?", defining)
	}
}
