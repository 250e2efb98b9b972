package bundle

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"crypto/rand"
	"encoding/hex"
	"fmt"
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
	for _, c := range redactionCorpus {
		f.Add([]byte(c.in))
	}
	for _, c := range argvShapes {
		f.Add([]byte(c.line))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		out, _ := Redact(data)
		if again, _ := Redact(out); !bytes.Equal(again, out) {
			t.Fatalf("not idempotent:\n%q\n%q\n%q", data, out, again)
		}
	})
}

// redactionCorpus is every shape of credential a bundle part may carry, as
// it appears there, with the secret that must not survive.
var redactionCorpus = []struct{ in, secret string }{
	{"\"cmdline\": [\n    \"kube-proxy\",\n    \"--token\",\n    \"S3CRET-argv-split\",\n    \"--v=2\"\n  ]", "S3CRET-argv-split"},
	{`kube-proxy --token S3CRET-argv-space --v=2`, "S3CRET-argv-space"},
	{`kube-proxy --token=S3CRET-argv-eq --v=2`, "S3CRET-argv-eq"},
	{`["kube-proxy","--bearer-token","S3CRET-bearer-flag"]`, "S3CRET-bearer-flag"},
	{`["kube-proxy", "--client-secret", "S3CRET-client-secret"]`, "S3CRET-client-secret"},
	{`kube-proxy --proxy-url=http://bob:Pa55w0rd@proxy:3128`, "Pa55w0rd"},
	{`"--proxy-url", "http://bob:Pa55w0rd-json@proxy"`, "Pa55w0rd-json"},
	{`rest_client_requests_total{code="200",host="https://admin:S3cret-metric@10.0.0.1:6443",method="GET"} 12`, "S3cret-metric"},
	{`git remote: https://x-access-token:ghp_S3cretGit@github.com/o/r`, "ghp_S3cretGit"},
	{`password with an at: https://u:p@ss-S3cret@host/path`, "ss-S3cret"},
	{`Authorization: Bearer bearer-S3cret-header`, "bearer-S3cret-header"},
	{`curl -H "Authorization: Basic dXNlcjpwYXNz" http://x`, "dXNlcjpwYXNz"},
	{`level=info msg="call" auth="bearer S3cretBearerLog"`, "S3cretBearerLog"},
	{`some_metric{sa="eyJhbGciOiJSUzI1NiIsImtpZCI6IkFCQyJ9.eyJpc3MiOiJrdWJlcm5ldGVzIn0.c2lnbmF0dXJl"} 1`, "eyJhbGciOiJSUzI1NiIsImtpZCI6IkFCQyJ9"},
	{"users:\n- name: admin\n  user:\n    client-certificate-data: LS0tLS1CRUdJTiBDRVJUSUZJQ0FURS0tLS0tCk1JSUM=\n", "LS0tLS1CRUdJTiBDRVJUSUZJQ0FURS0tLS0tCk1JSUM"},
	{"    client-key-data: LS0tLS1CRUdJTiBSU0EgUFJJVkFURSBLRVktLS0tLQpNSUlF\n", "LS0tLS1CRUdJTiBSU0EgUFJJVkFURSBLRVktLS0tLQpNSUlF"},
	{"    token: kubeconfig-S3cret-token\n", "kubeconfig-S3cret-token"},
	{"    password: hunter2-S3cret\n", "hunter2-S3cret"},
	{"      auth-provider:\n        config:\n          id-token: oidc-id-S3cret\n          refresh-token: oidc-refresh-S3cret\n          client-secret: oidc-client-S3cret\n", "oidc-"},
	{`kubeadm join 10.0.0.1:6443 --token abcdef.0123456789abcdef --discovery-token-ca-cert-hash sha256:1234`, "abcdef.0123456789abcdef"},
	{`KUBE_PROXY_SECRET=env-S3cret-value`, "env-S3cret-value"},
	{`{"access_token":"json-S3cret-token","api_key":"json-S3cret-key"}`, "json-S3cret"},
	{"-----BEGIN EC PRIVATE KEY-----\nMHcCAQEEIS3cretPEMbody\n-----END EC PRIVATE KEY-----", "MHcCAQEEIS3cretPEMbody"},
}

// redactionKeep is what must survive next to the corpus: the evidence.
var redactionKeep = []string{
	"--v=2", `"kube-proxy"`, "name: admin", `code="200"`, `method="GET"`, "10.0.0.1:6443",
	`-A KUBE-SERVICES -d 10.96.0.1/32 -p tcp -m comment --comment "default/kubernetes:https cluster IP" -m tcp --dport 443 -j KUBE-SVC-NPX46M4PTMTKRN6Y`,
	`kubeproxy_sync_proxy_rules_iptables_total{table="nat"} 42`, "--kubeconfig=/var/lib/kube-proxy/kubeconfig", "--hostname-override node-1",
}

// Every part a bundle holds, each carrying the whole corpus (and the argv
// shapes) in its place, and the manifest's how and error carrying a
// policy URL's password and query token and every argv shape: what is
// read back holds no secret of it and keeps the evidence. On main the
// manifest kept the URL's password and 25 argv shapes survived.
func TestRedactCorpusInEveryPart(t *testing.T) {
	parts := []string{ReportTextName, ReportJSONName, "versions.txt",
		"iptables-legacy-save.txt", "ip6tables-legacy-save.txt", "iptables-nft-save.txt", "ip6tables-nft-save.txt",
		"nft-ip-kube-proxy.txt", "nft-ip6-kube-proxy.txt", "ipvs-services.txt", "ipvs-connections.txt", "conntrack.json",
		"kube-proxy-metrics.txt", "kube-proxy-healthz.txt", "kube-proxy-proxyMode.txt", "kube-proxy-configz.json",
		"proc-locks.txt", "xtables-lock.json", "processes.json", "journal-tail.txt"}
	var body strings.Builder
	for i, c := range redactionCorpus {
		fmt.Fprintf(&body, "%s\n%s\n", redactionKeep[i%len(redactionKeep)], c.in)
	}
	for i, c := range argvShapes {
		fmt.Fprintf(&body, "%s\n%s\n", argvKeep[i%len(argvKeep)], c.line)
	}
	// The manifest's how and error carry what a collector was given: a
	// policy URL with a password, a query token, an argv.
	var how strings.Builder
	for _, c := range argvShapes {
		how.WriteString(c.line + " ")
	}
	planted := []string{"PolicyPassw0rd", "PolicyQueryTok", "ErrPassw0rd", "ErrQueryTok"}
	path := filepath.Join(t.TempDir(), "b.tar.gz")
	w, err := Create(path, Options{Node: "n1"})
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range parts {
		must(t, w.Add(p, "GET http://admin:PolicyPassw0rd@127.0.0.1:10249/metrics?token=PolicyQueryTok "+how.String(), []byte(body.String()),
			fmt.Errorf(`Get "http://admin:ErrPassw0rd@127.0.0.1:10249/metrics?x=1&sig=ErrQueryTok": %s`, how.String())))
	}
	must(t, w.Close())
	b := readFile(t, path, Limits{})
	if len(b.Problems) != 0 {
		t.Fatalf("problems: %v", b.Problems)
	}
	all := map[string][]byte{}
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	gz, err := gzip.NewReader(f)
	if err != nil {
		t.Fatal(err)
	}
	tr := tar.NewReader(gz)
	for {
		h, err := tr.Next()
		if err != nil {
			break
		}
		var buf bytes.Buffer
		if _, err := buf.ReadFrom(tr); err != nil {
			t.Fatal(err)
		}
		all[h.Name] = buf.Bytes()
	}
	for _, p := range parts {
		got, ok := all[p]
		if !ok {
			t.Fatalf("part %s not read back", p)
		}
		for _, c := range redactionCorpus {
			if bytes.Contains(got, []byte(c.secret)) {
				t.Errorf("%s keeps %q (planted as %q)", p, c.secret, c.in)
			}
		}
		for _, c := range argvShapes {
			if bytes.Contains(got, []byte(c.secret)) {
				t.Errorf("%s keeps %q (%s)", p, c.secret, c.shape)
			}
		}
		for _, k := range append(redactionKeep, argvKeep...) {
			if !bytes.Contains(got, []byte(k)) {
				t.Errorf("%s lost the evidence %q", p, k)
			}
		}
	}
	man := all[ManifestName]
	for _, s := range planted {
		if !bytes.Contains(man, []byte("127.0.0.1:10249/metrics")) || bytes.Contains(man, []byte(s)) {
			t.Errorf("MANIFEST.json carries %q:\n%s", s, man)
		}
	}
	for _, c := range argvShapes {
		if bytes.Contains(man, []byte(c.secret)) {
			t.Errorf("MANIFEST.json keeps %q (%s)", c.secret, c.shape)
		}
	}
	for _, p := range b.Manifest.Parts {
		if want := len(redactionCorpus) + len(argvShapes); p.Redactions < want {
			t.Errorf("%s: %d redactions counted, want at least %d", p.Name, p.Redactions, want)
		}
	}
	if t.Failed() {
		t.Logf("read back:\n%s", all[ReportTextName])
	}
}
