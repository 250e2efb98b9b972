package main

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/remediate-dev/remediate/internal/bundle"
)

// readParts returns every part of a bundle file by name.
func readParts(t *testing.T, path string) map[string][]byte {
	t.Helper()
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
	out := map[string][]byte{}
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return out
		}
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(tr)
		out[h.Name] = b
	}
}

const (
	plantedMetricToken = "eyJhbGciOiJSUzI1NiJ9.eyJzdWIiOiJzeXN0ZW06a3ViZS1wcm94eSJ9.planted-signature"
	plantedArgvToken   = "argv-token-6c1f"
	plantedEnvValue    = "env-secret-93ab"
	// The shapes: a flag and its value as two argv entries, URL
	// userinfo on a command line and in a metric's label.
	plantedSplitToken = "S3CRET-split-51d2"
	plantedProxyPass  = "Pa55w0rd-7e10"
	plantedHostPass   = "S3cret-host-c0de"
)

// kubeProxyWithSecrets serves metrics with credentials planted in them and
// metricsPad bytes of filler.
func kubeProxyWithSecrets(t *testing.T, metricsPad int) string {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/proxyMode":
			fmt.Fprint(w, "iptables")
		case "/healthz":
			fmt.Fprint(w, `{"lastUpdated": "2026-01-01T00:00:00Z","currentTime": "2026-01-01T00:00:01Z", "nodeEligible": true}`)
		case "/configz":
			fmt.Fprint(w, `{"kubeproxy.config.k8s.io":{"mode":"iptables","syncPeriod":"30s","clientConnection":{"kubeconfig":"/var/lib/kube-proxy/kubeconfig"}}}`)
		case "/metrics":
			fmt.Fprintf(w, "# a scrape config leaked into a label\nkubeproxy_test_info{authorization=\"Bearer %s\",sa=\"%s\"} 1\n", plantedMetricToken, plantedMetricToken)
			fmt.Fprint(w, "kubeproxy_sync_proxy_rules_iptables_total{table=\"nat\"} 42\n")
			fmt.Fprintf(w, "rest_client_requests_total{code=\"200\",host=\"https://admin:%s@10.0.0.1:6443\",method=\"GET\"} 7\n", plantedHostPass)
			pad := strings.Repeat("# padding padding padding padding padding padding padding padding\n", metricsPad/66+1)
			fmt.Fprint(w, pad)
		default:
			http.NotFound(w, r)
		}
	}))
	t.Cleanup(srv.Close)
	return srv.URL
}

// startFakeKubeProxy runs this test binary (sleeping) as a process whose argv[0] is kube-proxy,
// with a credential on its command line and one in its environment.
func startFakeKubeProxy(t *testing.T) int {
	t.Helper()
	cmd := &exec.Cmd{Path: os.Args[0], Args: []string{"kube-proxy", "--token=" + plantedArgvToken, "--token", plantedSplitToken,
		"--proxy-url=http://bob:" + plantedProxyPass + "@proxy:3128", "--v=2"},
		Env: []string{"REMEDIATE_TEST_SLEEP=1", "KUBE_PROXY_SECRET=" + plantedEnvValue}}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	return cmd.Process.Pid
}

func bundlePolicy(t *testing.T, dir, url string) string {
	return policyFile(t, dir, fmt.Sprintf(`kubeProxy: {metricsURL: %[1]s/metrics, healthzURL: %[1]s/healthz, proxyModeURL: %[1]s/proxyMode}
rules:
- name: bloat
  detector: {type: KubeProxyRuleBloat}
`, url))
}

// One --once --bundle run of the real binary: every part named in the
// issue is there with its manifest entry, credentials planted in
// kube-proxy's metrics and a process's command line are gone, a
// process's environment never read, and `bundle show` checks it.
func TestOnceBundleContentsAndRedaction(t *testing.T) {
	dir := t.TempDir()
	pid := startFakeKubeProxy(t)
	pol := bundlePolicy(t, dir, kubeProxyWithSecrets(t, 0))
	path := filepath.Join(dir, "node.tar.gz")
	cmd := mainCmd(os.Args[0], "--once", "--sample", "0", "--dry-run", "--policy", pol, "--state-dir", filepath.Join(dir, "state"),
		"--node-name", "n1", "--bundle", path)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, _ := cmd.Output()
	if code := cmd.ProcessState.ExitCode(); code != exitOK && code != exitFindings {
		t.Fatalf("exit %d\n%s\n%s", code, out, stderr.String())
	}
	if !strings.Contains(stderr.String(), "remediate: bundle "+path+" written") {
		t.Errorf("stderr does not say the bundle was written:\n%s", stderr.String())
	}
	parts := readParts(t, path)
	want := []string{bundle.ManifestName, bundle.ReportTextName, bundle.ReportJSONName, "versions.txt",
		"iptables-legacy-save.txt", "ip6tables-legacy-save.txt", "iptables-nft-save.txt", "ip6tables-nft-save.txt",
		"nft-ip-kube-proxy.txt", "nft-ip6-kube-proxy.txt", "ipvs-services.txt", "ipvs-connections.txt", "conntrack.json",
		"kube-proxy-metrics.txt", "kube-proxy-healthz.txt", "kube-proxy-proxyMode.txt", "kube-proxy-configz.json",
		"proc-locks.txt", "xtables-lock.json", "processes.json", "journal-tail.txt"}
	for _, n := range want {
		if _, ok := parts[n]; !ok {
			t.Errorf("bundle lacks %s", n)
		}
	}
	if len(parts) != len(want) {
		t.Errorf("bundle has %d parts, want %d", len(parts), len(want))
	}
	var m bundle.Manifest
	if err := json.Unmarshal(parts[bundle.ManifestName], &m); err != nil {
		t.Fatal(err)
	}
	if m.Node != "n1" || len(m.Parts) != len(want)-1 {
		t.Errorf("manifest node %q with %d parts", m.Node, len(m.Parts))
	}
	for _, p := range m.Parts {
		if p.How == "" || len(p.SHA256) != 64 {
			t.Errorf("manifest entry %+v lacks how or sha256", p)
		}
	}
	for name, b := range parts {
		for _, s := range []string{plantedMetricToken, plantedArgvToken, plantedEnvValue, "KUBE_PROXY_SECRET", plantedSplitToken, plantedProxyPass, plantedHostPass} {
			if bytes.Contains(b, []byte(s)) {
				t.Errorf("%s carries the planted secret %q", name, s)
			}
		}
	}
	if !bytes.Contains(parts["kube-proxy-metrics.txt"], []byte(`kubeproxy_sync_proxy_rules_iptables_total{table="nat"} 42`)) ||
		!bytes.Contains(parts["kube-proxy-metrics.txt"], []byte(bundle.Redacted)) {
		t.Errorf("metrics part:\n%s", parts["kube-proxy-metrics.txt"])
	}
	if !bytes.Contains(parts["report.txt"], []byte("Node: n1")) || !bytes.Contains(parts["kube-proxy-proxyMode.txt"], []byte("iptables")) {
		t.Errorf("report or proxyMode missing:\n%s", parts["report.txt"])
	}
	var procs []struct {
		Pid        int
		Cmdline    []string
		State      string
		AgeSeconds float64
	}
	if err := json.Unmarshal(parts["processes.json"], &procs); err != nil {
		t.Fatalf("%v\n%s", err, parts["processes.json"])
	}
	found := false
	for _, p := range procs {
		if p.Pid == pid {
			found = true
			if p.State == "" || p.Cmdline[0] != "kube-proxy" || !strings.Contains(strings.Join(p.Cmdline, " "), "--token="+bundle.Redacted+" --token "+bundle.Redacted+
				" --proxy-url=http://"+bundle.Redacted+"@proxy:3128 --v=2") {
				t.Errorf("fake kube-proxy listed as %+v", p)
			}
		}
	}
	if !found && os.Geteuid() == 0 {
		t.Errorf("fake kube-proxy pid %d not in processes.json:\n%s", pid, parts["processes.json"])
	}

	code, sout, serr := run(t, "bundle", "show", path)
	if code != exitOK || !strings.Contains(sout, "Bundle "+path+": node n1") || !strings.Contains(sout, "kube-proxy-metrics.txt") ||
		!strings.Contains(sout, "--- report.txt ---") || strings.Contains(sout, "PROBLEMS") {
		t.Errorf("bundle show: exit %d\n%s\n%s", code, sout, serr)
	}
	// Never overwrites (TestOnceBundlePathRefusedBeforeSample: said before
	// the pass).
	cmd = mainCmd(os.Args[0], "--once", "--sample", "0", "--policy", pol, "--state-dir", filepath.Join(dir, "state"), "--node-name", "n1", "--bundle", path)
	stderr.Reset()
	cmd.Stderr = &stderr
	out, _ = cmd.Output()
	if cmd.ProcessState.ExitCode() != exitError || !strings.Contains(stderr.String(), "already exists") {
		t.Errorf("second bundle to the same file: exit %d\n%s\n%s", cmd.ProcessState.ExitCode(), out, stderr.String())
	}
}

// --bundle to an existing file, into a missing directory or through a
// file is refused at start, on stderr, before the --sample wait (the
// default 10 s) and the pass: no report, the file untouched.
func TestOnceBundlePathRefusedBeforeSample(t *testing.T) {
	dir := t.TempDir()
	pol := policyFile(t, dir, "rules:\n- name: bloat\n  detector: {type: KubeProxyRuleBloat}\n")
	existing := filepath.Join(dir, "old.tar.gz")
	if err := os.WriteFile(existing, []byte("keep me"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct{ path, want string }{
		{existing, "--bundle " + existing + ": already exists"},
		{filepath.Join(dir, "no-such-dir", "b.tar.gz"), "--bundle " + filepath.Join(dir, "no-such-dir", "b.tar.gz") + ": its directory " + filepath.Join(dir, "no-such-dir") + ": no such file or directory"},
		{filepath.Join(existing, "b.tar.gz"), "--bundle " + filepath.Join(existing, "b.tar.gz") + ": its directory " + existing + ": not a directory"},
	} {
		code, out, errs := run(t, "--once", "--dry-run", "--policy", pol, "--state-dir", filepath.Join(dir, "state"), "--node-name", "n1", "--bundle", c.path)
		if code != exitError || out != "" || !strings.Contains(errs, "Error: "+c.want) || strings.Contains(errs, "sampl") {
			t.Errorf("--bundle %s: exit %d, want 1 with %q on stderr and nothing on stdout\nstdout:\n%s\nstderr:\n%s", c.path, code, c.want, out, errs)
		}
	}
	if b, _ := os.ReadFile(existing); string(b) != "keep me" {
		t.Errorf("existing file changed: %q", b)
	}
}

// A kube-proxy answering 3 MiB of metrics and a 1 MiB bound: the file
// stays under the bound and the cut part is marked.
func TestOnceBundleSizeBound(t *testing.T) {
	dir := t.TempDir()
	pol := bundlePolicy(t, dir, kubeProxyWithSecrets(t, 3<<20))
	path := filepath.Join(dir, "b.tar.gz")
	code, out, errOut := run(t, "--once", "--sample", "0", "--policy", pol, "--state-dir", dir, "--node-name", "n1", "--bundle", path, "--bundle-max-mib", "1")
	if code == exitError {
		t.Fatalf("exit %d\n%s\n%s", code, out, errOut)
	}
	st, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if st.Size() > 1<<20 {
		t.Errorf("bundle %d bytes, bound 1 MiB", st.Size())
	}
	parts := readParts(t, path)
	var m bundle.Manifest
	json.Unmarshal(parts[bundle.ManifestName], &m)
	var total int
	for _, b := range parts {
		total += len(b)
	}
	if total > 1<<20 {
		t.Errorf("parts hold %d bytes uncompressed, bound 1 MiB", total)
	}
	for _, p := range m.Parts {
		if p.Name == "kube-proxy-metrics.txt" && (!p.Truncated || p.Original < 1<<20) {
			t.Errorf("metrics part not marked cut: %+v", p)
		}
	}
	if !bytes.Contains(parts["kube-proxy-metrics.txt"], []byte("...[truncated by remediate: ")) {
		t.Error("metrics part has no truncation mark")
	}
}

func TestBundleShowHostile(t *testing.T) {
	dir := t.TempDir()
	var buf bytes.Buffer
	gz := gzip.NewWriter(&buf)
	tw := tar.NewWriter(gz)
	tw.WriteHeader(&tar.Header{Name: "../../etc/cron.d/evil", Mode: 0o644, Size: 4, Typeflag: tar.TypeReg})
	tw.Write([]byte("evil"))
	tw.WriteHeader(&tar.Header{Name: "report.txt", Linkname: "/etc/shadow", Typeflag: tar.TypeSymlink})
	man := `{"format":1,"node":"n\u001b[31mred","parts":[{"file":"journal-tail.txt","size":1,"sha256":"00"}]}`
	tw.WriteHeader(&tar.Header{Name: "MANIFEST.json", Mode: 0o644, Size: int64(len(man)), Typeflag: tar.TypeReg})
	tw.Write([]byte(man))
	tw.Close()
	gz.Close()
	path := filepath.Join(dir, "evil.tar.gz")
	os.WriteFile(path, buf.Bytes(), 0o644)
	code, out, _ := run(t, "bundle", "show", path)
	if code != exitError {
		t.Errorf("exit %d, want 1", code)
	}
	for _, s := range []string{`"../../etc/cron.d/evil" refused: not a flat file name`, `"report.txt" refused: not a regular file`,
		"journal-tail.txt: in the manifest, missing from the bundle", `node n\x1b[31mred`} {
		if !strings.Contains(out, s) {
			t.Errorf("output lacks %q:\n%s", s, out)
		}
	}
	if _, err := os.Stat(filepath.Join(dir, "..", "..", "etc", "cron.d", "evil")); err == nil {
		t.Error("an entry was extracted")
	}
	if code, _, errOut := run(t, "bundle", "show", filepath.Join(dir, "missing.tar.gz")); code != exitError || !strings.Contains(errOut, "no such file") {
		t.Errorf("missing file: exit %d %s", code, errOut)
	}
	if code, _, errOut := run(t, "bundle", "show"); code != exitError || !strings.Contains(errOut, "needs FILE") {
		t.Errorf("no FILE: exit %d %s", code, errOut)
	}
}

// The bundle is collected while another process holds the xtables lock:
// the saves succeed (they never take it) and the lock's holder is named.
func TestOnceBundleUnderHeldXtablesLock(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root (iptables-legacy-save)")
	}
	if _, err := exec.LookPath("iptables-legacy-save"); err != nil {
		t.Skip("no iptables-legacy-save")
	}
	dir := t.TempDir()
	lock := filepath.Join(dir, "xtables.lock")
	f, err := os.Create(lock)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX); err != nil {
		t.Fatal(err)
	}
	pol := bundlePolicy(t, dir, kubeProxyWithSecrets(t, 0))
	path := filepath.Join(dir, "b.tar.gz")
	cmd := mainCmd(os.Args[0], "--once", "--sample", "0", "--policy", pol, "--state-dir", filepath.Join(dir, "state"),
		"--node-name", "n1", "--xtables-lock", lock, "--bundle", path)
	cmd.Env = append(cmd.Env, "XTABLES_LOCKFILE="+lock) // iptables' own lock, for the commands it runs
	start := time.Now()
	out, _ := cmd.Output()
	if code := cmd.ProcessState.ExitCode(); code == exitError || time.Since(start) > 30*time.Second {
		t.Fatalf("exit %d after %s\n%s", code, time.Since(start), out)
	}
	parts := readParts(t, path)
	var m bundle.Manifest
	if err := json.Unmarshal(parts[bundle.ManifestName], &m); err != nil {
		t.Fatal(err)
	}
	for _, p := range m.Parts {
		if (p.Name == "iptables-legacy-save.txt" || p.Name == "ip6tables-legacy-save.txt") && p.Error != "" {
			t.Errorf("%s failed under the held lock: %s", p.Name, p.Error)
		}
	}
	var fl struct {
		Held    bool
		Holders []struct{ Pid int }
	}
	if err := json.Unmarshal(parts["xtables-lock.json"], &fl); err != nil {
		t.Fatalf("%v\n%s", err, parts["xtables-lock.json"])
	}
	self := false
	for _, h := range fl.Holders {
		self = self || h.Pid == os.Getpid()
	}
	if !fl.Held || !self {
		t.Errorf("xtables-lock.json does not name this test (pid %d) as the holder:\n%s", os.Getpid(), parts["xtables-lock.json"])
	}
}
