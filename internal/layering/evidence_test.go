package layering

import (
	"go/ast"
	"go/parser"
	"go/token"
	"strings"
	"testing"
)

// evidenceReaders are the code that acts on findings or counts them: the
// actions, the engine's ordering and the exporters. They read a finding's
// typed Subject (its Refs: ipvs.RealRef, conntrack.BackendRef,
// conntrack.TableRef, ...), never its Evidence, which is written for
// people (issue 40, point 2).
var evidenceReaders = []string{"remediate/action", "remediate/order.go", "remediate/exporters"}

// TestEvidenceIsWriteOnlyForActions: no non-test file of evidenceReaders
// reads a finding's Evidence, by key or whole (handing it to a decoder).
// Writing it (a composite literal, f.Evidence = ..., f.Evidence[k] = v),
// and rewriting it in place for people (f.Evidence = clip.Values(f.Evidence,
// max)) are not reads.
func TestEvidenceIsWriteOnlyForActions(t *testing.T) {
	n := 0
	for _, p := range evidenceReaders {
		dir, file := p, ""
		if strings.HasSuffix(p, ".go") {
			dir, file = p[:strings.LastIndex(p, "/")], p[strings.LastIndex(p, "/")+1:]
		}
		skip := func(path string) bool { return file != "" && !strings.HasSuffix(path, "/"+p) }
		eachSource(t, []string{dir}, 1, skip, func(fset *token.FileSet, f *ast.File) {
			n++
			for _, r := range evidenceReads(f) {
				t.Errorf("%s: %s reads a finding's evidence: read the typed reference its detector sets (finding.RefOf on Subject.Refs; the owning adapter defines it)", fset.Position(r.Pos()), r.key)
			}
		})
	}
	if n < 15 {
		t.Fatalf("only %d files read: is the walk broken?", n)
	}
}

// TestEvidenceReadsFound: the check finds what it is for: the reads the
// actions and the exporter made before the typed references (decoding a
// reference from the evidence, an int by an adapter's key, a local copy),
// and lets writes and the in-place clip be.
func TestEvidenceReadsFound(t *testing.T) {
	const src = `package x
func f(f finding.Finding) {
	ref, err := ipvs.DecodeRealRef(f.Evidence)
	last, err := finding.EvidenceInt(f.Evidence, conntrack.EvidenceLastSetMax)
	ev := f.Evidence
	_ = f.Evidence["x"] == 1
	f.Evidence = map[string]any{"omitted": 3}
	f.Evidence["limit"] = 2
	f.Evidence = clip.Values(f.Evidence, clip.Max)
	g := finding.Finding{Evidence: map[string]any{}}
	_ = ipvs.VirtualRef{}.Evidence()
}`
	f, err := parser.ParseFile(token.NewFileSet(), "x.go", src, 0)
	if err != nil {
		t.Fatal(err)
	}
	if got := len(evidenceReads(f)); got != 4 {
		t.Errorf("found %d reads, want 4 (DecodeRealRef, EvidenceInt, ev :=, index)", got)
	}
}

// evidenceReads finds the reads of an X.Evidence field: every use but as
// the target of an assignment (whole or by key), the method call of a
// typed reference (ref.Evidence()), and the right-hand side of an
// assignment back to the same X.Evidence.
func evidenceReads(f *ast.File) []flagged {
	isEvidence := func(e ast.Expr) (*ast.SelectorExpr, bool) {
		s, ok := e.(*ast.SelectorExpr)
		return s, ok && s.Sel.Name == "Evidence"
	}
	allowed := map[ast.Node]bool{}
	ast.Inspect(f, func(n ast.Node) bool {
		switch x := n.(type) {
		case *ast.AssignStmt:
			for _, l := range x.Lhs {
				target := l
				if ix, ok := l.(*ast.IndexExpr); ok {
					target = ix.X
				}
				s, ok := isEvidence(target)
				if !ok {
					continue
				}
				allowed[s] = true
				// x.Evidence = g(x.Evidence): rewritten in place.
				want := fullName(s)
				for _, r := range x.Rhs {
					ast.Inspect(r, func(m ast.Node) bool {
						if rs, ok := m.(*ast.SelectorExpr); ok && rs.Sel.Name == "Evidence" && fullName(rs) == want {
							allowed[rs] = true
						}
						return true
					})
				}
			}
		case *ast.CallExpr:
			if s, ok := isEvidence(x.Fun); ok {
				allowed[s] = true // ref.Evidence(): a reference encodes itself
			}
		}
		return true
	})
	var out []flagged
	ast.Inspect(f, func(n ast.Node) bool {
		if s, ok := n.(*ast.SelectorExpr); ok && s.Sel.Name == "Evidence" && !allowed[s] {
			out = append(out, flagged{s, fullName(s)})
		}
		return true
	})
	return out
}

// fullName spells a selector chain (a.f.Evidence); "?" for anything else.
func fullName(e ast.Expr) string {
	switch x := e.(type) {
	case *ast.Ident:
		return x.Name
	case *ast.SelectorExpr:
		return fullName(x.X) + "." + x.Sel.Name
	}
	return "?"
}
