// Package bundle writes and reads the evidence bundle of `remediate --once
// --bundle FILE.tar.gz`: a gzipped tar of flat, named parts (the report,
// each backend's *-save output, kube-proxy's answers, the lock table...)
// and a MANIFEST.json saying, for each part, its size, SHA-256, how it was
// obtained and the error if it could not be.
//
// The writer bounds the bundle: each part is capped (truncation is marked
// in the part and the manifest) and all parts together stay under a total;
// every part, and each part's how and error in the manifest, passes
// through Redact (by shape: credential names, known token prefixes, URL
// userinfo and query credentials, headers and cookies, private keys,
// JWTs, base64 decoded once, high-entropy tokens) before it is written. The
// reader is for bundles from anywhere: it keeps nothing on disk, refuses
// anything but flat regular files, bounds every entry and the whole
// stream, and checks each part against the manifest.
package bundle

import (
	"archive/tar"
	"compress/gzip"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"regexp"
	"time"
)

// Names of the parts every bundle has.
const (
	ManifestName   = "MANIFEST.json"
	ReportTextName = "report.txt"
	ReportJSONName = "report.json"
)

// Defaults of Options.
const (
	DefaultMaxBytes     = 20 << 20
	DefaultMaxPartBytes = 8 << 20
	// manifestReserve is kept free of parts for the manifest itself.
	manifestReserve = 256 << 10
)

// Part is one file of the bundle as the manifest describes it.
type Part struct {
	Name string `json:"file"`
	// Size is the bytes written (after redaction and truncation).
	Size   int64  `json:"size"`
	SHA256 string `json:"sha256"`
	// How is how the content was obtained ("iptables-legacy-save",
	// "GET http://127.0.0.1:10249/metrics", "netlink IPVS_CMD_GET_SERVICE").
	How string `json:"how"`
	// Error is why the content is missing or partial.
	Error string `json:"error,omitempty"`
	// Truncated: the content was cut at the part's cap; Original is how
	// much had been obtained (a collector may itself stop reading just
	// past the cap, so the source may have been longer still).
	Truncated bool  `json:"truncated,omitempty"`
	Original  int64 `json:"originalSize,omitempty"`
	// Redactions counts the secrets replaced in the part, its how and
	// its error.
	Redactions int `json:"redactions,omitempty"`
}

// Manifest is MANIFEST.json, the bundle's last entry.
type Manifest struct {
	Format   int       `json:"format"`
	Created  time.Time `json:"created"`
	Node     string    `json:"node"`
	Version  string    `json:"remediateVersion"`
	MaxBytes int64     `json:"maxBytes"`
	Parts    []Part    `json:"parts"`
}

// Options configure a Writer. Zero fields take the defaults.
type Options struct {
	Node, Version string
	// MaxBytes bounds the content of all parts together (uncompressed),
	// so the file is at most about this large.
	MaxBytes int64
	// MaxPartBytes bounds one part.
	MaxPartBytes int64
	Now          func() time.Time
}

// Writer writes a bundle. Parts are added one at a time; Close writes the
// manifest and closes the file. Not safe for concurrent use.
type Writer struct {
	f    *os.File
	gz   *gzip.Writer
	tw   *tar.Writer
	o    Options
	used int64
	m    Manifest
	seen map[string]bool
}

// Create starts a bundle at path (created, not overwritten: an existing
// file is an error, so a bundle never replaces something by accident).
func Create(path string, o Options) (*Writer, error) {
	if o.MaxBytes <= 0 {
		o.MaxBytes = DefaultMaxBytes
	}
	if o.MaxPartBytes <= 0 {
		o.MaxPartBytes = DefaultMaxPartBytes
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return nil, fmt.Errorf("creating bundle: %w", err)
	}
	gz := gzip.NewWriter(f)
	return &Writer{f: f, gz: gz, tw: tar.NewWriter(gz), o: o, seen: map[string]bool{},
		m: Manifest{Format: 1, Created: o.Now().UTC(), Node: o.Node, Version: o.Version, MaxBytes: o.MaxBytes}}, nil
}

// truncMark ends a truncated part.
func truncMark(kept, of int) string {
	return fmt.Sprintf("\n...[truncated by remediate: %d of %d bytes kept]\n", kept, of)
}

// Add writes one part: data redacted, then cut to what the part's cap and
// the bundle's remaining room allow (marked). err, if set, is recorded in
// the manifest (data may still hold what was obtained before it). A name
// that is not a plain file name, or used twice, is an error.
func (w *Writer) Add(name, how string, data []byte, err error) error {
	if !ValidName(name) || name == ManifestName {
		return fmt.Errorf("bundle: invalid part name %q", name)
	}
	if w.seen[name] {
		return fmt.Errorf("bundle: part %q added twice", name)
	}
	w.seen[name] = true
	// The manifest is redacted like the parts: a how names a URL (a
	// policy's, with userinfo or a token in its query), an error quotes
	// it.
	var nHow, nErr int
	p := Part{Name: name}
	p.How, nHow = RedactString(how)
	if err != nil {
		p.Error, nErr = RedactString(err.Error())
	}
	data, p.Redactions = Redact(data)
	p.Redactions += nHow + nErr
	room := min(w.o.MaxPartBytes, w.o.MaxBytes-manifestReserve-w.used)
	if int64(len(data)) > room {
		p.Truncated, p.Original = true, int64(len(data))
		// The mark is at most as long as with kept = len(data).
		keep := max(room-int64(len(truncMark(len(data), len(data)))), 0)
		data = append(data[:keep:keep], truncMark(int(keep), len(data))...)
	}
	sum := sha256.Sum256(data)
	p.Size, p.SHA256 = int64(len(data)), hex.EncodeToString(sum[:])
	if err := w.entry(name, data); err != nil {
		return err
	}
	w.used += p.Size
	w.m.Parts = append(w.m.Parts, p)
	return nil
}

func (w *Writer) entry(name string, data []byte) error {
	hdr := &tar.Header{Name: name, Mode: 0o600, Size: int64(len(data)), ModTime: w.m.Created, Typeflag: tar.TypeReg, Format: tar.FormatPAX}
	if err := w.tw.WriteHeader(hdr); err != nil {
		return fmt.Errorf("bundle: %s: %w", name, err)
	}
	if _, err := w.tw.Write(data); err != nil {
		return fmt.Errorf("bundle: %s: %w", name, err)
	}
	return nil
}

// Close writes the manifest and closes the file (synced).
func (w *Writer) Close() error {
	b, err := json.MarshalIndent(w.m, "", "  ")
	if err != nil {
		return err
	}
	errs := []error{w.entry(ManifestName, append(b, '\n')), w.tw.Close(), w.gz.Close(), w.f.Sync(), w.f.Close()}
	return errors.Join(errs...)
}

// Abort closes and removes an unfinished bundle.
func (w *Writer) Abort() {
	_ = w.f.Close()
	_ = os.Remove(w.f.Name())
}

// Manifest returns the parts written so far.
func (w *Writer) Manifest() Manifest { return w.m }

var nameRE = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$`)

// ValidName reports whether name is a flat file name a bundle may hold:
// letters, digits, '.', '_', '-', no directory, no "..".
func ValidName(name string) bool {
	return nameRE.MatchString(name) && name != ".." && !containsDotDot(name)
}

func containsDotDot(s string) bool {
	for i := 0; i+1 < len(s); i++ {
		if s[i] == '.' && s[i+1] == '.' {
			return true
		}
	}
	return false
}
