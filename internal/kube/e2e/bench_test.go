package e2e

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"

	"github.com/remediate-dev/remediate/internal/testing/controlplane"
)

const (
	benchServices  = 10000
	benchEndpoints = 5 // per Service: 50,000 endpoints in all
	benchNS        = 10
	childEnv       = "REMEDIATE_VIEW_CHILD_KUBECONFIG"
)

// viewStats is what the child process (viewchild) reports.
type viewStats struct {
	SyncSeconds     float64 `json:"syncSeconds"`
	Services        int     `json:"services"`
	Endpoints       int     `json:"endpoints"`
	RSSBytes        int64   `json:"rssBytes"`
	PeakRSSBytes    int64   `json:"peakRSSBytes"`
	BaselineRSS     int64   `json:"baselineRSSBytes"`
	HeapInuseBytes  uint64  `json:"heapInuseBytes"`
	HeapAllocBytes  uint64  `json:"heapAllocBytes"`
	ListsBeforeSync int64   `json:"listsBeforeSync"`
	ListsAfterSync  int64   `json:"listsAfterSync"`
	Watches         int64   `json:"watches"`
	SawChurn        bool    `json:"sawChurn"`
}

// BenchmarkViewSteadyState measures the cluster view against a real
// apiserver holding 10,000 Services and 50,000 endpoints (10,000
// EndpointSlices of 5): the view runs in a child process (the small
// viewchild program, inside the control plane's namespace) so its RSS is the
// view's plus the Go runtime and client-go, not a test binary's.
// Reported: steady RSS and heap after sync and 20 s of churn, sync time,
// and the LIST requests after the initial sync (must be 0: resync is off
// and changes arrive by WATCH). Run with -benchtime=1x.
func BenchmarkViewSteadyState(b *testing.B) {
	cp := controlplane.Start(b, controlplane.Options{})
	cfg := rest.CopyConfig(cp.RestConfig)
	cfg.QPS, cfg.Burst = -1, 0 // no client-side limit for the fill
	cs := kubernetes.NewForConfigOrDie(cfg)
	start := time.Now()
	fill(b, cs)
	b.Logf("created %d Services and %d EndpointSlices (%d endpoints) in %s", benchServices, benchServices, benchServices*benchEndpoints, time.Since(start).Round(time.Second))

	for i := range b.N {
		// The binary's own defaults, no environment (the daemon turns
		// client-go's WatchListClient gate on): the initial list is
		// streamed over the watch, so objects are transformed one by one
		// instead of after decoding one 10,000-item list.
		st := runChild(b, cp, cs, fmt.Sprintf("marker-wl-%d", i))
		// client-go v0.34's default (one LIST, then WATCH), for comparison.
		def := runChild(b, cp, cs, fmt.Sprintf("marker-%d", i), "KUBE_FEATURE_WatchListClient=false")
		b.ReportMetric(float64(st.RSSBytes)/(1<<20), "RSS-MiB")
		b.ReportMetric(float64(st.PeakRSSBytes)/(1<<20), "peak-RSS-MiB")
		b.ReportMetric(float64(st.BaselineRSS)/(1<<20), "baseline-RSS-MiB")
		b.ReportMetric(float64(st.HeapInuseBytes)/(1<<20), "heap-inuse-MiB")
		b.ReportMetric(float64(st.HeapAllocBytes)/(1<<20), "heap-live-MiB")
		b.ReportMetric(st.SyncSeconds, "sync-s")
		b.ReportMetric(float64(def.RSSBytes)/(1<<20), "RSS-listwatch-MiB")
		b.Logf("child (streaming list): %+v", st)
		b.Logf("child (LIST then WATCH): %+v", def)
		for _, x := range []viewStats{st, def} {
			if x.Services != benchServices || x.Endpoints != benchServices*benchEndpoints {
				b.Fatalf("view holds %d services, %d endpoints", x.Services, x.Endpoints)
			}
			if !x.SawChurn {
				b.Error("the view did not see changes made after sync")
			}
			if x.ListsAfterSync != 0 {
				b.Errorf("%d LIST requests after the initial sync", x.ListsAfterSync)
			}
		}
		if st.RSSBytes > 64<<20 {
			b.Errorf("steady RSS %d MiB, target < 64 MiB", st.RSSBytes>>20)
		}
	}
}

func fill(b *testing.B, cs kubernetes.Interface) {
	ctx := context.Background()
	for i := range benchNS {
		_, _ = cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("bench-%d", i)}}, metav1.CreateOptions{})
	}
	work := make(chan int)
	var wg sync.WaitGroup
	var failed atomic.Int64
	var firstErr atomic.Value
	for range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range work {
				if err := createService(ctx, cs, i); err != nil {
					if failed.Add(1) == 1 {
						firstErr.Store(err)
					}
				}
			}
		}()
	}
	for i := range benchServices {
		work <- i
	}
	close(work)
	wg.Wait()
	if failed.Load() > 0 {
		b.Fatalf("%d creations failed, first: %v", failed.Load(), firstErr.Load())
	}
}

func createService(ctx context.Context, cs kubernetes.Interface, i int) error {
	ns := fmt.Sprintf("bench-%d", i%benchNS)
	name := fmt.Sprintf("svc-%d", i)
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns,
			Labels:      map[string]string{"app": name, "tier": "backend"},
			Annotations: map[string]string{"example.com/owner": "team-" + strconv.Itoa(i%37), "example.com/description": strings.Repeat("x", 64)}},
		Spec: corev1.ServiceSpec{Selector: map[string]string{"app": name},
			Ports: []corev1.ServicePort{{Name: "http", Port: 80, TargetPort: intstr.FromInt32(8080), Protocol: corev1.ProtocolTCP},
				{Name: "metrics", Port: 9090, TargetPort: intstr.FromInt32(9090), Protocol: corev1.ProtocolTCP}}},
	}
	if _, err := cs.CoreV1().Services(ns).Create(ctx, svc, metav1.CreateOptions{}); err != nil {
		return err
	}
	sl := &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{Name: name + "-abcde", Namespace: ns,
			Labels: map[string]string{discoveryv1.LabelServiceName: name, discoveryv1.LabelManagedBy: "endpointslice-controller.k8s.io"}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports: []discoveryv1.EndpointPort{{Name: ptr.To("http"), Port: ptr.To[int32](8080), Protocol: ptr.To(corev1.ProtocolTCP)},
			{Name: ptr.To("metrics"), Port: ptr.To[int32](9090), Protocol: ptr.To(corev1.ProtocolTCP)}},
	}
	for e := range benchEndpoints {
		n := i*benchEndpoints + e
		sl.Endpoints = append(sl.Endpoints, discoveryv1.Endpoint{
			Addresses:  []string{fmt.Sprintf("10.%d.%d.%d", 64+n>>16, (n>>8)&255, n&255)},
			Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true), Serving: ptr.To(true), Terminating: ptr.To(false)},
			NodeName:   ptr.To(fmt.Sprintf("node-%d", n%500)),
			Zone:       ptr.To("zone-a"),
			TargetRef:  &corev1.ObjectReference{Kind: "Pod", Namespace: ns, Name: fmt.Sprintf("%s-pod-%d", name, e), UID: "0123456789"},
		})
	}
	_, err := cs.DiscoveryV1().EndpointSlices(ns).Create(ctx, sl, metav1.CreateOptions{})
	return err
}

// runChild runs the view in a child process and, once it has synced,
// churns the cluster for it to see.
func runChild(b *testing.B, cp *controlplane.ControlPlane, cs kubernetes.Interface, marker string, env ...string) viewStats {
	kc := cp.Dir + "/bench-admin.kubeconfig"
	if err := os.WriteFile(kc, []byte(controlplane.Kubeconfig(controlplane.AdminToken)), 0o600); err != nil {
		b.Fatal(err)
	}
	bin := b.TempDir() + "/viewchild"
	if out, err := exec.Command("go", "build", "-o", bin, "github.com/remediate-dev/remediate/internal/kube/e2e/viewchild").CombinedOutput(); err != nil {
		b.Fatalf("building viewchild: %v: %s", err, out)
	}
	cmd := cp.NetNS.Command(bin)
	cmd.Env = append(append(os.Environ(), childEnv+"="+kc, "REMEDIATE_VIEW_CHILD_MARKER="+marker), env...)
	out, err := cmd.StdoutPipe()
	if err != nil {
		b.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		_ = cmd.Process.Kill() // by PID; no-op once it exited
		_ = cmd.Wait()
	})
	var st viewStats
	got := false
	sc := bufio.NewScanner(out)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		switch {
		case strings.HasPrefix(line, "SYNCED"):
			churn(b, cs, marker)
		case strings.HasPrefix(line, "VIEWSTATS "):
			if err := json.Unmarshal([]byte(strings.TrimPrefix(line, "VIEWSTATS ")), &st); err != nil {
				b.Fatal(err)
			}
			got = true
		case strings.Contains(line, "FAIL") || strings.Contains(line, "child:"):
			b.Log(line)
		}
	}
	if err := cmd.Wait(); err != nil || !got {
		b.Fatalf("child: %v (stats received: %v)", err, got)
	}
	return st
}

// churn updates 100 Services' endpoints and adds a marker Service the
// child waits for.
func churn(b *testing.B, cs kubernetes.Interface, marker string) {
	ctx := context.Background()
	for i := 0; i < 100; i++ {
		ns, name := fmt.Sprintf("bench-%d", i%benchNS), fmt.Sprintf("svc-%d", i)
		sl, err := cs.DiscoveryV1().EndpointSlices(ns).Get(ctx, name+"-abcde", metav1.GetOptions{})
		if err != nil {
			b.Fatal(err)
		}
		sl.Endpoints[0].Conditions.Ready = ptr.To(!*sl.Endpoints[0].Conditions.Ready)
		if _, err := cs.DiscoveryV1().EndpointSlices(ns).Update(ctx, sl, metav1.UpdateOptions{}); err != nil {
			b.Fatal(err)
		}
	}
	_, err := cs.CoreV1().Services("bench-0").Create(ctx, &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: marker},
		Spec: corev1.ServiceSpec{Ports: []corev1.ServicePort{{Port: 1}}}}, metav1.CreateOptions{})
	if err != nil {
		b.Fatal(err)
	}
}
