package layering

import (
	"go/ast"
	"go/parser"
	"go/token"
	"strings"
	"testing"
)

// TestOneSpellingOfTheTargetKey: the (rule, target) key is written by
// guardrails.TargetKey and read by guardrails.RuleOfKey only; and an action
// learns the kind of its target from the finding's Subject, not from the
// target's prefix. Neither comes back under remediate/ or cmd/.
func TestOneSpellingOfTheTargetKey(t *testing.T) {
	theOne := func(path string) bool { return strings.HasSuffix(path, "remediate/guardrails/guardrail.go") }
	eachSource(t, []string{"remediate", "cmd"}, 40, theOne, func(fset *token.FileSet, f *ast.File) {
		for _, n := range keySpellings(f) {
			t.Errorf("%s: %s", fset.Position(n.Pos()), n.key)
		}
	})
}

// TestKeySpellingsFound: the check finds what it is for.
func TestKeySpellingsFound(t *testing.T) {
	const src = `package x
func f(d Decision, rule string, f Finding) {
	_ = d.Rule + "|" + d.Target
	_ = rule + "|" + f.Target
	_, _, _ = strings.Cut(k, "|")
	_ = strings.HasPrefix(f.Target, "pod/")
	_ = rec.Detector + "|" + rec.Target
	_ = guardrails.TargetKey(d.Rule, d.Target) + "|" + outcome
}`
	f, err := parser.ParseFile(token.NewFileSet(), "x.go", src, 0)
	if err != nil {
		t.Fatal(err)
	}
	if got := len(keySpellings(f)); got != 4 {
		t.Errorf("found %d, want 4: %v", got, keySpellings(f))
	}
}

// keySpellings finds rule+"|"+..., strings.Cut/Split of "|", and a
// finding's Target tested by prefix.
func keySpellings(f *ast.File) []flagged {
	name := func(e ast.Expr) string {
		switch x := e.(type) {
		case *ast.Ident:
			return x.Name
		case *ast.SelectorExpr:
			return x.Sel.Name
		}
		return ""
	}
	bar := func(e ast.Expr) bool {
		l, ok := e.(*ast.BasicLit)
		return ok && l.Kind == token.STRING && l.Value == `"|"`
	}
	var out []flagged
	ast.Inspect(f, func(n ast.Node) bool {
		switch x := n.(type) {
		case *ast.BinaryExpr:
			// rule + "|" parses as ((rule + "|") + target).
			if x.Op == token.ADD && bar(x.Y) && strings.EqualFold(name(x.X), "rule") {
				out = append(out, flagged{x, `rule+"|": use guardrails.TargetKey`})
			}
		case *ast.CallExpr:
			fn := name(x.Fun)
			if (fn == "Cut" || fn == "Split" || fn == "SplitN") && len(x.Args) > 1 && bar(x.Args[1]) {
				out = append(out, flagged{x, `cut at "|": use guardrails.RuleOfKey`})
			}
			if strings.Contains(fn, "Prefix") && len(x.Args) > 0 && name(x.Args[0]) == "Target" {
				out = append(out, flagged{x, "the target's kind by its prefix: read finding.Subject.Kind and decode with that kind's typed reference"})
			}
		}
		return true
	})
	return out
}
