package sandbox

import (
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
)

// TestRules: every flag's path is in the rules with the access the daemon
// needs, writes only where it writes, and neither / nor all of /etc is.
func TestRules(t *testing.T) {
	rs := Rules(Config{
		ProcRoot: "/host/proc", SysRoot: "/host/sys", CgroupRoot: "/host/sys/fs/cgroup",
		CNIDirs: []string{"/host/etc/cni/net.d", ""}, CRISocket: "/host/cri/containerd.sock", PodLogDir: "/host/var/log/pods",
		StateDir: "/var/lib/remediate", XtablesLock: "/run/xtables.lock", Policy: "/etc/remediate/policy.yaml",
		Kubeconfig: []string{"/root/.kube/config"}, TempDir: "/tmp",
	})
	got := map[string]Access{}
	for _, r := range rs {
		if r.Path == "" || r.Why == "" {
			t.Errorf("rule %+v: empty path or reason", r)
		}
		if a, ok := got[r.Path]; !ok || r.Access > a {
			got[r.Path] = r.Access
		}
	}
	want := map[string]Access{
		"/host/proc": Read, "/host/proc/sys/net/netfilter": ReadWrite, "/host/sys": Read,
		"/host/sys/module/nf_conntrack/parameters": ReadWrite, "/host/sys/fs/cgroup": Read,
		"/host/etc/cni/net.d": Read, "/host/cri": Read, "/host/var/log/pods": Read, "/var/lib/remediate": ReadWrite,
		"/run/xtables.lock": Read, "/etc/remediate": Read, "/root/.kube": Read, "/tmp": ReadWrite,
		"/usr": ReadExec, "/dev/null": ReadWrite,
	}
	for p, a := range want {
		if g, ok := got[p]; !ok || g != a {
			t.Errorf("%s: %v %v, want %v", p, g, ok, a)
		}
	}
	// A file in / gives a rule on the file, never on /.
	for _, r := range Rules(Config{Policy: "/policy.yaml", Kubeconfig: []string{"/kubeconfig"}, Bundle: "/b.tar.gz", CRISocket: "/cri.sock"}) {
		if r.Path == "/" {
			t.Errorf("rule on /: %+v", r)
		}
	}
	for _, p := range []string{"/", "/etc", "/var", "/run", "/host", "."} {
		if _, ok := got[p]; ok {
			t.Errorf("%s is allowed: it would cover the host's files when the daemon's root is the host's", p)
		}
	}
	for p, a := range got {
		if a == ReadWrite && !map[string]bool{"/host/proc/sys/net/netfilter": true, "/host/sys/module/nf_conntrack/parameters": true,
			"/var/lib/remediate": true, "/tmp": true, "/dev/null": true}[p] {
			t.Errorf("%s is writable", p)
		}
	}
}

// probe is what the restricted child reports: per access, the error
// ("" when it succeeded).
type probe map[string]string

const childEnv = "SANDBOX_TEST_CHILD"

func TestMain(m *testing.M) {
	if dir := os.Getenv(childEnv); dir != "" {
		os.Exit(child(dir))
	}
	os.Exit(m.Run())
}

// child restricts itself to dir/allowed (read and write) and the image,
// then reads: a file there, the secret beside it, and both through
// /proc/<pid>/root of a child it starts after the restriction (same
// domain: ptrace access is allowed, only the hierarchy decides) and of the
// test process (outside the domain).
func child(dir string) int {
	allowed := filepath.Join(dir, "allowed")
	secret := filepath.Join(dir, "secret", "shadow")
	st, err := Apply(append(Rules(Config{ProcRoot: "/proc"}), Rule{allowed, ReadWrite, "test"}))
	if err != nil || !st.Enforced {
		fmt.Printf(`{"apply": %q}`, fmt.Sprint(st, err))
		return 0
	}
	sleep := exec.Command("sleep", "60")
	if err := sleep.Start(); err != nil {
		fmt.Printf(`{"exec": %q}`, err.Error())
		return 0
	}
	defer func() { _ = sleep.Process.Kill(); _ = sleep.Wait() }()
	kid := "/proc/" + strconv.Itoa(sleep.Process.Pid)
	parent := "/proc/" + strconv.Itoa(os.Getppid())
	p := probe{"exec": ""}
	read := func(name, path string) {
		_, err := os.ReadFile(path)
		p[name] = errString(err)
	}
	read("allowed", filepath.Join(allowed, "f"))
	read("secret", secret)
	read("child stat", kid+"/stat")
	read("child root allowed", kid+"/root"+filepath.Join(allowed, "f"))
	read("child root secret", kid+"/root"+secret)
	read("outsider stat", parent+"/stat")
	read("outsider root secret", parent+"/root"+secret)
	c, err := net.Dial("unix", "@"+filepath.Base(dir))
	if err == nil {
		c.Close()
	}
	p["abstract socket"] = errString(err)
	p["signal outsider"] = errString(syscall.Kill(os.Getppid(), 0)) // KillProcess still reaches host processes
	p["write allowed"] = errString(os.WriteFile(filepath.Join(allowed, "g"), []byte("x"), 0o600))
	p["write beside"] = errString(os.WriteFile(filepath.Join(dir, "g"), []byte("x"), 0o600))
	b, _ := json.Marshal(p)
	fmt.Print(string(b))
	return 0
}

func errString(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

// TestLandlockJudgesTheResolvedFile proves on this kernel the claim the
// daemon's confinement rests on: Landlock judges the file an open resolves
// to, so /proc/<pid>/root/<secret> is refused even for a process the
// restricted one may ptrace (its own child, same domain), while the same
// route to an allowed file and /proc/<pid>/stat work; a process outside
// the domain is refused /proc/<pid>/root altogether, and so is its
// abstract UNIX socket (ABI 6+). Skipped on a kernel
// without Landlock (Apply says so, and the test checks that it does).
func TestLandlockJudgesTheResolvedFile(t *testing.T) {
	abi, err := ABI()
	if err != nil || abi < 1 {
		st, aerr := Apply(nil)
		if st.Enforced || aerr != nil || !strings.Contains(st.Reason, "no Landlock") {
			t.Errorf("without Landlock Apply = %+v, %v; want not enforced and why", st, aerr)
		}
		t.Skipf("no Landlock here: %v", err)
	}
	// Outside /tmp (the image rules do not cover it, but TempDir might).
	dir, err := os.MkdirTemp("/var/tmp", "sandbox-test-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	for _, d := range []string{"allowed", "secret"} {
		if err := os.Mkdir(filepath.Join(dir, d), 0o700); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(dir, "allowed", "f"), []byte("ok"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "secret", "shadow"), []byte("secret"), 0o600); err != nil {
		t.Fatal(err)
	}
	// An abstract UNIX socket outside the domain (as a host process's is).
	l, err := net.Listen("unix", "@"+filepath.Base(dir))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
	cmd := exec.Command(os.Args[0])
	cmd.Env = append(os.Environ(), childEnv+"="+dir)
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	var p probe
	if err := json.Unmarshal(out, &p); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	ok := []string{"exec", "allowed", "child stat", "child root allowed", "outsider stat", "write allowed", "signal outsider"}
	refused := []string{"secret", "child root secret", "outsider root secret", "write beside"}
	if abi >= 6 {
		if e := p["abstract socket"]; !strings.Contains(e, "operation not permitted") {
			t.Errorf("abstract socket: %q, want operation not permitted (Landlock ABI %d scopes them)", e, abi)
		}
	}
	for _, k := range ok {
		if e, seen := p[k]; !seen || e != "" {
			t.Errorf("%s: %q (seen %v), want it to work", k, e, seen)
		}
	}
	for _, k := range refused {
		if e := p[k]; !strings.Contains(e, "permission denied") {
			t.Errorf("%s: %q, want permission denied", k, e)
		}
	}
	t.Logf("kernel Landlock ABI %d: %v", abi, p)
}
