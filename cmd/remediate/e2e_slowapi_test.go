package main

import (
	"bufio"
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/remediate-dev/remediate/internal/testing/controlplane"
	"github.com/remediate-dev/remediate/remediate"
)

// apiProxy is an HTTPS reverse proxy to the real apiserver, inside the
// control plane's namespace, that can pass requests, hold them until the
// client gives up (an apiserver taking forever), or answer 429 with
// Retry-After: 1 (a throttling storm: client-go retries each request up to
// 10 times). Watches already open keep streaming.
type apiProxy struct {
	mode      atomic.Int32 // proxyPass, proxyHold, proxyThrottle
	abandoned atomic.Int64 // held requests (not watches) their client gave up
	throttled atomic.Int64 // 429 answers
	mu        sync.Mutex
	release   chan struct{} // closed when holding ends
}

const (
	proxyPass int32 = iota
	proxyHold
	proxyThrottle
)

func (p *apiProxy) set(mode int32) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.mode.Load() == proxyHold && mode != proxyHold {
		close(p.release)
	}
	if mode == proxyHold && p.mode.Load() != proxyHold {
		p.release = make(chan struct{})
	}
	p.mode.Store(mode)
}

// startAPIProxy starts the proxy on addr in cp's namespace and returns a
// copy of kubeconfig pointing at it.
func startAPIProxy(t *testing.T, cp *controlplane.ControlPlane, addr, kubeconfig string) (*apiProxy, string) {
	t.Helper()
	target, err := url.Parse(controlplane.APIServerURL)
	if err != nil {
		t.Fatal(err)
	}
	p := &apiProxy{}
	rp := httputil.NewSingleHostReverseProxy(target)
	rp.FlushInterval = -1 // watches stream
	rp.Transport = &http.Transport{DialContext: cp.NetNS.DialContext, ForceAttemptHTTP2: true,
		TLSClientConfig: &tls.Config{InsecureSkipVerify: true}} // the apiserver's self-signed certificate
	l, err := cp.NetNS.Listen("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch p.mode.Load() {
		case proxyHold:
			p.mu.Lock()
			rel := p.release
			p.mu.Unlock()
			select {
			case <-rel:
			case <-r.Context().Done():
				if r.URL.Query().Get("watch") != "true" {
					p.abandoned.Add(1)
				}
				return
			}
		case proxyThrottle:
			p.throttled.Add(1)
			w.Header().Set("Retry-After", "1")
			http.Error(w, `{"kind":"Status","apiVersion":"v1","status":"Failure","reason":"TooManyRequests","code":429}`, http.StatusTooManyRequests)
			return
		}
		rp.ServeHTTP(w, r)
	}))
	srv.Listener.Close()
	srv.Listener = l
	srv.EnableHTTP2 = true
	srv.StartTLS()
	t.Cleanup(func() { p.set(proxyPass); srv.CloseClientConnections(); srv.Close() })
	b, err := os.ReadFile(kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(t.TempDir(), "proxied.kubeconfig")
	if err := os.WriteFile(out, []byte(strings.Replace(string(b), controlplane.APIServerURL, "https://"+addr, 1)), 0o600); err != nil {
		t.Fatal(err)
	}
	return p, out
}

// daemonMetric reads one sample of the daemon's /metrics (a line starting
// with prefix), -1 when absent or unreadable.
func daemonMetric(c *http.Client, addr, prefix string) float64 {
	resp, err := c.Get("http://" + addr + "/metrics")
	if err != nil {
		return -1
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	for sc.Scan() {
		if l := sc.Text(); strings.HasPrefix(l, prefix) {
			f := strings.Fields(l)
			v, err := strconv.ParseFloat(f[len(f)-1], 64)
			if err == nil {
				return v
			}
		}
	}
	return -1
}

const slowAPIPolicy = `apiVersion: remediate.dev/v1alpha1
kind: RemediationPolicy
mode: audit
interval: 1s
jitter: 0
detectorTimeout: 1s
rules:
- name: local-hung-restore
  detector: {type: HungIPTablesRestore}
  for: 10m
  action: {type: KillProcess}
- name: stale-ct
  detector: {type: ConntrackStaleServiceEntries, grace: 90s, includeTCP: false}
  for: 10m
  action: {type: FlushConntrack, maxEntries: 10000}
`

// TestE2ECyclesDoNotWaitOnAPI runs the real daemon (1 s interval) against
// the real apiserver behind a proxy on loopback in the control plane's
// namespace. The node name has no Node object, so every cycle's report
// asks the API (the condition's first read, retried each cycle).
//
// hold: every new request is held until its client gives up. Before the
// first request is given up (the report's 20 s), at least 5 more cycles
// must have run: node-local checks do not wait on the API (on main the
// loop waited for the report: 1 cycle per 20 s).
//
// throttle: every request is answered 429 with Retry-After: 1 (client-go
// retries each up to 10 times, a second apart). Cycles go on (5 more
// before 31 answers of 429: on main each cycle waited for its report's
// request and its 10 retries, 11 answers), and the check that compares the node
// with the cluster view keeps running on the view it has until the view
// is older than --cluster-view-max-age (5 s), then skips
// (remediate_detector_skipped 1): on main a 429 counted as an answer, so
// the view was never stale.
func TestE2ECyclesDoNotWaitOnAPI(t *testing.T) {
	parallelE2E(t)
	cp := controlplane.Start(t, controlplane.Options{})
	proxy, kc := startAPIProxy(t, cp, "127.0.0.1:16443", cp.AdminKubeconfig)
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	pol := filepath.Join(dir, "policy.yaml")
	if err := os.WriteFile(pol, []byte(slowAPIPolicy), 0o644); err != nil {
		t.Fatal(err)
	}
	const metricsAddr = "127.0.0.1:19841" // inside the control plane's namespace
	cmd := mainCmd("ip", "netns", "exec", cp.NetNS.Name, self, "--policy", pol, "--kubeconfig", kc,
		"--state-dir", filepath.Join(dir, "state"), "--metrics-addr", metricsAddr, "--node-name", fmt.Sprintf("hc-no-such-node-%d", os.Getpid()),
		"--proc-root", "/proc", "--cluster-view-max-age", "5s", "--log-level", "debug")
	logs, stop := startLogged(t, cmd)
	defer stop()
	hc := cp.NetNS.HTTPClient(5 * time.Second)
	cycles := func() float64 { return daemonMetric(hc, metricsAddr, "remediate_cycle_duration_seconds_count") }
	skipped := func() float64 {
		return daemonMetric(hc, metricsAddr, `remediate_detector_skipped{detector="ConntrackStaleServiceEntries",rule="stale-ct"}`)
	}
	waitUntil(t, 90*time.Second, "3 cycles with the API passing", func() bool { return cycles() >= 3 })
	if s := skipped(); s != 0 {
		t.Fatalf("the cluster check skipped with the API passing (%v):\n%s", s, logs.String())
	}

	t.Run("hold", func(t *testing.T) {
		proxy.set(proxyHold)
		defer proxy.set(proxyPass)
		c0 := cycles()
		for cycles() < c0+5 {
			if proxy.abandoned.Load() > 0 {
				t.Fatalf("a held API request was given up after %v cycles of the 5 wanted: the cycles waited on the API", cycles()-c0)
			}
			time.Sleep(100 * time.Millisecond)
		}
		t.Logf("%v cycles while the API held every request (%d given up)", cycles()-c0, proxy.abandoned.Load())
	})
	waitUntil(t, 60*time.Second, "the cluster check running again", func() bool { return skipped() == 0 })

	t.Run("throttle", func(t *testing.T) {
		proxy.set(proxyThrottle)
		defer proxy.set(proxyPass)
		c0 := cycles()
		for cycles() < c0+5 {
			if proxy.throttled.Load() > 30 {
				t.Fatalf("%d answers of 429 after %v cycles of the 5 wanted: the cycles waited on the API", proxy.throttled.Load(), cycles()-c0)
			}
			time.Sleep(100 * time.Millisecond)
		}
		waitUntil(t, 60*time.Second, "the cluster check skipped on a view older than 5 s", func() bool { return skipped() == 1 })
		t.Logf("%v cycles during the 429 storm (%d answers of 429)", cycles()-c0, proxy.throttled.Load())
	})
}

const budgetPolicy = `apiVersion: remediate.dev/v1alpha1
kind: RemediationPolicy
mode: audit
interval: 30s
detectorTimeout: 10s
rules:
- name: stale-ct
  detector: {type: ConntrackStaleServiceEntries, grace: 90s, includeTCP: false}
  for: 1m
  action: {type: FlushConntrack, maxEntries: 10000}
`

// TestE2EClusterViewBudget: on the real apiserver, a Service with 2,000
// ports and 20 EndpointSlices of 100 endpoints take the cluster view past
// a 256Ki budget (--cluster-view-memory 256Ki): the real binary's check
// that compares conntrack with the view skips with a reason naming the
// budget. Under the default budget the same cluster is held and the check
// is not skipped for it (on main there was no budget: the flag is unknown).
func TestE2EClusterViewBudget(t *testing.T) {
	parallelE2E(t)
	cp := controlplane.Start(t, controlplane.Options{})
	ctx := context.Background()
	const ns = "hc-budget"
	if _, err := cp.Client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	svc := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "wide", Namespace: ns}}
	for p := range 2000 {
		svc.Spec.Ports = append(svc.Spec.Ports, corev1.ServicePort{Name: fmt.Sprintf("p%d", p), Port: int32(1000 + p), Protocol: corev1.ProtocolUDP})
	}
	if _, err := cp.Client.CoreV1().Services(ns).Create(ctx, svc, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	for i := range 20 {
		sl := &discoveryv1.EndpointSlice{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("wide-%d", i), Namespace: ns,
			Labels: map[string]string{discoveryv1.LabelServiceName: "wide"}},
			AddressType: discoveryv1.AddressTypeIPv4,
			Ports:       []discoveryv1.EndpointPort{{Name: ptr.To("p0"), Port: ptr.To[int32](1000), Protocol: ptr.To(corev1.ProtocolUDP)}}}
		for e := range 100 {
			sl.Endpoints = append(sl.Endpoints, discoveryv1.Endpoint{Addresses: []string{fmt.Sprintf("10.244.%d.%d", i, e+1)},
				Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true)}, NodeName: ptr.To("node1")})
		}
		if _, err := cp.Client.DiscoveryV1().EndpointSlices(ns).Create(ctx, sl, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	pol := filepath.Join(dir, "policy.yaml")
	if err := os.WriteFile(pol, []byte(budgetPolicy), 0o644); err != nil {
		t.Fatal(err)
	}
	run := func(extra ...string) remediate.Report {
		t.Helper()
		args := append([]string{"ip", "netns", "exec", cp.NetNS.Name, self, "--once", "--sample", "0", "-o", "json", "--dry-run", "--policy", pol,
			"--kubeconfig", cp.AdminKubeconfig, "--state-dir", filepath.Join(dir, "state"), "--node-name", "node1", "--proc-root", "/proc"}, extra...)
		cmd := mainCmd(args[0], args[1:]...)
		var stderr strings.Builder
		cmd.Stderr = &stderr
		out, err := cmd.Output()
		var rep remediate.Report
		if jerr := json.Unmarshal(out, &rep); jerr != nil {
			t.Fatalf("%v: %v\nstdout:\n%s\nstderr:\n%s", err, jerr, out, stderr.String())
		}
		t.Logf("stderr:\n%s", stderr.String())
		return rep
	}
	skipReason := func(rep remediate.Report) string {
		for _, s := range rep.Skipped {
			if s.Rule == "stale-ct" {
				return s.Reason
			}
		}
		return ""
	}
	rep := run("--cluster-view-memory", "256Ki")
	if r := skipReason(rep); !strings.Contains(r, "cluster view over its memory budget (--cluster-view-memory 256Ki)") {
		t.Errorf("over the budget: stale-ct skipped for %q, want the budget named", r)
	}
	rep = run()
	if r := skipReason(rep); strings.Contains(r, "memory budget") {
		t.Errorf("under the default budget: stale-ct skipped for %q", r)
	}
}
