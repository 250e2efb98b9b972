package deploy

import (
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"
)

// TestImageBuildMatchesDockerfile checks that `make image` (no container
// engine: tools/image/rootfs.sh + tools/image/mkimage with
// tools/image/image.json) builds the image deploy/Dockerfile describes: the
// same Debian packages in the runtime stage, the same ENTRYPOINT and USER,
// the same files copied in (binary and SBOM at the same paths), the same
// rootfs hooks (no setuid/setgid, no apt lists, the state and policy
// directories), the same labels, and an image name the chart's defaults
// pull (its repository and appVersion).
func TestImageBuildMatchesDockerfile(t *testing.T) {
	repo := filepath.Join(Dir(), "..")
	df := dockerfileInstructions(t)
	var runtime []string // instructions of the last stage
	for _, l := range df {
		if strings.HasPrefix(strings.ToUpper(l), "FROM ") {
			runtime = nil
		}
		runtime = append(runtime, l)
	}

	// Packages.
	var dfPkgs []string
	for _, l := range runtime {
		if i := strings.Index(l, "apt-get install"); i >= 0 {
			rest := l[i+len("apt-get install"):]
			if j := strings.Index(rest, "&&"); j >= 0 {
				rest = rest[:j]
			}
			for _, f := range strings.Fields(rest) {
				if !strings.HasPrefix(f, "-") {
					dfPkgs = append(dfPkgs, f)
				}
			}
		}
	}
	b, err := os.ReadFile(filepath.Join(repo, "tools", "image", "packages.txt"))
	if err != nil {
		t.Fatal(err)
	}
	var pkgs []string
	for _, l := range strings.Split(string(b), "\n") {
		if f := strings.Fields(l); len(f) > 0 && !strings.HasPrefix(f[0], "#") {
			pkgs = append(pkgs, f[0])
		}
	}
	sort.Strings(dfPkgs)
	sort.Strings(pkgs)
	if len(dfPkgs) == 0 || strings.Join(dfPkgs, " ") != strings.Join(pkgs, " ") {
		t.Errorf("packages: Dockerfile runtime stage installs %v, tools/image/packages.txt lists %v", dfPkgs, pkgs)
	}

	// Entrypoint, user, files, labels.
	var spec struct {
		Entrypoint []string          `json:"entrypoint"`
		User       string            `json:"user"`
		Labels     map[string]string `json:"labels"`
		Files      []struct{ Src, Dst, Mode string }
	}
	b, err = os.ReadFile(filepath.Join(repo, "tools", "image", "image.json"))
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, &spec); err != nil {
		t.Fatalf("tools/image/image.json: %v", err)
	}
	var dfEntry []string
	var dfUser string
	dfCopies := map[string]bool{}
	dfLabels := map[string]string{}
	labelRE := regexp.MustCompile(`([a-z0-9.]+)="([^"]*)"`)
	for _, l := range runtime {
		f := strings.Fields(l)
		switch strings.ToUpper(f[0]) {
		case "ENTRYPOINT":
			if err := json.Unmarshal([]byte(strings.TrimSpace(l[len(f[0]):])), &dfEntry); err != nil {
				t.Errorf("Dockerfile ENTRYPOINT is not exec form: %s", l)
			}
		case "USER":
			dfUser = f[1]
		case "COPY":
			dfCopies[f[len(f)-1]] = true
		case "LABEL":
			for _, m := range labelRE.FindAllStringSubmatch(l, -1) {
				dfLabels[m[1]] = m[2]
			}
		}
	}
	if strings.Join(dfEntry, " ") != strings.Join(spec.Entrypoint, " ") || len(dfEntry) == 0 {
		t.Errorf("entrypoint: Dockerfile %q, image.json %q", dfEntry, spec.Entrypoint)
	}
	if dfUser == "" || dfUser != spec.User {
		t.Errorf("user: Dockerfile %q, image.json %q", dfUser, spec.User)
	}
	got := map[string]bool{}
	for _, f := range spec.Files {
		got[f.Dst] = true
	}
	for dst := range dfCopies {
		if !got[dst] {
			t.Errorf("Dockerfile copies %s into the image; image.json does not", dst)
		}
	}
	for dst := range got {
		if !dfCopies[dst] {
			t.Errorf("image.json adds %s; the Dockerfile does not", dst)
		}
	}
	for k, v := range dfLabels {
		if strings.Contains(v, "$") {
			continue // the version: make image sets it from git (-label)
		}
		if spec.Labels[k] != v {
			t.Errorf("label %s: Dockerfile %q, image.json %q", k, v, spec.Labels[k])
		}
	}

	// The rootfs hooks do what the Dockerfile's RUN does.
	b, err = os.ReadFile(filepath.Join(repo, "tools", "image", "rootfs.sh"))
	if err != nil {
		t.Fatal(err)
	}
	rootfs := string(b)
	for _, want := range []string{"bookworm", "--variant=minbase", `-perm /6000 -type f -exec chmod a-s`,
		"/var/lib/apt/lists/*", `"$1"/var/lib/remediate "$1"/etc/remediate`} {
		if !strings.Contains(rootfs, want) {
			t.Errorf("tools/image/rootfs.sh lacks %q (the Dockerfile's runtime stage does it)", want)
		}
	}
	if !strings.Contains(strings.Join(runtime, "\n"), "debian:bookworm") {
		t.Errorf("the Dockerfile's runtime stage is no longer Debian bookworm: update tools/image/rootfs.sh with it")
	}

	// The name make image gives the image is the chart's default image.
	mk, err := os.ReadFile(filepath.Join(repo, "Makefile"))
	if err != nil {
		t.Fatal(err)
	}
	values, err := os.ReadFile(filepath.Join(ChartDir(), "values.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	repoRE := regexp.MustCompile(`(?m)^\s+repository:\s*(\S+)`)
	m := repoRE.FindSubmatch(values)
	if m == nil {
		t.Fatal("values.yaml: no image.repository")
	}
	if !regexp.MustCompile(`(?m)^IMAGE_REPO \?= ` + regexp.QuoteMeta(string(m[1])) + `$`).Match(mk) {
		t.Errorf("Makefile's IMAGE_REPO is not the chart's image.repository %s", m[1])
	}

	// Every platform the Dockerfile is built for (its buildx --platform
	// line) gets a binary and an image archive from make image, and the
	// rootfs is built per architecture (its cache key includes it).
	df0, err := os.ReadFile(filepath.Join(Dir(), "Dockerfile"))
	if err != nil {
		t.Fatal(err)
	}
	pm := regexp.MustCompile(`--platform ((?:linux/[a-z0-9]+,?)+)`).FindSubmatch(df0)
	if pm == nil {
		t.Fatal("deploy/Dockerfile: no buildx --platform line")
	}
	var platforms []string
	for _, p := range strings.Split(string(pm[1]), ",") {
		platforms = append(platforms, strings.TrimPrefix(p, "linux/"))
	}
	sort.Strings(platforms)
	for _, v := range []string{"IMAGE_ARCHES", "IMAGE_ARCHIVE_ARCHES"} {
		vm := regexp.MustCompile(`(?m)^` + v + ` \?= (.+)$`).FindSubmatch(mk)
		if vm == nil {
			t.Errorf("Makefile: no %s", v)
			continue
		}
		got := strings.Fields(string(vm[1]))
		sort.Strings(got)
		if strings.Join(got, " ") != strings.Join(platforms, " ") {
			t.Errorf("Makefile's %s is %v; deploy/Dockerfile is built for %v", v, got, platforms)
		}
	}
	if !strings.Contains(rootfs, `--architectures="$arch"`) || !regexp.MustCompile(`key=\$\(echo "[^"]*\$arch`).MatchString(rootfs) {
		t.Errorf(`tools/image/rootfs.sh: the rootfs is not built and cached per architecture (--architectures="$arch", $arch in its key)`)
	}
}

// dockerfileInstructions returns deploy/Dockerfile's instructions with
// continuation lines joined and comments dropped.
func dockerfileInstructions(t *testing.T) []string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(Dir(), "Dockerfile"))
	if err != nil {
		t.Fatal(err)
	}
	var lines []string
	cur := ""
	for _, l := range strings.Split(string(b), "\n") {
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
	return lines
}
