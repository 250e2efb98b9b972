package layering

import (
	"go/ast"
	"go/parser"
	"go/token"
	"strings"
	"testing"
)

// TestNoEvidenceReadByLiteralKey: across the seam between detectors and
// actions, what the engine and the actions read of a finding's target is
// its typed Subject (finding.Subject); the Evidence is a free-form map for
// people. No non-test file under remediate/ indexes a finding's Evidence
// with a string literal (f.Evidence["holdSeconds"]), nor passes Evidence
// and a string literal key to one call (finding.EvidenceInt(f.Evidence,
// "entries")). Keys named by the adapter that owns them (a typed
// reference's decoder, conntrack.EvidenceMax) are not literal reads.
func TestNoEvidenceReadByLiteralKey(t *testing.T) {
	eachSource(t, []string{"remediate"}, 20, nil, func(fset *token.FileSet, f *ast.File) {
		for _, r := range literalEvidenceReads(f) {
			t.Errorf("%s: evidence read by literal key %s: give the finding's Subject the fact (internal/finding/subject.go) and read that", fset.Position(r.Pos()), r.key)
		}
	})
}

// TestLiteralEvidenceReadsFound: the check finds the reads it is for (a
// check that cannot fail is no check).
func TestLiteralEvidenceReadsFound(t *testing.T) {
	const src = `package x
func f(f Finding, ev map[string]any) {
	_ = f.Evidence["holdsXtablesLock"] == true
	v, _ := finding.EvidenceInt(f.Evidence, "entries")
	_ = f.Evidence[procs.EvidenceHoldSeconds]
	_, _ = conntrack.DecodeBackendRef(f.Evidence)
	_ = ev["x"]
}`
	f, err := parser.ParseFile(token.NewFileSet(), "x.go", src, 0)
	if err != nil {
		t.Fatal(err)
	}
	var keys []string
	for _, r := range literalEvidenceReads(f) {
		keys = append(keys, r.key)
	}
	if strings.Join(keys, " ") != `"holdsXtablesLock" "entries"` {
		t.Errorf("found %v, want the two literal reads", keys)
	}
}

type flagged struct {
	ast.Node
	key string
}

// literalEvidenceReads finds X.Evidence["key"] and calls passing X.Evidence
// with a string literal.
func literalEvidenceReads(f *ast.File) []flagged {
	isEvidence := func(e ast.Expr) bool {
		s, ok := e.(*ast.SelectorExpr)
		return ok && s.Sel.Name == "Evidence"
	}
	isString := func(e ast.Expr) (string, bool) {
		l, ok := e.(*ast.BasicLit)
		if !ok || l.Kind != token.STRING {
			return "", false
		}
		return l.Value, true
	}
	var out []flagged
	ast.Inspect(f, func(n ast.Node) bool {
		switch x := n.(type) {
		case *ast.IndexExpr:
			if k, ok := isString(x.Index); ok && isEvidence(x.X) {
				out = append(out, flagged{x, k})
			}
		case *ast.CallExpr:
			ev, key := false, ""
			for _, a := range x.Args {
				ev = ev || isEvidence(a)
				if k, ok := isString(a); ok && key == "" {
					key = k
				}
			}
			if ev && key != "" {
				out = append(out, flagged{x, key})
			}
		}
		return true
	})
	return out
}
