package layering

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"path/filepath"
	"sort"
	"strings"
	"testing"
)

// sharedDetectFile says whether a file of detect/ may be named by every
// other: the contract (detect.go, judged*.go: Define, Detector, the judged
// figures) and the kit (kit_*.go: params validation, windows, kube-proxy's
// scrape and mode, processes, iptables parties, the per-cycle dataplane
// observation, pods, IPVS, nftables, causes). Every other non-test file is a
// detector's: the file named after its type, or a companion of it
// (iptablesrules_flush.go).
func sharedDetectFile(name string) bool {
	return name == "detect.go" || strings.HasPrefix(name, "judged") || strings.HasPrefix(name, "kit_")
}

// detectorUnit is the detector a file of detect/ belongs to: the file
// itself, or for a companion (stem_part.go beside stem.go, a detector's
// file: iptablesrules_flush.go beside iptablesrules.go) that detector's
// file, the longest such stem.
func detectorUnit(name string, files map[string]*ast.File) string {
	base := strings.TrimSuffix(name, ".go")
	for i := len(base) - 1; i > 0; i-- {
		if base[i] != '_' {
			continue
		}
		stem := base[:i] + ".go"
		if _, ok := files[stem]; ok && !sharedDetectFile(stem) {
			return stem
		}
	}
	return name
}

// TestDetectorFilesStandAlone: a detector file of detect/ names no
// package-level declaration (func, type, var, const) of another detector's
// files; what two detectors share lives in the kit, where a newcomer finds
// it, and each detector is read alone, its file and its companions (issue
// 40, point 1). The kit and the contract stand below the detectors: they
// name no detector's declaration either. Methods are reached through a
// value, whose type or maker such a use names.
func TestDetectorFilesStandAlone(t *testing.T) {
	files := map[string]*ast.File{}
	eachSource(t, []string{"detect"}, 30, nil, func(fset *token.FileSet, f *ast.File) {
		files[filepath.Base(fset.Position(f.Pos()).Filename)] = f
	})
	uses := crossDetectorUses(files)
	for _, u := range uses {
		if sharedDetectFile(u.user) {
			t.Errorf("detect/%s names %s of detect/%s, a detector's file: the kit and the contract stand below the detectors; move it to the kit", u.user, u.name, u.owner)
			continue
		}
		t.Errorf("detect/%s names %s of detect/%s, another detector's file: move it to a kit_*.go file (or to %s, if only it uses it)", u.user, u.name, u.owner, u.user)
	}
	if len(uses) > 0 {
		t.Logf("%d cross-detector uses", len(uses))
	}
}

// TestCrossDetectorUsesFound: the check finds what it is for: a detector
// file, or a companion, naming another detector's function, type, constant
// and variable (once per name however often named); and lets be the kit
// and the contract, a detector's own declarations and its companions', a
// local that shadows another file's name, and a field or method selected
// by that name; a kit file naming a detector's is found too.
func TestCrossDetectorUsesFound(t *testing.T) {
	srcs := map[string]string{
		"detect.go":     "package detect\ntype Detector interface{}\nfunc Define() {}",
		"judged.go":     "package detect\nfunc judge() {}",
		"kit_params.go": "package detect\nfunc validateFamilies() {}\nfunc kitUsesOne() { _ = oneLimit }",
		"one.go":        "package detect\ntype one struct{}\nconst oneLimit = 3\nvar oneSeen = 0\nfunc oneHelper() {}\nfunc (one) Detect() {}",
		"one_flush.go":  "package detect\nfunc flush() { oneHelper(); _ = one{} }",
		"two_part.go":   "package detect\nfunc part() { _ = oneSeen; twoOwn() }",
		"two.go": `package detect
type two struct{ o one }
func (t two) Detect() {
	oneHelper()
	oneHelper()
	_ = oneLimit + oneSeen
	validateFamilies()
	judge()
	Define()
	var d Detector
	_ = d
	t.o.Detect()
	_ = t.oneHelper
	oneLimit := 4
	_ = oneLimit
	twoOwn()
}
func twoOwn() {}`,
	}
	files := map[string]*ast.File{}
	for name, src := range srcs {
		f, err := parser.ParseFile(token.NewFileSet(), name, src, 0)
		if err != nil {
			t.Fatal(err)
		}
		files[name] = f
	}
	var got []string
	for _, u := range crossDetectorUses(files) {
		got = append(got, u.String())
	}
	want := "kit_params.go>oneLimit@one.go two.go>one@one.go two.go>oneHelper@one.go two.go>oneLimit@one.go two.go>oneSeen@one.go two_part.go>oneSeen@one.go"
	if strings.Join(got, " ") != want {
		t.Errorf("found %v, want %s", got, want)
	}
}

// crossUse is a detector file (user) naming a package-level declaration
// (name) of another detector file (owner).
type crossUse struct{ user, name, owner string }

func (u crossUse) String() string { return fmt.Sprintf("%s>%s@%s", u.user, u.name, u.owner) }

// crossDetectorUses finds, in files (one package, by file name), each
// package-level name a detector file takes from another detector's files,
// or a kit or contract file from a detector's,
// once per user and name, sorted. The parser resolves a file's own
// declarations and locals; what it leaves unresolved is the package's
// other files' (or the universe's).
func crossDetectorUses(files map[string]*ast.File) []crossUse {
	owner := map[string]string{}
	for name, f := range files {
		for _, d := range f.Decls {
			switch x := d.(type) {
			case *ast.FuncDecl:
				if x.Recv == nil && x.Name.Name != "init" {
					owner[x.Name.Name] = name
				}
			case *ast.GenDecl:
				for _, s := range x.Specs {
					switch y := s.(type) {
					case *ast.TypeSpec:
						owner[y.Name.Name] = name
					case *ast.ValueSpec:
						for _, n := range y.Names {
							if n.Name != "_" {
								owner[n.Name] = name
							}
						}
					}
				}
			}
		}
	}
	seen := map[crossUse]bool{}
	var out []crossUse
	for name, f := range files {
		for _, id := range f.Unresolved {
			o, ok := owner[id.Name]
			if !ok || sharedDetectFile(o) || detectorUnit(o, files) == detectorUnit(name, files) {
				continue
			}
			u := crossUse{name, id.Name, o}
			if !seen[u] {
				seen[u] = true
				out = append(out, u)
			}
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].String() < out[j].String() })
	return out
}
