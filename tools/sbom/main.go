// Command sbom writes an SPDX 2.3 JSON software bill of materials for Go
// binaries, from the module graph linked into each one (the build
// information `go version -m` prints: main module, every dependency module
// with its version and go.sum hash, the Go toolchain and build settings).
//
//	go run ./tools/sbom -o bin/remediate.spdx.json bin/remediate-linux-amd64 bin/remediate-linux-arm64
//
// Why not `go list -m all`: that lists every module of the graph,
// test-only ones included; the binary's build info lists exactly what was
// linked, per GOOS/GOARCH. Why not cyclonedx-gomod: one more pinned tool to
// build for what the standard library's debug/buildinfo already reads.
package main

import (
	"crypto/sha256"
	"debug/buildinfo"
	"encoding/hex"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"time"
)

func main() {
	out := flag.String("o", "-", "output file (- for stdout)")
	created := flag.String("created", "", "creation time (RFC 3339; default: $SOURCE_DATE_EPOCH, else now)")
	flag.Parse()
	if flag.NArg() == 0 {
		fmt.Fprintln(os.Stderr, "usage: sbom [-o FILE] BINARY...")
		os.Exit(2)
	}
	ts, err := creationTime(*created)
	if err != nil {
		fmt.Fprintln(os.Stderr, "sbom:", err)
		os.Exit(2)
	}
	doc, err := Generate(flag.Args(), ts)
	if err != nil {
		fmt.Fprintln(os.Stderr, "sbom:", err)
		os.Exit(1)
	}
	w := io.Writer(os.Stdout)
	if *out != "-" {
		f, err := os.Create(*out)
		if err != nil {
			fmt.Fprintln(os.Stderr, "sbom:", err)
			os.Exit(1)
		}
		defer f.Close()
		w = f
	}
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	if err := enc.Encode(doc); err != nil {
		fmt.Fprintln(os.Stderr, "sbom:", err)
		os.Exit(1)
	}
}

func creationTime(flagVal string) (time.Time, error) {
	if flagVal != "" {
		return time.Parse(time.RFC3339, flagVal)
	}
	if e := os.Getenv("SOURCE_DATE_EPOCH"); e != "" {
		var sec int64
		if _, err := fmt.Sscan(e, &sec); err != nil {
			return time.Time{}, fmt.Errorf("SOURCE_DATE_EPOCH %q: %w", e, err)
		}
		return time.Unix(sec, 0).UTC(), nil
	}
	return time.Now().UTC(), nil
}

// Document is the subset of SPDX 2.3 JSON this tool writes.
type Document struct {
	SPDXVersion       string         `json:"spdxVersion"`
	DataLicense       string         `json:"dataLicense"`
	SPDXID            string         `json:"SPDXID"`
	Name              string         `json:"name"`
	DocumentNamespace string         `json:"documentNamespace"`
	CreationInfo      CreationInfo   `json:"creationInfo"`
	Packages          []Package      `json:"packages"`
	Relationships     []Relationship `json:"relationships"`
}

// CreationInfo says who made the document and when.
type CreationInfo struct {
	Created  string   `json:"created"`
	Creators []string `json:"creators"`
}

// Package is one binary or one Go module.
type Package struct {
	SPDXID           string        `json:"SPDXID"`
	Name             string        `json:"name"`
	VersionInfo      string        `json:"versionInfo,omitempty"`
	DownloadLocation string        `json:"downloadLocation"`
	FilesAnalyzed    bool          `json:"filesAnalyzed"`
	Checksums        []Checksum    `json:"checksums,omitempty"`
	ExternalRefs     []ExternalRef `json:"externalRefs,omitempty"`
	Comment          string        `json:"comment,omitempty"`
}

// Checksum of a binary.
type Checksum struct {
	Algorithm string `json:"algorithm"`
	Value     string `json:"checksumValue"`
}

// ExternalRef is a package URL.
type ExternalRef struct {
	Category string `json:"referenceCategory"`
	Type     string `json:"referenceType"`
	Locator  string `json:"referenceLocator"`
}

// Relationship links the document, binaries and modules.
type Relationship struct {
	Element string `json:"spdxElementId"`
	Type    string `json:"relationshipType"`
	Related string `json:"relatedSpdxElement"`
}

func spdxID(s string) string {
	r := strings.NewReplacer("/", "-", "@", "-", "+", "-", "_", "-", "~", "-")
	return "SPDXRef-" + r.Replace(s)
}

// Generate reads each binary's build information and returns one document
// describing them all; modules shared by several binaries appear once.
func Generate(bins []string, created time.Time) (*Document, error) {
	doc := &Document{
		SPDXVersion: "SPDX-2.3", DataLicense: "CC0-1.0", SPDXID: "SPDXRef-DOCUMENT",
		CreationInfo: CreationInfo{Created: created.UTC().Format(time.RFC3339), Creators: []string{"Tool: remediate-tools-sbom"}},
	}
	mods := map[string]Package{}
	var names []string
	for _, bin := range bins {
		bi, err := buildinfo.ReadFile(bin)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", bin, err)
		}
		b, err := os.ReadFile(bin)
		if err != nil {
			return nil, err
		}
		sum := sha256.Sum256(b)
		settings := []string{"go " + bi.GoVersion}
		for _, s := range bi.Settings {
			if s.Key == "GOOS" || s.Key == "GOARCH" || s.Key == "CGO_ENABLED" || s.Key == "-trimpath" || s.Key == "-ldflags" {
				settings = append(settings, s.Key+"="+s.Value)
			}
		}
		base := filepath.Base(bin)
		id := spdxID("bin-" + base)
		if slices.Contains(names, base) {
			return nil, fmt.Errorf("%s: two binaries named %s", bin, base)
		}
		names = append(names, base)
		doc.Packages = append(doc.Packages, Package{
			SPDXID: id, Name: base, VersionInfo: bi.Main.Version, DownloadLocation: "NOASSERTION",
			Checksums: []Checksum{{"SHA256", hex.EncodeToString(sum[:])}},
			Comment:   "main module " + bi.Main.Path + "; " + strings.Join(settings, " "),
		})
		doc.Relationships = append(doc.Relationships, Relationship{"SPDXRef-DOCUMENT", "DESCRIBES", id})
		for _, d := range bi.Deps {
			m := d
			if d.Replace != nil {
				m = d.Replace
			}
			key := m.Path + "@" + m.Version
			mid := spdxID("mod-" + key)
			if _, ok := mods[key]; !ok {
				p := Package{SPDXID: mid, Name: m.Path, VersionInfo: m.Version, DownloadLocation: "https://proxy.golang.org/" + m.Path + "/@v/" + m.Version + ".zip",
					ExternalRefs: []ExternalRef{{"PACKAGE-MANAGER", "purl", "pkg:golang/" + m.Path + "@" + m.Version}}}
				if m.Sum != "" {
					p.Comment = "go.sum " + m.Sum
				}
				if d.Replace != nil {
					p.Comment = strings.TrimSpace(p.Comment + "; replaces " + d.Path + "@" + d.Version)
				}
				mods[key] = p
			}
			doc.Relationships = append(doc.Relationships, Relationship{id, "DEPENDS_ON", mid})
		}
	}
	keys := make([]string, 0, len(mods))
	for k := range mods {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		doc.Packages = append(doc.Packages, mods[k])
	}
	doc.Name = strings.Join(names, ",")
	h := sha256.New()
	for _, p := range doc.Packages {
		for _, c := range p.Checksums {
			h.Write([]byte(c.Value))
		}
	}
	doc.DocumentNamespace = "https://remediate.dev/spdx/" + hex.EncodeToString(h.Sum(nil))[:32]
	return doc, nil
}
