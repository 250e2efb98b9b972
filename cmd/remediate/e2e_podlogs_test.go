package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/remediate-dev/remediate/internal/podlogs"
	"github.com/remediate-dev/remediate/internal/testing/controlplane"
	"github.com/remediate-dev/remediate/internal/testing/fakekubelet"
)

// e2ePodLogsPolicy judges only the lock messages.
const e2ePodLogsPolicy = `apiVersion: remediate.dev/v1alpha1
kind: RemediationPolicy
mode: audit
kubeProxy: {syncPeriod: 10s}
rules:
- name: xtables-lock-messages
  detector: {type: XtablesLockMessages, window: 5m, maxPerMinute: 1}
`

// TestE2EOnceQuotesKubeProxyLockLog runs `remediate --once` (Landlock on
// where the kernel has it, --pod-log-dir the only way to the logs) against
// the real apiserver and the real kube-proxy v1.34.4, whose xtables lock
// another process holds (flock) while a Service is created: kube-proxy's
// syncs wait 5 s and fail, and it logs iptables' "Another app is currently
// holding the xtables lock". Its stderr is written as the kubelet writes a
// container log (CRI format) under a test-owned pod log directory, for the
// kube-proxy DaemonSet pod the API lists on the node. The daemon's
// XtablesLockMessages finding names that pod and quotes the real line.
func TestE2EOnceQuotesKubeProxyLockLog(t *testing.T) {
	parallelE2E(t)
	cp := controlplane.Start(t, controlplane.Options{})
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	kp := cp.StartKubeProxy(controlplane.KubeProxyOptions{NodeName: "node1", SyncPeriod: 10 * time.Second})
	// No controller-manager creates the namespace's default ServiceAccount,
	// which the ServiceAccount admission plugin looks up.
	if _, err := cp.Client.CoreV1().ServiceAccounts("kube-system").Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "default"}}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	p := fakekubelet.Workload("kube-system", "kube-proxy-n1", "node1")
	p.Labels = map[string]string{"k8s-app": "kube-proxy"}
	p.OwnerReferences = []metav1.OwnerReference{{APIVersion: "apps/v1", Kind: "DaemonSet", Name: "kube-proxy", UID: "kube-proxy-ds", Controller: ptr.To(true)}}
	p.Spec.Containers[0].Name = "kube-proxy"
	pod := fakekubelet.Create(t, cp.Client, p, fakekubelet.Running(0, nil))

	logRoot := filepath.Join(t.TempDir(), "pods")
	dir := filepath.Join(logRoot, "kube-system_kube-proxy-n1_"+string(pod.UID), "kube-proxy")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	var off int
	copyLog := func() int { // kube-proxy's new lines, stamped now, as the runtime does
		b, err := os.ReadFile(kp.LogPath)
		if err != nil {
			t.Fatal(err)
		}
		end := strings.LastIndexByte(string(b), '\n') + 1
		if end > off {
			f, err := os.OpenFile(filepath.Join(dir, "0.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
			if err != nil {
				t.Fatal(err)
			}
			now := time.Now().UTC().Format(time.RFC3339Nano)
			for _, l := range strings.Split(string(b[off:end-1]), "\n") {
				fmt.Fprintf(f, "%s stderr F %s\n", now, l)
			}
			f.Close()
			off = end
		}
		return strings.Count(string(b), "holding the xtables lock")
	}

	holder := controlplane.HoldLock(t, kp.XtablesLock)
	defer holder.Release(t)
	start := time.Now()
	createLateService(ctx, t, cp, "podlogs-once")
	// More than 5 lines in the 5-minute window is more than one a minute.
	for n := copyLog(); n < 7; n = copyLog() {
		if time.Since(start) > 3*time.Minute {
			t.Fatalf("kube-proxy logged %d lock messages in %v", n, time.Since(start).Round(time.Second))
		}
		time.Sleep(2 * time.Second)
	}
	t.Logf("kube-proxy logged 7 lock messages after %v", time.Since(start).Round(time.Second))

	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	tmp := t.TempDir()
	pol := filepath.Join(tmp, "policy.yaml")
	if err := os.WriteFile(pol, []byte(e2ePodLogsPolicy), 0o644); err != nil {
		t.Fatal(err)
	}
	var rep e2eReport
	code := onceInNetNS(ctx, t, cp, self, &rep, "--sample", "0", "--policy", pol, "--kubeconfig", cp.AdminKubeconfig,
		"--state-dir", filepath.Join(tmp, "state"), "--node-name", "node1", "--proc-root", "/proc", "--pod-log-dir", logRoot)
	if code != 2 || len(rep.Findings) != 1 {
		t.Fatalf("exit %d, findings %+v: want one XtablesLockMessages finding", code, rep.Findings)
	}
	f := rep.Findings[0]
	t.Logf("%s %s: %s", f.Detector, f.Target, f.Message)
	quote, _ := f.Evidence["quote"].(string)
	raw, err := os.ReadFile(kp.LogPath)
	if err != nil {
		t.Fatal(err)
	}
	real := false
	for _, l := range strings.Split(string(raw), "\n") {
		if strings.Contains(l, "holding the xtables lock") && podlogs.Quote(l) == quote {
			real = true
		}
	}
	if f.Detector != "XtablesLockMessages" || f.Target != "kube-proxy" || !real || !strings.Contains(f.Message, quote) ||
		!strings.Contains(f.Message, "kube-proxy pod kube-system/kube-proxy-n1 container kube-proxy") {
		t.Errorf("finding %+v: want kube-proxy's, quoting a line of its log", f)
	}
}
