package bundle

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"crypto/rand"
	"encoding/hex"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func readFile(t *testing.T, path string, lim Limits) *Bundle {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	b, err := Read(f, lim)
	if err != nil {
		t.Fatalf("Read: %v", err)
	}
	return b
}

func TestRoundTripManifest(t *testing.T) {
	path := filepath.Join(t.TempDir(), "b.tar.gz")
	w, err := Create(path, Options{Node: "n1", Version: "v1", Now: func() time.Time { return time.Unix(1700000000, 0) }})
	if err != nil {
		t.Fatal(err)
	}
	must(t, w.Add(ReportTextName, "the --once report", []byte("FINDINGS: none\n"), nil))
	must(t, w.Add("iptables-legacy-save-IPv4.txt", "iptables-legacy-save", []byte("*nat\nCOMMIT\n"), nil))
	must(t, w.Add("ipvs-services.txt", "netlink", nil, os.ErrNotExist))
	if err := w.Add("../evil", "x", nil, nil); err == nil {
		t.Error("a part named ../evil was accepted")
	}
	if err := w.Add(ReportTextName, "x", nil, nil); err == nil {
		t.Error("a part added twice was accepted")
	}
	must(t, w.Close())
	if _, err := Create(path, Options{}); err == nil {
		t.Error("Create overwrote an existing file")
	}

	b := readFile(t, path, Limits{})
	if len(b.Problems) != 0 {
		t.Fatalf("problems in a good bundle: %v", b.Problems)
	}
	if b.Manifest == nil || b.Manifest.Node != "n1" || len(b.Manifest.Parts) != 3 {
		t.Fatalf("manifest %+v", b.Manifest)
	}
	p := b.Manifest.Parts[2]
	if p.Name != "ipvs-services.txt" || p.How != "netlink" || p.Error != os.ErrNotExist.Error() || p.Size != 0 {
		t.Errorf("failed part %+v", p)
	}
	if string(b.Kept[ReportTextName]) != "FINDINGS: none\n" {
		t.Errorf("report %q", b.Kept[ReportTextName])
	}
	for _, e := range b.Entries {
		if e.Check != "ok" {
			t.Errorf("entry %+v", e)
		}
	}
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// Incompressible parts far beyond the bound: the file stays under it,
// every cut part says so, in the part and in the manifest.
func TestSizeBound(t *testing.T) {
	path := filepath.Join(t.TempDir(), "b.tar.gz")
	const max = 2 << 20
	w, err := Create(path, Options{MaxBytes: max, MaxPartBytes: 1 << 20})
	must(t, err)
	for i := 0; i < 5; i++ {
		big := make([]byte, 1536<<10)
		rand.Read(big)
		must(t, w.Add("part"+string(rune('a'+i)), "random", []byte(hex.EncodeToString(big)[:len(big)]), nil))
	}
	must(t, w.Close())
	st, err := os.Stat(path)
	must(t, err)
	if st.Size() > max+64<<10 {
		t.Errorf("bundle is %d bytes, bound %d", st.Size(), max)
	}
	b := readFile(t, path, Limits{})
	if len(b.Problems) != 0 {
		t.Fatalf("problems: %v", b.Problems)
	}
	var sum int64
	for _, p := range b.Manifest.Parts {
		sum += p.Size
		if !p.Truncated || p.Original != 1536<<10 {
			t.Errorf("part %s not marked truncated: %+v", p.Name, p)
		}
	}
	if sum > max {
		t.Errorf("parts total %d > %d", sum, max)
	}
	// The cut is visible in the content too (re-read the first part).
	f, _ := os.Open(path)
	defer f.Close()
	gz, _ := gzip.NewReader(f)
	tr := tar.NewReader(gz)
	tr.Next()
	var buf bytes.Buffer
	buf.ReadFrom(tr)
	if !strings.Contains(buf.String(), "...[truncated by remediate: ") {
		t.Errorf("first part has no truncation mark (ends %q)", buf.String()[buf.Len()-80:])
	}
}

func TestRedact(t *testing.T) {
	const jwt = "eyJhbGciOiJSUzI1NiIsImtpZCI6IkFCQyJ9.eyJpc3MiOiJrdWJlcm5ldGVzL3NlcnZpY2VhY2NvdW50In0.c2lnbmF0dXJlLXBhcnQ"
	in := strings.Join([]string{
		`users:`,
		`- name: admin`,
		`  user:`,
		`    token: s3cr3t-kubeconfig-token`,
		`    client-key-data: TUlJRXBRSUJBQUtDQVFF`,
		`    password: hunter2`,
		`Authorization: Bearer abc.def.ghi`,
		`curl -H "Authorization: Basic dXNlcjpwYXNz" http://x`,
		`kube-proxy --token=cmdline-token --v=2`,
		`{"access_token":"json-token-value"}`,
		`some_metric{label="` + jwt + `"} 1`,
		`-----BEGIN RSA PRIVATE KEY-----`, `MIIEpQIBAAKCAQEA`, `-----END RSA PRIVATE KEY-----`,
		`kubeproxy_sync_proxy_rules_iptables_total{table="nat"} 42`,
	}, "\n")
	out, n := Redact([]byte(in))
	for _, secret := range []string{"s3cr3t-kubeconfig-token", "TUlJRXBRSUJBQUtDQVFF", "hunter2", "abc.def.ghi", "dXNlcjpwYXNz",
		"cmdline-token", "json-token-value", jwt, "MIIEpQIBAAKCAQEA"} {
		if bytes.Contains(out, []byte(secret)) {
			t.Errorf("secret %q left in:\n%s", secret, out)
		}
	}
	if n < 9 {
		t.Errorf("%d redactions, want at least 9", n)
	}
	for _, keep := range []string{"--v=2", `kubeproxy_sync_proxy_rules_iptables_total{table="nat"} 42`, "name: admin"} {
		if !bytes.Contains(out, []byte(keep)) {
			t.Errorf("%q redacted away:\n%s", keep, out)
		}
	}
}

// hostile builds a tar.gz of hand-made entries.
func hostile(_ testing.TB, entries ...func(*tar.Writer)) []byte {
	var buf bytes.Buffer
	gz := gzip.NewWriter(&buf)
	tw := tar.NewWriter(gz)
	for _, e := range entries {
		e(tw)
	}
	tw.Close()
	gz.Close()
	return buf.Bytes()
}

func file(name string, data string) func(*tar.Writer) {
	return func(tw *tar.Writer) {
		tw.WriteHeader(&tar.Header{Name: name, Mode: 0o644, Size: int64(len(data)), Typeflag: tar.TypeReg})
		tw.Write([]byte(data))
	}
}

func link(name, target string, typ byte) func(*tar.Writer) {
	return func(tw *tar.Writer) {
		tw.WriteHeader(&tar.Header{Name: name, Linkname: target, Typeflag: typ})
	}
}

func TestReadHostile(t *testing.T) {
	manifest := `{"format":1,"parts":[{"file":"report.txt","size":2,"sha256":"x"}]}`
	cases := []struct {
		name    string
		data    []byte
		lim     Limits
		problem string // in Problems
		err     string // in the error
	}{
		{"path traversal", hostile(t, file("../../etc/cron.d/x", "evil"), file(ManifestName, manifest)), Limits{}, `"../../etc/cron.d/x" refused: not a flat file name`, ""},
		{"absolute path", hostile(t, file("/etc/passwd", "evil")), Limits{}, `"/etc/passwd" refused: not a flat file name`, ""},
		{"nested path", hostile(t, file("a/b", "evil")), Limits{}, `"a/b" refused`, ""},
		{"symlink", hostile(t, link("report.txt", "/etc/shadow", tar.TypeSymlink)), Limits{}, `"report.txt" refused: not a regular file`, ""},
		{"hard link", hostile(t, link("report.txt", "/etc/shadow", tar.TypeLink)), Limits{}, `refused: not a regular file`, ""},
		{"device", hostile(t, func(tw *tar.Writer) { tw.WriteHeader(&tar.Header{Name: "dev", Typeflag: tar.TypeChar}) }), Limits{}, "refused: not a regular file", ""},
		{"duplicate", hostile(t, file("report.txt", "a"), file("report.txt", "b")), Limits{}, "refused: duplicate name", ""},
		{"tampered", hostile(t, file("report.txt", "hi"), file(ManifestName, manifest)), Limits{}, "report.txt: MISMATCH", ""},
		{"bad manifest", hostile(t, file(ManifestName, "{")), Limits{}, "MANIFEST.json does not parse", ""},
		{"huge entry", hostile(t, file("big", strings.Repeat("x", 4096))), Limits{MaxEntryBytes: 1024}, `"big" refused: 4096 bytes (limit 1024)`, ""},
		{"bomb", hostile(t, file("zeros", strings.Repeat("\x00", 1<<20))), Limits{MaxTotalBytes: 64 << 10}, "", "larger than the read limit"},
		{"many entries", hostile(t, file("a", ""), file("b", ""), file("c", "")), Limits{MaxEntries: 2}, "", "more than 2 entries"},
		{"not gzip", []byte("plain text"), Limits{}, "", "not a gzip stream"},
		{"not tar", gzipped([]byte(strings.Repeat("garbage", 200))), Limits{}, "", "reading tar"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			b, err := Read(bytes.NewReader(c.data), c.lim)
			if c.err != "" {
				if err == nil || !strings.Contains(err.Error(), c.err) {
					t.Fatalf("error %v, want %q", err, c.err)
				}
			} else if err != nil {
				t.Fatalf("error %v", err)
			}
			if c.problem != "" && !strings.Contains(strings.Join(b.Problems, "\n"), c.problem) {
				t.Errorf("problems %q, want %q", b.Problems, c.problem)
			}
		})
	}
}

func gzipped(b []byte) []byte {
	var buf bytes.Buffer
	gz := gzip.NewWriter(&buf)
	gz.Write(b)
	gz.Close()
	return buf.Bytes()
}

func FuzzRead(f *testing.F) {
	f.Add(hostile(nil, file("report.txt", "hi"), file(ManifestName, `{"parts":[]}`)))
	f.Add(hostile(nil, link("x", "/etc", tar.TypeSymlink)))
	f.Add([]byte{0x1f, 0x8b})
	f.Fuzz(func(t *testing.T, data []byte) {
		b, _ := Read(bytes.NewReader(data), Limits{MaxTotalBytes: 1 << 20, MaxEntryBytes: 256 << 10, KeepBytes: 64 << 10})
		if b == nil {
			t.Fatal("nil bundle")
		}
		for k, v := range b.Kept {
			if len(v) > 64<<10 {
				t.Fatalf("kept %s: %d bytes", k, len(v))
			}
		}
	})
}

// Redacting what was redacted changes nothing: no rule leaves a secret
// that another rule (or itself) would still find.
func FuzzRedact(f *testing.F) {
	f.Add([]byte("Authorization: Bearer abc\ntoken: x\n"))
	f.Add([]byte(`{"access_token":"v","password":"p"}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		out, _ := Redact(data)
		if again, _ := Redact(out); !bytes.Equal(again, out) {
			t.Fatalf("not idempotent:\n%q\n%q\n%q", data, out, again)
		}
	})
}
