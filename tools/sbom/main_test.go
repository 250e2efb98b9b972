package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"
)

// The test binary carries build info like any Go binary: its modules
// must all appear, once, with a purl, linked from the binary.
func TestGenerate(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the daemon")
	}
	bin := filepath.Join(t.TempDir(), "remediate-"+runtime.GOARCH)
	build := exec.Command("go", "build", "-trimpath", "-o", bin, "../../cmd/remediate")
	// The host architecture and make image's flags: the compile is cached.
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	if _, err := Generate([]string{bin, bin}, time.Now()); err == nil {
		t.Error("the same binary twice: no error")
	}
	doc, err := Generate([]string{bin}, time.Unix(0, 0))
	if err != nil {
		t.Fatal(err)
	}
	if doc.SPDXVersion != "SPDX-2.3" || doc.CreationInfo.Created != "1970-01-01T00:00:00Z" {
		t.Errorf("header %+v", doc)
	}
	seen := map[string]bool{}
	var sawZap bool
	for _, p := range doc.Packages {
		if seen[p.SPDXID] {
			t.Errorf("duplicate package %s", p.SPDXID)
		}
		seen[p.SPDXID] = true
		if strings.HasPrefix(p.SPDXID, "SPDXRef-mod-") && (len(p.ExternalRefs) != 1 || !strings.HasPrefix(p.ExternalRefs[0].Locator, "pkg:golang/")) {
			t.Errorf("module without purl: %+v", p)
		}
		if p.Name == "go.uber.org/zap" {
			sawZap = true
		}
	}
	if !sawZap || !strings.Contains(doc.Packages[0].Comment, "GOARCH="+runtime.GOARCH) {
		t.Errorf("zap module %v, binary %+v", sawZap, doc.Packages[0])
	}
	for _, r := range doc.Relationships {
		if !seen[r.Related] {
			t.Errorf("relationship to unknown %s", r.Related)
		}
	}
}

func TestGenerateNotGo(t *testing.T) {
	f := t.TempDir() + "/x"
	os.WriteFile(f, []byte("#!/bin/sh\n"), 0o755)
	if _, err := Generate([]string{f}, time.Now()); err == nil {
		t.Error("no error for a non-Go file")
	}
}
