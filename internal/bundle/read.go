package bundle

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
)

// Limits bound what Read accepts. Zero fields take the defaults.
type Limits struct {
	// MaxEntries is the most tar entries read (default 200).
	MaxEntries int
	// MaxEntryBytes bounds one entry (default 32 MiB, above any part a
	// writer makes).
	MaxEntryBytes int64
	// MaxTotalBytes bounds the decompressed stream (default 64 MiB): a
	// gzip bomb stops there.
	MaxTotalBytes int64
	// KeepBytes bounds the parts kept in memory for display (the
	// manifest and the reports; default 4 MiB each).
	KeepBytes int64
}

func (l *Limits) defaults() {
	if l.MaxEntries <= 0 {
		l.MaxEntries = 200
	}
	if l.MaxEntryBytes <= 0 {
		l.MaxEntryBytes = 32 << 20
	}
	if l.MaxTotalBytes <= 0 {
		l.MaxTotalBytes = 64 << 20
	}
	if l.KeepBytes <= 0 {
		l.KeepBytes = 4 << 20
	}
}

// Entry is one tar entry as read.
type Entry struct {
	Name   string
	Size   int64
	SHA256 string
	// Check is "ok", or what is wrong: refused (not a flat regular file),
	// not in the manifest, checksum or size mismatch.
	Check string
}

// Bundle is what Read found.
type Bundle struct {
	Manifest *Manifest
	Entries  []Entry
	// Kept holds the manifest and the reports (ManifestName,
	// ReportTextName, ReportJSONName), up to Limits.KeepBytes each.
	Kept map[string][]byte
	// Problems are what makes the bundle suspect: refused entries,
	// missing parts, mismatches, a manifest that does not parse.
	Problems []string
}

var keep = map[string]bool{ManifestName: true, ReportTextName: true, ReportJSONName: true}

// Read reads a bundle from r without writing anything anywhere. It
// refuses entries that are not flat regular files (symlinks, hard links,
// devices, directories, paths with '/' or ".."), bounds every entry and
// the whole stream, and checks each part against the manifest. An error
// means the stream itself could not be read (not gzip, not tar, a limit
// reached); what was read so far is returned with it.
func Read(r io.Reader, lim Limits) (*Bundle, error) {
	lim.defaults()
	b := &Bundle{Kept: map[string][]byte{}}
	gz, err := gzip.NewReader(r)
	if err != nil {
		return b, fmt.Errorf("not a gzip stream: %w", err)
	}
	defer gz.Close()
	total := &limitedReader{r: gz, n: lim.MaxTotalBytes}
	tr := tar.NewReader(total)
	seen := map[string]bool{}
	for i := 0; ; i++ {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return b, finishErr(b, fmt.Errorf("reading tar: %w", err))
		}
		if i >= lim.MaxEntries {
			return b, finishErr(b, fmt.Errorf("more than %d entries", lim.MaxEntries))
		}
		e := Entry{Name: hdr.Name, Size: hdr.Size}
		switch {
		case hdr.Typeflag != tar.TypeReg:
			e.Check = fmt.Sprintf("refused: not a regular file (type %q)", hdr.Typeflag)
		case !ValidName(hdr.Name):
			e.Check = "refused: not a flat file name"
		case hdr.Size < 0 || hdr.Size > lim.MaxEntryBytes:
			e.Check = fmt.Sprintf("refused: %d bytes (limit %d)", hdr.Size, lim.MaxEntryBytes)
		case seen[hdr.Name]:
			e.Check = "refused: duplicate name"
		}
		if e.Check != "" {
			b.Problems = append(b.Problems, fmt.Sprintf("%q %s", clipName(hdr.Name), e.Check))
			e.Name = clipName(hdr.Name)
			b.Entries = append(b.Entries, e)
			continue // tar skips the content on Next (bounded by total)
		}
		seen[hdr.Name] = true
		h := sha256.New()
		var kept bytes.Buffer
		var w io.Writer = h
		if keep[hdr.Name] {
			w = io.MultiWriter(h, &CapWriter{B: &kept, N: lim.KeepBytes})
		}
		n, err := io.Copy(w, io.LimitReader(tr, lim.MaxEntryBytes))
		if err != nil {
			return b, finishErr(b, fmt.Errorf("reading %s: %w", hdr.Name, err))
		}
		e.Size, e.SHA256 = n, hex.EncodeToString(h.Sum(nil))
		if keep[hdr.Name] {
			b.Kept[hdr.Name] = kept.Bytes()
		}
		b.Entries = append(b.Entries, e)
	}
	return b, finishErr(b, nil)
}

// finishErr checks the entries against the manifest.
func finishErr(b *Bundle, err error) error {
	raw, ok := b.Kept[ManifestName]
	if !ok {
		b.Problems = append(b.Problems, "no "+ManifestName)
		return err
	}
	var m Manifest
	if jerr := json.Unmarshal(raw, &m); jerr != nil {
		b.Problems = append(b.Problems, fmt.Sprintf("%s does not parse: %v", ManifestName, jerr))
		return err
	}
	b.Manifest = &m
	parts := map[string]Part{}
	for _, p := range m.Parts {
		parts[p.Name] = p
	}
	found := map[string]bool{}
	for i := range b.Entries {
		e := &b.Entries[i]
		if e.Check != "" {
			continue
		}
		found[e.Name] = true
		p, ok := parts[e.Name]
		switch {
		case e.Name == ManifestName:
			e.Check = "ok"
		case !ok:
			e.Check = "not in the manifest"
		case p.Size != e.Size || p.SHA256 != e.SHA256:
			e.Check = "MISMATCH: size or sha256 differ from the manifest"
		default:
			e.Check = "ok"
		}
		if e.Check != "ok" {
			b.Problems = append(b.Problems, fmt.Sprintf("%s: %s", e.Name, e.Check))
		}
	}
	if err == nil {
		for _, p := range m.Parts {
			if !found[p.Name] {
				b.Problems = append(b.Problems, fmt.Sprintf("%s: in the manifest, missing from the bundle", clipName(p.Name)))
			}
		}
	}
	return err
}

func clipName(s string) string {
	if len(s) > 120 {
		return s[:120] + "..."
	}
	return s
}

// limitedReader fails (rather than ending quietly) past n bytes.
type limitedReader struct {
	r io.Reader
	n int64
}

func (l *limitedReader) Read(p []byte) (int, error) {
	if l.n <= 0 {
		return 0, errors.New("bundle larger than the read limit when decompressed")
	}
	if int64(len(p)) > l.n {
		p = p[:l.n]
	}
	n, err := l.r.Read(p)
	l.n -= int64(n)
	return n, err
}

// CapWriter keeps the first N bytes written to B and discards the rest
// (without failing the writer, so a command's output can be cut while it
// runs to the end).
type CapWriter struct {
	B *bytes.Buffer
	N int64
}

func (c *CapWriter) Write(p []byte) (int, error) {
	if rest := c.N - int64(c.B.Len()); rest > 0 {
		c.B.Write(p[:min(int64(len(p)), rest)])
	}
	return len(p), nil
}
