package deploy

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// TestDockerfile lints deploy/Dockerfile (no container engine here): base
// images pinned (never latest), a cross-compiling build stage for every
// target platform, the version stamped, the SBOM shipped, no setuid
// programs, an explicit USER, no remote ADD, apt without recommends and
// without its lists.
func TestDockerfile(t *testing.T) {
	b, err := os.ReadFile(filepath.Join(Dir(), "Dockerfile"))
	if err != nil {
		t.Fatal(err)
	}
	src := string(b)
	// Join continuation lines, drop comments.
	var lines []string
	cur := ""
	for _, l := range strings.Split(src, "\n") {
		tl := strings.TrimSpace(l)
		if strings.HasPrefix(tl, "#") || tl == "" {
			continue
		}
		if strings.HasSuffix(tl, "\\") {
			cur += strings.TrimSuffix(tl, "\\") + " "
			continue
		}
		lines = append(lines, cur+tl)
		cur = ""
	}
	var froms []string
	user := ""
	for _, l := range lines {
		f := strings.Fields(l)
		switch strings.ToUpper(f[0]) {
		case "FROM":
			img := f[1]
			if strings.HasPrefix(img, "--platform=") {
				img = f[2]
			}
			froms = append(froms, l)
			if !strings.Contains(img, ":") || strings.HasSuffix(img, ":latest") {
				t.Errorf("base image not pinned: %s", l)
			}
			user = ""
		case "USER":
			user = f[1]
		case "ADD":
			if strings.Contains(l, "://") {
				t.Errorf("remote ADD: %s", l)
			}
		case "RUN":
			if strings.Contains(l, "apt-get install") && (!strings.Contains(l, "--no-install-recommends") || !strings.Contains(l, "rm -rf /var/lib/apt/lists")) {
				t.Errorf("apt-get install without --no-install-recommends or without removing its lists: %s", l)
			}
			if strings.Contains(l, "curl ") || strings.Contains(l, "wget ") {
				t.Errorf("downloads outside the package manager and module proxy: %s", l)
			}
		}
	}
	if len(froms) < 2 || !strings.Contains(froms[0], "--platform=$BUILDPLATFORM") {
		t.Errorf("want a build stage on $BUILDPLATFORM cross-compiling, then a runtime stage: %v", froms)
	}
	if user == "" {
		t.Error("final stage has no explicit USER")
	}
	for _, want := range []*regexp.Regexp{
		regexp.MustCompile(`GOARCH=\$TARGETARCH`),
		regexp.MustCompile(`CGO_ENABLED=0`),
		regexp.MustCompile(`-X main\.version=\$\{VERSION\}`),
		regexp.MustCompile(`tools/sbom`),
		regexp.MustCompile(`-perm /6000 .*chmod a-s`),
		regexp.MustCompile(`ENTRYPOINT \["/usr/local/bin/remediate"\]`),
	} {
		if !want.MatchString(strings.Join(lines, "\n")) {
			t.Errorf("Dockerfile lacks %s", want)
		}
	}
}

// TestDockerignore: the Dockerfile's context (the repository root) leaves
// out the build outputs (_output/ holds the control plane and helm builds,
// bin/ make's binaries) and .git, and keeps every file the build needs
// (go.mod, go.sum, the Go sources of the module, tools/sbom).
func TestDockerignore(t *testing.T) {
	root := filepath.Join(Dir(), "..")
	b, err := os.ReadFile(filepath.Join(root, ".dockerignore"))
	if err != nil {
		t.Fatalf("no .dockerignore at the Dockerfile's context root: %v", err)
	}
	var pats []string
	for _, l := range strings.Split(string(b), "\n") {
		if l = strings.TrimSpace(l); l != "" && !strings.HasPrefix(l, "#") {
			if strings.HasPrefix(l, "!") {
				t.Fatalf("exceptions (%s) are not expected here", l)
			}
			pats = append(pats, strings.TrimSuffix(strings.TrimPrefix(l, "/"), "/"))
		}
	}
	// excluded follows the Docker rules used here: a pattern matches the
	// path or one of its parent directories; "**/" matches any depth.
	excluded := func(p string) bool {
		for _, pat := range pats {
			for q := p; q != "." && q != "/"; q = filepath.Dir(q) {
				if ok, _ := filepath.Match(pat, q); ok {
					return true
				}
				if rest, ok := strings.CutPrefix(pat, "**/"); ok {
					if m, _ := filepath.Match(rest, filepath.Base(q)); m {
						return true
					}
				}
			}
		}
		return false
	}
	for _, p := range []string{".git", ".git/HEAD", "_output/bin/kube-apiserver", "bin/remediate", "tools/bin/staticcheck", "cmd/remediate/remediate.test"} {
		if !excluded(p) {
			t.Errorf("%s goes into the build context", p)
		}
	}
	need := []string{"go.mod", "go.sum", "tools/sbom/main.go", "deploy/Dockerfile"}
	err = filepath.WalkDir(root, func(p string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, p)
		if d.IsDir() && (rel == ".git" || rel == "_output" || rel == "bin") {
			return filepath.SkipDir
		}
		if !d.IsDir() && strings.HasSuffix(p, ".go") {
			need = append(need, rel)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range need {
		if excluded(p) {
			t.Errorf("%s is needed by the build but excluded", p)
		}
	}
}
