package detect

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/remediate-dev/remediate/internal/iptables"
	"github.com/remediate-dev/remediate/internal/procs"
)

// needOrFail skips, or fails under REMEDIATE_E2E_REQUIRED (CI).
func needOrFail(t *testing.T, ok bool, why string) {
	t.Helper()
	if ok {
		return
	}
	if os.Getenv("REMEDIATE_E2E_REQUIRED") != "" {
		t.Fatalf("REMEDIATE_E2E_REQUIRED is set but: %s", why)
	}
	t.Skip(why)
}

// TestRealIPTablesVersionSkew reads a real process's iptables through the
// kernel's /proc/<pid>/root: a process named kube-proxy whose private mount
// namespace has another /usr/sbin (a copy of the real legacy binary under
// the nft binary's name, reached by an absolute symlink). The backend comes
// from the binary's embedded version string, read inside the process's
// root: a resolver that let the kernel follow the absolute link would read
// this machine's nft binary. The host is this machine's root ("/"): the
// proc root given to the detector links <pid>/root to /proc/<pid>/root and
// 1/root to "/", because PID 1 here belongs to the machinery running the
// tests, whose root is not readable.
func TestRealIPTablesVersionSkew(t *testing.T) {
	needOrFail(t, os.Geteuid() == 0, "needs root (mount namespace, /proc/<pid>/root)")
	for _, c := range []string{"unshare", "bash", "mount", "sleep"} {
		_, err := exec.LookPath(c)
		needOrFail(t, err == nil, "needs "+c+" (util-linux, bash, coreutils)")
	}
	host, err := iptables.ReadInstall("/")
	needOrFail(t, err == nil, "the host has no iptables: "+errString(err))
	if host.Backend != iptables.NFT {
		t.Skipf("this test expects an nft host iptables (Debian's default), found %s", host.Describe())
	}
	legacy := "/usr/sbin/xtables-legacy-multi"
	if _, err := os.Stat(legacy); err != nil {
		needOrFail(t, false, "needs "+legacy+" (Debian package iptables)")
	}
	sbin := t.TempDir()
	b, err := os.ReadFile(legacy)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(sbin, "xtables-nft-multi"), b, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("/usr/sbin/xtables-nft-multi", filepath.Join(sbin, "iptables")); err != nil {
		t.Fatal(err)
	}
	// This node's kube-proxy is a kube-proxy executable (findKubeProxy):
	// a copy of sleep named so.
	kpBin := filepath.Join(t.TempDir(), "kube-proxy")
	sleepPath, _ := exec.LookPath("sleep")
	sb, err := os.ReadFile(sleepPath)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(kpBin, sb, 0o755); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("unshare", "-m", "--propagation", "private", "bash", "-c",
		"mount --bind "+sbin+" /usr/sbin && exec "+kpBin+" 120")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })

	pr := procs.New("/proc")
	n, _ := newIssue3Node(nil)
	n.Procs = pr
	n.ProcRoot = t.TempDir()
	for pid, target := range map[string]string{"1": "/", strconv.Itoa(cmd.Process.Pid): "/proc/" + strconv.Itoa(cmd.Process.Pid) + "/root"} {
		if err := os.MkdirAll(filepath.Join(n.ProcRoot, pid), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.Symlink(target, filepath.Join(n.ProcRoot, pid, "root")); err != nil {
			t.Fatal(err)
		}
	}
	var kp []procs.Process
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		all, err := pr.Find(context.Background(), []string{"kube-proxy"})
		if err != nil {
			t.Fatal(err)
		}
		kp = kp[:0]
		for _, p := range all {
			if p.Pid == int32(cmd.Process.Pid) {
				kp = append(kp, p)
			}
		}
		if len(kp) == 1 {
			break
		}
	}
	if len(kp) != 1 {
		t.Fatal("the test's kube-proxy process did not appear")
	}
	if others, _ := pr.Find(context.Background(), []string{"kube-proxy"}); len(others) != 1 {
		t.Skipf("another kube-proxy runs on this machine (%d): the detector would compare the first", len(others))
	}
	d := newIssue3Detector(t, "IPTablesVersionSkew", n, func(p any) {
		pp := p.(*IPTablesVersionSkewParams)
		pp.CNIAgents, pp.CheckKubeRulesBackend = nil, false
	})
	got, err := d.Detect(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 1 || got[0].Target != "iptables/versions/host/kube-proxy/backend" {
		t.Fatalf("findings = %+v", got)
	}
	kpEv := got[0].Evidence["kube-proxy"].(map[string]any)
	if kpEv["backend"] != "legacy" || kpEv["backendSource"] != "binary" || kpEv["version"] != host.Version ||
		!strings.HasSuffix(kpEv["root"].(string), "/root") {
		t.Fatalf("kube-proxy evidence = %v", kpEv)
	}
	t.Log(got[0].Message)
}

func errString(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}
