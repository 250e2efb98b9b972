package layering

import (
	"go/ast"
	"go/parser"
	"go/token"
	"strings"
	"testing"
)

// TestOneWayToAddAGuardrail: a guardrail is a named field of
// guardrails.Cluster, put in order by guardrails.Chain (both in
// remediate/guardrails/chain.go) and built by the daemon's wiring. No
// second way comes back: no list of extra guardrails (a []Guardrail,
// map or variadic of them) anywhere else, no struct elsewhere holding a
// guardrail for the chain (an Options.Guardrails, a Cluster.Extra), and no
// list of guardrails in Cluster itself.
func TestOneWayToAddAGuardrail(t *testing.T) {
	theOne := func(path string) bool { return strings.HasSuffix(path, "remediate/guardrails/chain.go") }
	eachSource(t, []string{"remediate", "cmd", "internal", "detect", "policy"}, 100, theOne, func(fset *token.FileSet, f *ast.File) {
		for _, n := range secondGuardrailWays(f, false) {
			t.Errorf("%s: %s", fset.Position(n.Pos()), n.key)
		}
	})
	// chain.go itself: Cluster's fields are single guardrails, no list.
	eachSource(t, []string{"remediate/guardrails"}, 1, func(path string) bool { return !theOne(path) }, func(fset *token.FileSet, f *ast.File) {
		for _, n := range secondGuardrailWays(f, true) {
			t.Errorf("%s: %s", fset.Position(n.Pos()), n.key)
		}
	})
}

// TestSecondGuardrailWaysFound: the check finds what it is for.
func TestSecondGuardrailWaysFound(t *testing.T) {
	const src = `package x
type Options struct {
	Cluster    guardrails.Cluster
	Guardrails []guardrails.Guardrail
	Pause      guardrails.Guardrail
	ByName     map[string]guardrails.Guardrail
	held       []heldGuard
	h          guardrails.Holder
}
type Cluster struct {
	OptOut Guardrail
	Extra  []Guardrail
}
func f(c guardrails.Cluster, more ...guardrails.Guardrail) {
	_ = append([]guardrails.Guardrail{c.Budget}, more...)
	_ = append([]guardrails.Guardrail(nil), c.Extra...)
}`
	f, err := parser.ParseFile(token.NewFileSet(), "x.go", src, 0)
	if err != nil {
		t.Fatal(err)
	}
	// Elsewhere: Guardrails, Pause, ByName, Extra, OptOut, more, the
	// literal, the conversion.
	if got := len(secondGuardrailWays(f, false)); got != 8 {
		t.Errorf("found %d, want 8: %v", got, secondGuardrailWays(f, false))
	}
	// In chain.go: only the lists (Guardrails, ByName, Extra, more); the
	// lists Chain builds are its own.
	if got := len(secondGuardrailWays(f, true)); got != 4 {
		t.Errorf("in chain.go: found %d, want 4: %v", got, secondGuardrailWays(f, true))
	}
}

// secondGuardrailWays finds, outside chain.go, struct fields holding a
// Guardrail (one or many), variadic or list parameters of them and
// []Guardrail literals and conversions; in chain.go (inChain) only fields and parameters
// holding many.
func secondGuardrailWays(f *ast.File, inChain bool) []flagged {
	isGuardrail := func(e ast.Expr) bool {
		switch x := e.(type) {
		case *ast.Ident:
			return x.Name == "Guardrail"
		case *ast.SelectorExpr:
			return x.Sel.Name == "Guardrail"
		}
		return false
	}
	many := func(e ast.Expr) bool {
		switch x := e.(type) {
		case *ast.ArrayType:
			return isGuardrail(x.Elt)
		case *ast.MapType:
			return isGuardrail(x.Value)
		case *ast.Ellipsis:
			return isGuardrail(x.Elt)
		}
		return false
	}
	var out []flagged
	field := func(fl *ast.Field, what string) {
		name := "(unnamed)"
		if len(fl.Names) > 0 {
			name = fl.Names[0].Name
		}
		switch {
		case many(fl.Type):
			out = append(out, flagged{fl, what + " " + name + " holds a list of guardrails: add a named field to guardrails.Cluster and its place in guardrails.Chain instead"})
		case !inChain && isGuardrail(fl.Type) && what == "field":
			out = append(out, flagged{fl, "field " + name + " holds a guardrail outside guardrails.Cluster: add it there (one named field), ordered by guardrails.Chain"})
		}
	}
	ast.Inspect(f, func(n ast.Node) bool {
		switch x := n.(type) {
		case *ast.StructType:
			for _, fl := range x.Fields.List {
				field(fl, "field")
			}
		case *ast.FuncType:
			if x.Params != nil {
				for _, fl := range x.Params.List {
					field(fl, "parameter")
				}
			}
		case *ast.CompositeLit:
			if at, ok := x.Type.(*ast.ArrayType); ok && !inChain && isGuardrail(at.Elt) {
				out = append(out, flagged{x, "a list of guardrails built outside guardrails.Chain"})
			}
		case *ast.CallExpr: // []guardrails.Guardrail(nil), as a merge starts
			if at, ok := x.Fun.(*ast.ArrayType); ok && !inChain && isGuardrail(at.Elt) {
				out = append(out, flagged{x, "a list of guardrails built outside guardrails.Chain"})
			}
		}
		return true
	})
	return out
}
