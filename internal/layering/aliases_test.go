package layering

import (
	"go/ast"
	"go/parser"
	"go/token"
	"testing"
)

// TestSharedTypesHaveOneName: a type shared across layers has one name,
// where it is defined; no package gives another package's type or
// constant a second name (type Finding = finding.Finding, const Warning =
// finding.Warning).
func TestSharedTypesHaveOneName(t *testing.T) {
	eachSource(t, []string{"detect", "remediate", "policy", "internal"}, 100, nil, func(fset *token.FileSet, f *ast.File) {
		for _, n := range secondNames(f) {
			t.Errorf("%s: %s", fset.Position(n.Pos()), n.key)
		}
	})
}

// TestSecondNamesFound: the check finds what it is for.
func TestSecondNamesFound(t *testing.T) {
	const src = `package x
type Finding = finding.Finding
type Option = func(*Type)
const Warning = finding.Warning
const limit = 3
type own struct{}`
	f, err := parser.ParseFile(token.NewFileSet(), "x.go", src, 0)
	if err != nil {
		t.Fatal(err)
	}
	if got := len(secondNames(f)); got != 2 {
		t.Errorf("found %d, want 2", got)
	}
}

// secondNames finds type aliases and constants that rename another
// package's declaration.
func secondNames(f *ast.File) []flagged {
	var out []flagged
	for _, d := range f.Decls {
		g, ok := d.(*ast.GenDecl)
		if !ok {
			continue
		}
		for _, s := range g.Specs {
			switch x := s.(type) {
			case *ast.TypeSpec:
				if sel, ok := x.Type.(*ast.SelectorExpr); ok && x.Assign.IsValid() {
					out = append(out, flagged{x, "type " + x.Name.Name + " is another name of " + exprName(sel)})
				}
			case *ast.ValueSpec:
				if g.Tok != token.CONST {
					continue
				}
				for i, v := range x.Values {
					if sel, ok := v.(*ast.SelectorExpr); ok && i < len(x.Names) && x.Names[i].Name == sel.Sel.Name {
						out = append(out, flagged{x, "const " + x.Names[i].Name + " is another name of " + exprName(sel)})
					}
				}
			}
		}
	}
	return out
}

func exprName(s *ast.SelectorExpr) string {
	if id, ok := s.X.(*ast.Ident); ok {
		return id.Name + "." + s.Sel.Name
	}
	return s.Sel.Name
}
