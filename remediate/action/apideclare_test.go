package action

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"

	"github.com/remediate-dev/remediate/internal/node"
)

// TestAPIReadersDeclare: every registered action whose code reads one of
// node.Node's API adapters (apiFields) declares NeedsAPI, so the
// api-freshness guardrail blocks it while the cluster view is stale, or
// APIOptional, saying why it acts safely without one. The criterion is
// mechanical: the code reachable from the factory given to Define (its
// functions, the package types it names and their methods) names such a
// field. An action that needs the API for its target's data but reads no
// adapter (FlushConntrack: its dead backend comes from the view) is
// declared by judgement; this test cannot see that.
func TestAPIReadersDeclare(t *testing.T) {
	files := parseDir(t, ".")
	readers, defined := apiReaders(files, apiFields())
	for name := range defined {
		if _, ok := Lookup(name); !ok {
			t.Errorf("Define(%q) found in the sources but not registered", name)
		}
	}
	for _, ty := range Types() {
		if _, ok := defined[ty.Name]; !ok && !strings.HasPrefix(ty.Name, "DefineTest") {
			t.Errorf("registered action %s: no Define call for it found in the sources, so its API reads are not checked", ty.Name)
		}
	}
	if len(readers) == 0 {
		t.Fatal("no action reads the API: the walk is broken (RestartNodeAgent does)")
	}
	for _, msg := range undeclared(readers, Lookup) {
		t.Error(msg)
	}
	for _, name := range sortedKeys(readers) {
		t.Logf("%s reads the API: %s", name, strings.Join(readers[name], "; "))
	}
}

// TestAPIReadersDeclareFindsPlanted: the check finds what it is for: a
// planted action reading the pod watch through a helper type's method,
// and a real API action whose declaration is taken away.
func TestAPIReadersDeclareFindsPlanted(t *testing.T) {
	const src = `package action
const quietName = "Quiet"
func init() {
	Define("Planted", "doc", newPlanted, ActsOn(finding.KindPod))
	Define(quietName, "doc", func(p *P, n *node.Node) (Action, error) { return quiet{n: n}, nil }, ActsOn(finding.KindPod))
}
func newPlanted(p *P, n *node.Node) (Action, error) { return &planted{n: n}, nil }
type planted struct{ n *node.Node; h helper }
func (a *planted) Plan(ctx context.Context, f finding.Finding) (Plan, error) { return a.h.look(a.n), nil }
type helper struct{}
func (helper) look(n *node.Node) Plan { _ = n.Pods.NodePods(); return Plan{} }
type quiet struct{ n *node.Node }
func (q quiet) Plan(ctx context.Context, f finding.Finding) (Plan, error) { return Plan{Summary: q.n.Name}, nil }`
	f, err := parser.ParseFile(token.NewFileSet(), "planted.go", src, 0)
	if err != nil {
		t.Fatal(err)
	}
	readers, defined := apiReaders([]*ast.File{f}, apiFields())
	if len(defined) != 2 {
		t.Errorf("found Defines %v, want Planted and Quiet", defined)
	}
	if got := sortedKeys(readers); !slices.Equal(got, []string{"Planted"}) {
		t.Errorf("readers %v, want [Planted]", got)
	}
	none := func(string) (Type, bool) { return Type{}, true }
	if msgs := undeclared(readers, none); len(msgs) != 1 || !strings.Contains(msgs[0], "Planted reads the Kubernetes API") {
		t.Errorf("undeclared = %q, want one message about Planted", msgs)
	}

	// The real RestartNodeAgent without its declaration is named.
	realReaders, _ := apiReaders(parseDir(t, "."), apiFields())
	stripped := func(name string) (Type, bool) {
		ty, ok := Lookup(name)
		if name == "RestartNodeAgent" {
			ty.NeedsAPI, ty.APIOptional = false, ""
		}
		return ty, ok
	}
	msgs := undeclared(realReaders, stripped)
	if len(msgs) != 1 || !strings.Contains(msgs[0], "RestartNodeAgent reads the Kubernetes API") {
		t.Errorf("with RestartNodeAgent's declaration removed: %q, want one message about it", msgs)
	}
}

// apiFields are the fields of node.Node that reach the Kubernetes API:
// those whose type comes from client-go or internal/cluster. Found by
// reflection, so a new API adapter is covered without editing this test.
func apiFields() map[string]bool {
	out := map[string]bool{}
	nt := reflect.TypeOf(node.Node{})
	for i := range nt.NumField() {
		ft := nt.Field(i).Type
		for ft.Kind() == reflect.Pointer {
			ft = ft.Elem()
		}
		p := ft.PkgPath()
		if strings.HasPrefix(p, "k8s.io/client-go/") || strings.HasSuffix(p, "/internal/cluster") {
			out[nt.Field(i).Name] = true
		}
	}
	return out
}

// undeclared returns a message for each API reader that declares neither
// NeedsAPI nor APIOptional.
func undeclared(readers map[string][]string, lookup func(string) (Type, bool)) []string {
	var out []string
	for _, name := range sortedKeys(readers) {
		ty, ok := lookup(name)
		if !ok || (!ty.NeedsAPI && ty.APIOptional == "") {
			out = append(out, fmt.Sprintf("%s reads the Kubernetes API (%s) but declares neither NeedsAPI() (the api-freshness guardrail then blocks it while the view is stale) nor APIOptional(why)",
				name, strings.Join(readers[name], "; ")))
		}
	}
	return out
}

// apiReaders walks the Define calls in files: defined holds every action
// name registered there, readers the API field reads reachable from each
// one's factory.
func apiReaders(files []*ast.File, fields map[string]bool) (readers map[string][]string, defined map[string]bool) {
	funcs := map[string]ast.Node{}     // package-level functions and vars
	types := map[string]ast.Node{}     // package-level type specs
	methods := map[string][]ast.Node{} // by receiver type name
	consts := map[string]string{}      // string constants
	imports := map[string]bool{}       // package names: procident.Pods is no field
	var defines []*ast.CallExpr
	for _, f := range files {
		for _, im := range f.Imports {
			p, _ := strconv.Unquote(im.Path.Value)
			imports[p[strings.LastIndex(p, "/")+1:]] = true
			if im.Name != nil {
				imports[im.Name.Name] = true
			}
		}
		for _, d := range f.Decls {
			switch d := d.(type) {
			case *ast.FuncDecl:
				if d.Recv == nil {
					funcs[d.Name.Name] = d
					continue
				}
				if r := recvName(d.Recv.List[0].Type); r != "" {
					methods[r] = append(methods[r], d)
				}
			case *ast.GenDecl:
				for _, s := range d.Specs {
					switch s := s.(type) {
					case *ast.TypeSpec:
						types[s.Name.Name] = s
					case *ast.ValueSpec:
						for i, n := range s.Names {
							funcs[n.Name] = s
							if i < len(s.Values) {
								if l, ok := s.Values[i].(*ast.BasicLit); ok && l.Kind == token.STRING {
									consts[n.Name], _ = strconv.Unquote(l.Value)
								}
							}
						}
					}
				}
			}
		}
		ast.Inspect(f, func(n ast.Node) bool {
			if c, ok := n.(*ast.CallExpr); ok && isDefine(c.Fun) && len(c.Args) >= 3 {
				defines = append(defines, c)
			}
			return true
		})
	}
	readers, defined = map[string][]string{}, map[string]bool{}
	for _, c := range defines {
		var name string
		switch a := c.Args[0].(type) {
		case *ast.BasicLit:
			name, _ = strconv.Unquote(a.Value)
		case *ast.Ident:
			name = consts[a.Name]
		}
		if name == "" {
			continue
		}
		defined[name] = true
		seen := map[ast.Node]bool{}
		var reads []string
		var walk func(ast.Node)
		walk = func(root ast.Node) {
			if root == nil || seen[root] {
				return
			}
			seen[root] = true
			ast.Inspect(root, func(n ast.Node) bool {
				switch x := n.(type) {
				case *ast.SelectorExpr:
					if fields[x.Sel.Name] && isField(x.X, imports) {
						reads = append(reads, exprString(x))
					}
				case *ast.Ident:
					if fn, ok := funcs[x.Name]; ok {
						walk(fn)
					}
					if ts, ok := types[x.Name]; ok {
						walk(ts)
						for _, m := range methods[x.Name] {
							walk(m)
						}
					}
				}
				return true
			})
		}
		walk(c.Args[2])
		if len(reads) > 0 {
			sort.Strings(reads)
			readers[name] = slices.Compact(reads)
		}
	}
	return readers, defined
}

// isField: x.Sel is a field of x, not a package's name (procident.Pods)
// or a method of a call's result (client.CoreV1().Pods(ns)).
func isField(x ast.Expr, imports map[string]bool) bool {
	switch x := x.(type) {
	case *ast.Ident:
		return !imports[x.Name]
	case *ast.SelectorExpr:
		return true
	}
	return false
}

func isDefine(e ast.Expr) bool {
	if ix, ok := e.(*ast.IndexExpr); ok {
		e = ix.X
	}
	id, ok := e.(*ast.Ident)
	return ok && id.Name == "Define"
}

func recvName(e ast.Expr) string {
	switch x := e.(type) {
	case *ast.StarExpr:
		return recvName(x.X)
	case *ast.IndexExpr:
		return recvName(x.X)
	case *ast.Ident:
		return x.Name
	}
	return ""
}

func exprString(e ast.Expr) string {
	switch x := e.(type) {
	case *ast.Ident:
		return x.Name
	case *ast.SelectorExpr:
		return exprString(x.X) + "." + x.Sel.Name
	}
	return "?"
}

func parseDir(t *testing.T, dir string) []*ast.File {
	t.Helper()
	paths, err := filepath.Glob(filepath.Join(dir, "*.go"))
	if err != nil {
		t.Fatal(err)
	}
	fset := token.NewFileSet()
	var out []*ast.File
	for _, p := range paths {
		if strings.HasSuffix(p, "_test.go") {
			continue
		}
		src, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		f, err := parser.ParseFile(fset, p, src, 0)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, f)
	}
	return out
}

func sortedKeys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}
