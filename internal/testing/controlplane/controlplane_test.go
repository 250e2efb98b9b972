package controlplane

import (
	"context"
	"fmt"
	"io"
	"os"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// TestControlPlane exercises the harness itself against the real binaries:
// apiserver reachable and RBAC real, kube-proxy serving metrics and healthz
// on the namespace's loopback, apiserver stop/restart, lock holding.
func TestControlPlane(t *testing.T) {
	cp := Start(t, Options{})
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()

	if _, err := cp.Client.CoreV1().Namespaces().Get(ctx, "default", metav1.GetOptions{}); err != nil {
		t.Fatalf("get namespace default: %v", err)
	}

	kp := cp.StartKubeProxy(KubeProxyOptions{SyncPeriod: 10 * time.Second})
	hc := cp.NetNS.HTTPClient(5 * time.Second)
	for _, u := range []string{kp.MetricsURL, kp.ProxyModeURL, kp.HealthzURL} {
		resp, err := hc.Get(u)
		if err != nil {
			t.Fatalf("GET %s: %v", u, err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Fatalf("GET %s: HTTP %d %s", u, resp.StatusCode, b)
		}
		switch u {
		case kp.MetricsURL:
			if !strings.Contains(string(b), "kubeproxy_sync_proxy_rules_last_timestamp_seconds") {
				t.Errorf("metrics lack kubeproxy_sync_proxy_rules_last_timestamp_seconds")
			}
		case kp.ProxyModeURL:
			if strings.TrimSpace(string(b)) != "iptables" {
				t.Errorf("proxyMode = %q, want iptables", b)
			}
		}
	}
	// The dials switched threads into the namespace and back: no thread of
	// the test process may be left in it.
	checkThreadsInOwnNetns(t)

	// Lock holding: a separate process holds kube-proxy's private lock.
	h := HoldLock(t, kp.XtablesLock)
	if h.Pid() <= 0 {
		t.Fatal("no holder pid")
	}
	h.Release(t)
	if !h.Exited() {
		t.Fatal("lock holder still running after Release")
	}

	// API server stop and restart.
	cp.StopAPIServer()
	if !cp.APIServer().Exited() {
		t.Fatal("apiserver still running after StopAPIServer")
	}
	sctx, scancel := context.WithTimeout(ctx, 5*time.Second)
	_, err := cp.Client.CoreV1().Nodes().Get(sctx, kp.NodeName, metav1.GetOptions{})
	scancel()
	if err == nil {
		t.Fatal("apiserver answered while stopped")
	}
	cp.StartAPIServer()
	if _, err := cp.Client.CoreV1().Nodes().Get(ctx, kp.NodeName, metav1.GetOptions{}); err != nil {
		t.Fatalf("node after apiserver restart: %v", err)
	}
}

// checkThreadsInOwnNetns samples the network namespace of the OS threads
// goroutines run on and compares it with the process's.
func checkThreadsInOwnNetns(t *testing.T) {
	t.Helper()
	want, err := os.Readlink("/proc/self/ns/net")
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	for i := 0; i < 64; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			runtime.LockOSThread()
			defer runtime.UnlockOSThread()
			got, err := os.Readlink(fmt.Sprintf("/proc/self/task/%d/ns/net", unix.Gettid()))
			if err == nil && got != want {
				t.Errorf("a thread is in %s, the process in %s", got, want)
			}
			time.Sleep(time.Millisecond)
		}()
	}
	wg.Wait()
}
