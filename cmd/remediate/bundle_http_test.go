package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/remediate-dev/remediate/internal/bundle"
)

// plantedCredentialsDoc is what a redirect's target serves: nothing
// redaction would recognise, so only not fetching it keeps it out.
const plantedCredentialsDoc = "CREDENTIALS-DOCUMENT-planted-by-the-redirect-target"

// A kube-proxy endpoint answering 302 into another local listener (a
// credentials document): the bundle's fetches refuse the redirect like
// the detectors' and say so in the manifest; the target is never asked.
// On main the bundle used http.DefaultClient, followed the 302 and wrote
// the document into four parts.
func TestOnceBundleRefusesRedirects(t *testing.T) {
	var secretHits atomic.Int32
	creds := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		secretHits.Add(1)
		fmt.Fprint(w, plantedCredentialsDoc)
	}))
	t.Cleanup(creds.Close)
	kp := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, creds.URL+"/creds", http.StatusFound)
	}))
	t.Cleanup(kp.Close)
	if !strings.HasPrefix(kp.URL, "http://127.0.0.1:") || !strings.HasPrefix(creds.URL, "http://127.0.0.1:") {
		t.Fatalf("listeners not on loopback: %s %s", kp.URL, creds.URL)
	}
	dir := t.TempDir()
	pol := bundlePolicy(t, dir, kp.URL)
	path := filepath.Join(dir, "node.tar.gz")
	cmd := mainCmd(os.Args[0], "--once", "--sample", "0", "--dry-run", "--policy", pol, "--state-dir", filepath.Join(dir, "state"),
		"--node-name", "n1", "--bundle", path)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, _ := cmd.Output()
	if code := cmd.ProcessState.ExitCode(); code != exitOK && code != exitFindings && code != exitError {
		t.Fatalf("exit %d\n%s\n%s", code, out, stderr.String())
	}
	parts := readParts(t, path)
	for name, b := range parts {
		if bytes.Contains(b, []byte(plantedCredentialsDoc)) {
			t.Errorf("%s carries the redirect target's document", name)
		}
	}
	if n := secretHits.Load(); n != 0 {
		t.Errorf("the redirect target was fetched %d times", n)
	}
	var m bundle.Manifest
	if err := json.Unmarshal(parts[bundle.ManifestName], &m); err != nil {
		t.Fatal(err)
	}
	refused := 0
	for _, p := range m.Parts {
		if strings.HasPrefix(p.Name, "kube-proxy-") {
			if !strings.Contains(p.Error, "HTTP 302 redirect to") || !strings.Contains(p.Error, "not followed") || p.Size != 0 {
				t.Errorf("%s: error %q, %d bytes; want the redirect refused, nothing kept", p.Name, p.Error, p.Size)
			}
			refused++
		}
	}
	if refused != 4 {
		t.Errorf("%d kube-proxy parts, want 4", refused)
	}
}

// A policy's kube-proxy URL with a password in its userinfo and a token
// in its query: MANIFEST.json's how (GET <url>) and error name the URL
// redacted, like the parts. On main the manifest carried both.
func TestOnceBundleManifestRedacted(t *testing.T) {
	kp := kubeProxyWithSecrets(t, 0)
	u := strings.Replace(kp, "http://", "http://admin:PolicyPassw0rd@", 1)
	dir := t.TempDir()
	pol := policyFile(t, dir, fmt.Sprintf(`kubeProxy: {metricsURL: "%[1]s/metrics?token=PolicyQueryTok", healthzURL: "%[1]s/healthz?sig=PolicySigTok", proxyModeURL: "%[1]s/nowhere?access_token=PolicyAccessTok"}
rules:
- name: bloat
  detector: {type: KubeProxyRuleBloat}
`, u))
	path := filepath.Join(dir, "node.tar.gz")
	cmd := mainCmd(os.Args[0], "--once", "--sample", "0", "--dry-run", "--policy", pol, "--state-dir", filepath.Join(dir, "state"),
		"--node-name", "n1", "--bundle", path)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, _ := cmd.Output()
	parts := readParts(t, path)
	man, ok := parts[bundle.ManifestName]
	if !ok {
		t.Fatalf("no manifest\n%s\n%s", out, stderr.String())
	}
	for _, s := range []string{"PolicyPassw0rd", "PolicyQueryTok", "PolicySigTok", "PolicyAccessTok"} {
		for name, b := range parts {
			if bytes.Contains(b, []byte(s)) {
				t.Errorf("%s carries %q", name, s)
			}
		}
	}
	if !bytes.Contains(man, []byte("GET http://"+bundle.Redacted+"@127.0.0.1:")) || !bytes.Contains(man, []byte("/nowhere?access_token="+bundle.Redacted)) ||
		!bytes.Contains(man, []byte("HTTP 404")) {
		t.Errorf("manifest does not name the URLs redacted or the 404:\n%s", man)
	}
}

// argvShapesFile is the corpus of secret shapes on a command line,
// shared with internal/bundle's tests.
const argvShapesFile = "../../internal/bundle/testdata/argv-shapes.tsv"

// A real process named kube-proxy whose argv carries every shape of
// argv-shapes.tsv (one after the other): no part of the bundle, manifest
// included, holds any of the secrets, and processes.json still lists the
// process with its ordinary arguments. On main 25 of the shapes survived.
func TestOnceBundleArgvShapes(t *testing.T) {
	raw, err := os.ReadFile(argvShapesFile)
	if err != nil {
		t.Fatal(err)
	}
	argv := []string{"kube-proxy", "--hostname-override=node-1"}
	var secrets, shapes []string
	for _, l := range strings.Split(string(raw), "\n") {
		if l == "" || strings.HasPrefix(l, "#") {
			continue
		}
		f := strings.Split(l, "\t")
		var a []string
		if len(f) != 3 || json.Unmarshal([]byte(f[2]), &a) != nil {
			t.Fatalf("bad line %q", l)
		}
		argv = append(argv, a...)
		shapes, secrets = append(shapes, f[0]), append(secrets, f[1])
	}
	if len(secrets) < 38 {
		t.Fatalf("%d shapes", len(secrets))
	}
	cmd := &exec.Cmd{Path: os.Args[0], Args: argv, Env: []string{"REMEDIATE_TEST_SLEEP=1"}}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })

	dir := t.TempDir()
	pol := bundlePolicy(t, dir, kubeProxyWithSecrets(t, 0))
	path := filepath.Join(dir, "node.tar.gz")
	run := mainCmd(os.Args[0], "--once", "--sample", "0", "--dry-run", "--policy", pol, "--state-dir", filepath.Join(dir, "state"),
		"--node-name", "n1", "--bundle", path)
	var stderr bytes.Buffer
	run.Stderr = &stderr
	out, _ := run.Output()
	parts := readParts(t, path)
	if len(parts) == 0 {
		t.Fatalf("no bundle\n%s\n%s", out, stderr.String())
	}
	for name, b := range parts {
		for i, s := range secrets {
			if bytes.Contains(b, []byte(s)) {
				t.Errorf("%s keeps %q (%s)", name, s, shapes[i])
			}
		}
	}
	var ps []struct {
		Pid     int      `json:"pid"`
		Cmdline []string `json:"cmdline"`
	}
	if err := json.Unmarshal(parts["processes.json"], &ps); err != nil {
		t.Fatalf("processes.json: %v\n%s", err, parts["processes.json"])
	}
	found := false
	for _, p := range ps {
		if p.Pid == cmd.Process.Pid {
			found = true
			joined := strings.Join(p.Cmdline, " ")
			for _, keep := range []string{"kube-proxy --hostname-override=node-1", "mysqladmin", "--v=2", "http://10.0.0.1:8080/api?token="} {
				if !strings.Contains(joined, keep) {
					t.Errorf("processes.json lost %q: %s", keep, joined)
				}
			}
		}
	}
	if !found {
		t.Errorf("the process %d is not in processes.json:\n%s", cmd.Process.Pid, parts["processes.json"])
	}
}
