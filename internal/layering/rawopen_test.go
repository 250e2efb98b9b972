package layering

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"path/filepath"
	"sort"
	"strings"
	"testing"
)

// rawOpeners are the calls that open a file some other way than
// internal/boundedfile (package name as imported, function).
var rawOpeners = map[string]bool{
	"os.Open": true, "os.OpenFile": true, "os.ReadFile": true, "os.Create": true,
	"ioutil.ReadFile": true, "unix.Open": true, "unix.Openat": true, "syscall.Open": true,
	"os.ReadDir": true,
}

// rawOpenAllowed are the raw opens the daemon keeps, by file and enclosing
// function, each with why it cannot hang, follow a planted link or read
// without bound. Keep it short: everything else goes through
// internal/boundedfile.
var rawOpenAllowed = map[string]string{
	"internal/boundedfile/boundedfile.go:(package level)": "the opener itself (osOpenFile)",
	// Namespace handles: opened to setns(2), never read (nsfs files).
	"internal/nfnetlink/nfnetlink_linux.go:InNetNS": "setns handles (/proc/thread-self/ns/net, /run/netns/NAME), never read",
	"internal/sysctl/netns_linux.go:open":           "a thread that entered the namespace opens /proc/thread-self/ns/net (setns handle) and the /proc/sys file there (procfs: no FIFO can be planted)",
	// Created exclusively (O_EXCL never follows a link nor opens a FIFO).
	"internal/bundle/bundle.go:Create":           "creates the bundle with O_EXCL",
	"cmd/remediate/paths.go:readOnlyStateDir":    "creates the dry-run copy with O_EXCL in its own temporary directory",
	"cmd/kubectl-remediate/main.go:remote":       "kubectl plugin on the operator's machine, not the daemon: creates the bundle with O_EXCL",
	"cmd/kubectl-remediate/main.go:copyBundle":   "kubectl plugin on the operator's machine, not the daemon: a temporary file it created",
	"remediate/store.go:Lock":                    "the state dir lock: O_NOFOLLOW|O_NONBLOCK, flock'ed, never read",
	"remediate/store.go:LockDaemon":              "the daemon lock: O_NOFOLLOW|O_NONBLOCK, a regular file only, flock'ed; reads at most 32 bytes (the holder's PID)",
	"internal/procs/identity_linux.go:GoMain":    "/proc/<pid>/exe (procfs magic link to the process's own executable), O_NONBLOCK, a regular file only, read under a deadline by debug/buildinfo",
	"internal/procs/real_linux.go:readSmall":     "a /proc/<pid> file (procfs: no FIFO can be there) into a fixed buffer: len(buf) bytes is the bound",
	"internal/procs/real_linux.go:listProc":      "getdents of the proc root (O_DIRECTORY)",
	"internal/procs/real_linux.go:holders":       "lists /proc/<pid>/fd (procfs: a directory, no FIFO can be there)",
	"internal/procs/real_linux.go:OwnsListener":  "lists /proc/<pid>/fd (procfs: a directory, no FIFO can be there)",
	"internal/lockwatch/source_linux.go:fdOn":    "lists /proc/<pid>/fd (procfs: a directory, no FIFO can be there)",
	"internal/lockwatch/source_linux.go:openers": "lists the proc root (procfs)",
	"internal/paramdoc/paramdoc.go:Collect":      "reads the module's Go sources to generate parameter docs (go generate and its test), not the daemon",
}

// TestNoRawFileOpens fails when code of the daemon opens a file without
// internal/boundedfile (no O_NONBLOCK, no regular-file check, no size bound,
// no deadline): a FIFO, a symlink or a 1 GiB file planted there would hang
// it, redirect it or fill its memory (issue 27, items 5-8). Test files,
// test harnesses (internal/testing, the *test helper packages) and tools/
// are not the daemon.
func TestNoRawFileOpens(t *testing.T) {
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	var found []string
	checked := 0
	err = filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, path)
		if d.IsDir() {
			if n := d.Name(); n == "_output" || n == "bin" || n == "testdata" || n == "tools" || (strings.HasPrefix(n, ".") && path != root) ||
				rel == "internal/testing" || rel == "internal/conntrack/conntracktest" || rel == "internal/kube/e2e" || rel == "internal/netnstest" || rel == "internal/cluster/clustertest" {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		fset := token.NewFileSet()
		f, err := parser.ParseFile(fset, path, nil, 0)
		if err != nil {
			return err
		}
		checked++
		for _, decl := range f.Decls {
			fn, ok := decl.(*ast.FuncDecl)
			var name string
			var body ast.Node = decl
			if ok {
				name = fn.Name.Name
			} else {
				name = "(package level)"
			}
			ast.Inspect(body, func(n ast.Node) bool {
				sel, ok := n.(*ast.SelectorExpr)
				if !ok {
					return true
				}
				x, ok := sel.X.(*ast.Ident)
				if !ok || !rawOpeners[x.Name+"."+sel.Sel.Name] {
					return true
				}
				key := filepath.ToSlash(rel) + ":" + name
				seen[key] = true
				if _, ok := rawOpenAllowed[key]; !ok {
					found = append(found, fmt.Sprintf("%s: %s.%s in %s", fset.Position(sel.Pos()), x.Name, sel.Sel.Name, name))
				}
				return true
			})
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if checked < 100 {
		t.Fatalf("only %d files checked: is the walk broken?", checked)
	}
	sort.Strings(found)
	for _, f := range found {
		t.Errorf("%s: open it with internal/boundedfile (Read, Open*, OpenAppend, OpenDir), or add it to rawOpenAllowed with why it cannot hang, follow or grow", f)
	}
	for key := range rawOpenAllowed {
		if !seen[key] {
			t.Errorf("rawOpenAllowed lists %s, which opens nothing raw any more: remove it", key)
		}
	}
}
