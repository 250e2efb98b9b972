package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	utilexec "k8s.io/client-go/util/exec"

	"github.com/remediate-dev/remediate/internal/bundle"
	"github.com/remediate-dev/remediate/internal/testing/controlplane"
)

// fakeExec stands in for the kubelet: it records every command and
// answers remediate --once with a report and an exit status, cat with a
// bundle, rm with nothing.
type fakeExec struct {
	mu       sync.Mutex
	calls    []execCall
	onceCode int
	bundle   []byte
}

type execCall struct {
	pod, container string
	cmd            []string
}

func (f *fakeExec) Exec(_ context.Context, pod *corev1.Pod, container string, cmd []string, stdout, stderr io.Writer) error {
	f.mu.Lock()
	f.calls = append(f.calls, execCall{pod: pod.Namespace + "/" + pod.Name, container: container, cmd: cmd})
	f.mu.Unlock()
	switch cmd[0] {
	case "cat":
		_, err := stdout.Write(f.bundle)
		return err
	case "rm":
		return nil
	}
	fmt.Fprintln(stdout, "FINDINGS: (fake report)")
	if f.onceCode != 0 {
		return utilexec.CodeExitError{Err: fmt.Errorf("command terminated with exit code %d", f.onceCode), Code: f.onceCode}
	}
	return nil
}

// daemonPod is a pod shaped like deploy/base's DaemonSet pod, with a
// flag the one-shot run used not to take over (--cluster-view-memory) and
// an argument naming an env variable.
func daemonPod(name, nodeName string, labels map[string]string) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels},
		Spec: corev1.PodSpec{NodeName: nodeName, Containers: []corev1.Container{{
			Name: "remediate", Image: "ghcr.io/remediate-dev/remediate:v1",
			Args: []string{"--policy=/etc/remediate/policy.yaml", "--state-dir=/var/lib/remediate", "--node-name=$(NODE_NAME)",
				"--proc-root=/host/proc", "--sys-root", "/host/sys", "--xtables-lock=/run/xtables.lock",
				"--metrics-addr=127.0.0.1:9808", "--log-format=json", "--cluster-view-memory", "128Mi", "--cni-conf-dir=/host/$(POD_NAMESPACE)/net.d"},
			Env: []corev1.EnvVar{{Name: "POD_NAMESPACE", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "metadata.namespace"}}}},
		}}},
	}
}

func createPod(t *testing.T, c kubernetes.Interface, ns string, p *corev1.Pod, phase corev1.PodPhase) {
	t.Helper()
	ctx := context.Background()
	got, err := c.CoreV1().Pods(ns).Create(ctx, p, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	got.Status.Phase = phase
	if _, err := c.CoreV1().Pods(ns).UpdateStatus(ctx, got, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
}

func testBundle(t *testing.T) []byte {
	t.Helper()
	path := filepath.Join(t.TempDir(), "b.tar.gz")
	w, err := bundle.Create(path, bundle.Options{Node: "node1"})
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Add(bundle.ReportTextName, "report", []byte("FINDINGS: none\n"), nil); err != nil {
		t.Fatal(err)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// The plugin against a real kube-apiserver: pod lookup by label and
// node, the errors when there is none or more than one, the command built
// from the pod's own flags, remediate's exit status passed through, and
// the bundle copied back, checked and removed in the pod. A fake executor
// stands in where a kubelet would answer.
func TestPluginAgainstAPIServer(t *testing.T) {
	cp := controlplane.Start(t, controlplane.Options{})
	ctx := context.Background()
	const ns = "remediate"
	if _, err := cp.Client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	// No controller manager: the ServiceAccount admission needs "default".
	if _, err := cp.Client.CoreV1().ServiceAccounts(ns).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "default"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	lbl := map[string]string{"app.kubernetes.io/name": "remediate"}
	fe := &fakeExec{}
	d := deps{
		restConfig:  func(string, string) (*rest.Config, error) { return rest.CopyConfig(cp.RestConfig), nil },
		newExecutor: func(*rest.Config, kubernetes.Interface) Executor { return fe },
	}
	plugin := func(args ...string) (int, string, string) {
		var out, errb bytes.Buffer
		code := run(ctx, args, &out, &errb, d)
		return code, out.String(), errb.String()
	}

	t.Run("no pod", func(t *testing.T) {
		createPod(t, cp.Client, ns, daemonPod("remediate-other", "node2", lbl), corev1.PodRunning)
		createPod(t, cp.Client, ns, daemonPod("unrelated", "node1", map[string]string{"app": "x"}), corev1.PodRunning)
		code, _, errOut := plugin("node1")
		if code != 1 || !strings.Contains(errOut, "no remediate pod on node node1 in namespace remediate (selector app.kubernetes.io/name=remediate)") {
			t.Errorf("exit %d: %s", code, errOut)
		}
		createPod(t, cp.Client, ns, daemonPod("remediate-pending", "node1", lbl), corev1.PodPending)
		code, _, errOut = plugin("node1")
		if code != 1 || !strings.Contains(errOut, "no running remediate pod on node node1") || !strings.Contains(errOut, "remediate-pending (Pending)") {
			t.Errorf("exit %d: %s", code, errOut)
		}
		if len(fe.calls) != 0 {
			t.Errorf("exec called without a pod: %+v", fe.calls)
		}
	})

	t.Run("one pod", func(t *testing.T) {
		createPod(t, cp.Client, ns, daemonPod("remediate-abcde", "node1", lbl), corev1.PodRunning)
		fe.onceCode, fe.bundle, fe.calls = 2, testBundle(t), nil
		local := filepath.Join(t.TempDir(), "node1.tar.gz")
		code, out, errOut := plugin("node1", "--bundle", local, "--sample", "20s", "--", "--log-level=debug")
		if code != 2 {
			t.Fatalf("exit %d, want remediate's 2\n%s\n%s", code, out, errOut)
		}
		if out != "FINDINGS: (fake report)\n" {
			t.Errorf("stdout %q", out)
		}
		if len(fe.calls) != 3 {
			t.Fatalf("calls %+v, want once, cat, rm", fe.calls)
		}
		once := fe.calls[0]
		remote := ""
		for _, a := range once.cmd {
			if r, ok := strings.CutPrefix(a, "--bundle="); ok {
				remote = r
			}
		}
		want := []string{"/usr/local/bin/remediate", "--once", "--node-name=node1", "--policy=/etc/remediate/policy.yaml",
			"--state-dir=/var/lib/remediate", "--proc-root=/host/proc", "--sys-root=/host/sys", "--xtables-lock=/run/xtables.lock",
			"--cluster-view-memory=128Mi", "--cni-conf-dir=/host/remediate/net.d", "--dry-run", "-o", "text", "--sample=20s", "--bundle=" + remote, "--log-level=debug"}
		if once.pod != ns+"/remediate-abcde" || once.container != "remediate" || strings.Join(once.cmd, " ") != strings.Join(want, " ") {
			t.Errorf("once ran as %+v\nwant %q", once, want)
		}
		if !strings.HasPrefix(remote, "/tmp/remediate-bundle-") {
			t.Errorf("remote bundle %q", remote)
		}
		if strings.Join(fe.calls[1].cmd, " ") != "cat "+remote || strings.Join(fe.calls[2].cmd, " ") != "rm -f "+remote {
			t.Errorf("copy and removal: %+v %+v", fe.calls[1], fe.calls[2])
		}
		got, err := os.ReadFile(local)
		if err != nil || !bytes.Equal(got, fe.bundle) {
			t.Errorf("local bundle: %v (%d bytes, want %d)", err, len(got), len(fe.bundle))
		}
		if !strings.Contains(errOut, "bundle "+local+" (1 parts, checked") {
			t.Errorf("stderr %s", errOut)
		}
		// The file exists now: refused before anything runs.
		fe.calls = nil
		if code, _, errOut := plugin("node1", "--bundle", local); code != 1 || !strings.Contains(errOut, "file exists") || len(fe.calls) != 0 {
			t.Errorf("existing bundle: exit %d %s %+v", code, errOut, fe.calls)
		}
		// --act and -o json; a corrupt bundle copy is an error and removed.
		fe.onceCode, fe.bundle, fe.calls = 0, []byte("not a bundle"), nil
		local2 := filepath.Join(t.TempDir(), "x.tar.gz")
		code, _, errOut = plugin("node1", "--act", "-o", "json", "--bundle", local2)
		if code != 1 || !strings.Contains(errOut, "does not read") {
			t.Errorf("corrupt copy: exit %d %s", code, errOut)
		}
		if _, err := os.Stat(local2); err == nil {
			t.Error("corrupt bundle left behind")
		}
		if c := strings.Join(fe.calls[0].cmd, " "); strings.Contains(c, "--dry-run") || !strings.Contains(c, "-o json") {
			t.Errorf("--act -o json ran %s", c)
		}
	})

	t.Run("two pods", func(t *testing.T) {
		createPod(t, cp.Client, ns, daemonPod("remediate-fghij", "node1", lbl), corev1.PodRunning)
		fe.calls = nil
		code, _, errOut := plugin("node1")
		if code != 1 || !strings.Contains(errOut, "2 running remediate pods on node node1") ||
			!strings.Contains(errOut, "remediate-abcde") || !strings.Contains(errOut, "remediate-fghij") || len(fe.calls) != 0 {
			t.Errorf("exit %d: %s %+v", code, errOut, fe.calls)
		}
	})

	// The real executor (WebSocket, SPDY fallback) reaches the API
	// server's exec subresource: the plugin binary is run inside the
	// control plane's network namespace with a kubeconfig, as kubectl
	// would run it. Without a kubelet behind the node the API server
	// answers with an error naming the node, not a hang.
	t.Run("real executor", func(t *testing.T) {
		createPod(t, cp.Client, ns, daemonPod("remediate-node3", "node3", lbl), corev1.PodRunning)
		cmd := cp.NetNS.Command(os.Args[0], "node3", "--kubeconfig", cp.AdminKubeconfig, "--timeout", "30s")
		cmd.Env = append(os.Environ(), "KUBECTL_REMEDIATE_TEST_AS_MAIN=1")
		var out, errb bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &errb
		_ = cmd.Run()
		if code := cmd.ProcessState.ExitCode(); code != 1 || !strings.Contains(errb.String(), "exec in pod remediate/remediate-node3") ||
			!strings.Contains(errb.String(), "node3") || strings.Contains(errb.String(), "connection refused") {
			t.Errorf("exit %d\n%s%s", code, out.String(), errb.String())
		}
		t.Logf("API server said: %s", strings.TrimSpace(errb.String()))
	})
}

func TestMain(m *testing.M) {
	if os.Getenv("KUBECTL_REMEDIATE_TEST_AS_MAIN") == "1" {
		main()
		return
	}
	os.Exit(m.Run())
}

func TestUsage(t *testing.T) {
	for _, c := range []struct{ args, msg string }{
		{"", "needs exactly one NODE, got 0"},
		{"a b", "needs exactly one NODE, got 2"},
		{"a -o yaml", "--output must be text or json"},
		{"a --bogus", "unknown flag: --bogus"},
	} {
		var out, errb bytes.Buffer
		code := run(context.Background(), strings.Fields(c.args), &out, &errb, deps{})
		if code != 1 || !strings.Contains(errb.String(), c.msg) {
			t.Errorf("%q: exit %d %s", c.args, code, errb.String())
		}
	}
}
