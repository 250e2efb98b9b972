package tools

import (
	"os"
	"regexp"
	"strings"
	"testing"
)

// TestREADMEFirstRun: the README's quick start says what a newcomer's
// first `make test` does (issue 30): how long a cold run took, what is
// cached after it, where (the very folders the Makefile and
// tools/image/rootfs.sh use), that as root it installs the host packages
// of tools/hostdeps/packages.txt, and that without root it says which lanes
// it skips.
func TestREADMEFirstRun(t *testing.T) {
	read := func(p string) string {
		t.Helper()
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	readme := read("../README.md")
	i := strings.Index(readme, "## Quick start")
	if i < 0 {
		t.Fatal("README has no '## Quick start' section")
	}
	qs := readme[i:]
	if j := strings.Index(qs[3:], "\n## "); j > 0 {
		qs = qs[:j+3]
	}
	for what, re := range map[string]string{
		"the make test command":                  "(?m)^make test ",
		"how long a cold first run took":         `\d+-minute|\d+ minutes`,
		"the Go build cache":                     "GOCACHE",
		"the binaries' folder":                   "`_output/bin`",
		"the image rootfs cache":                 "`/var/cache/remediate/rootfs`",
		"the host packages it installs as root":  "`tools/hostdeps/packages.txt`",
		"that without root it names the skipped": "(?s)[Nn]ot as root.*skips and why",
	} {
		if !regexp.MustCompile(re).MatchString(qs) {
			t.Errorf("README quick start does not say %s (%s)", what, re)
		}
	}
	for f, re := range map[string]string{
		"controlplane/controlplane.mk": `(?m)^CONTROLPLANE_BIN \?= \$\(CURDIR\)/_output/bin$`,
		"helm/helm.mk":                 `(?m)^HELM_BIN \?= \$\(CURDIR\)/_output/bin$`,
		"image/rootfs.sh":              `/var/cache/remediate/rootfs`,
	} {
		if !regexp.MustCompile(re).MatchString(read(f)) {
			t.Errorf("%s no longer uses the folder the README names (%s)", f, re)
		}
	}
}
