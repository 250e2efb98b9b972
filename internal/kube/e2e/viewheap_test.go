package e2e

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"runtime"
	"runtime/debug"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"

	"github.com/remediate-dev/remediate/internal/kube"
	"github.com/remediate-dev/remediate/internal/testing/controlplane"
	"github.com/remediate-dev/remediate/internal/testing/memstat"
)

// TestViewSyncHeapBoundedRealAPIServer: the cluster view syncing a large
// cluster (REMEDIATE_VIEWHEAP_SLICES slices of REMEDIATE_VIEWHEAP_ENDPOINTS
// endpoints, default 1,000 x 200: 200,000 endpoints) from the real
// kube-apiserver, its streaming list off (--feature-gates=WatchList=false;
// client-go's reflector LISTs), under a 4 MiB budget
// (REMEDIATE_VIEWHEAP_BUDGET bytes) and GOMEMLIMIT 150MiB: the heap stays near
// the budget plus a fixed overhead, because the view LISTs in pages and
// compacts each page before the next. Before, the apiserver's watch cache
// answered the reflector's first LIST (resourceVersion 0) whole and the
// whole decoded list was alive at once.
func TestViewSyncHeapBoundedRealAPIServer(t *testing.T) {
	slices, endpoints := envInt(t, "REMEDIATE_VIEWHEAP_SLICES", 1000), envInt(t, "REMEDIATE_VIEWHEAP_ENDPOINTS", 200)
	cp := controlplane.Start(t, controlplane.Options{ExtraAPIServerArgs: []string{"--feature-gates=WatchList=false"}})
	cfg := rest.CopyConfig(cp.RestConfig)
	cfg.QPS, cfg.Burst = -1, 0
	cs := kubernetes.NewForConfigOrDie(cfg)
	start := time.Now()
	fillSlices(t, cs, slices, endpoints)
	t.Logf("created %d Services and EndpointSlices (%d endpoints) in %s", slices, slices*endpoints, time.Since(start).Round(time.Second))

	// The view's client as kube.Connect makes it (protobuf), counting
	// its LISTs.
	var lists, pagesWithMore atomic.Int64
	vcfg := rest.CopyConfig(cp.RestConfig)
	vcfg.AcceptContentTypes = "application/vnd.kubernetes.protobuf,application/json"
	vcfg.ContentType = "application/vnd.kubernetes.protobuf"
	vcfg.Wrap(func(rt http.RoundTripper) http.RoundTripper {
		return rtFunc(func(r *http.Request) (*http.Response, error) {
			if r.URL.Query().Get("watch") == "" && strings.HasSuffix(r.URL.Path, "/endpointslices") {
				lists.Add(1)
				if r.URL.Query().Get("continue") != "" {
					pagesWithMore.Add(1)
				}
			}
			return rt.RoundTrip(r)
		})
	})
	vcs := kubernetes.NewForConfigOrDie(vcfg)
	// As the daemon in the chart: GOMEMLIMIT=150MiB, GOGC=25 (internal/memlimit).
	defer debug.SetGCPercent(debug.SetGCPercent(25))
	defer debug.SetMemoryLimit(debug.SetMemoryLimit(150 << 20))
	budget := int64(envInt(t, "REMEDIATE_VIEWHEAP_BUDGET", 4<<20))
	v, err := kube.NewLimitedView(vcs, nil, nil, nil, kube.ViewLimits{MemoryBudget: budget})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	base := ms.HeapAlloc
	stop := memstat.HeapObjectsPeak()
	start = time.Now()
	v.Start(ctx)
	if !v.WaitForSync(ctx) {
		t.Fatal("no sync")
	}
	synced := time.Since(start)
	peak := stop()
	over := peak - min(base, peak)
	st := v.Budget()
	t.Logf("synced in %s: heap peak %.1f MiB above a %.1f MiB baseline; budget %+v; %d EndpointSlice LISTs (%d continued)",
		synced.Round(time.Millisecond), float64(over)/(1<<20), float64(base)/(1<<20), st, lists.Load(), pagesWithMore.Load())
	if st.Dropped == 0 {
		t.Errorf("budget %+v: the cluster is not larger than the budget, the test proves nothing", st)
	}
	if want := int64(slices/kube.ListPageSize) - 1; pagesWithMore.Load() < want {
		t.Errorf("%d continued LIST pages, want >= %d: the apiserver served the list whole", pagesWithMore.Load(), want)
	}
	// The budget (records cost less than their estimate), one page of
	// the LIST (100 slices of 200 endpoints: ~10 MB decoded) and a fixed
	// overhead; broken, the whole decoded list (> 100 MiB at the default size).
	if limit := uint64(budget) + 44<<20; over > limit {
		t.Errorf("heap peaked %.1f MiB above the baseline while syncing under a %s budget: want < %d MiB", float64(over)/(1<<20), kube.FormatBytes(budget), limit>>20)
	}
	runtime.KeepAlive(v)
}

func envInt(t *testing.T, name string, def int) int {
	if s := os.Getenv(name); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		return n
	}
	return def
}

// fillSlices creates n Services in 10 namespaces, each with one
// EndpointSlice of e endpoints, 16 at a time.
func fillSlices(t *testing.T, cs kubernetes.Interface, n, e int) {
	ctx := context.Background()
	for i := range 10 {
		_, _ = cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("heap-%d", i)}}, metav1.CreateOptions{})
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
				if err := createBigService(ctx, cs, i, e); err != nil && failed.Add(1) == 1 {
					firstErr.Store(err)
				}
			}
		}()
	}
	for i := range n {
		work <- i
	}
	close(work)
	wg.Wait()
	if failed.Load() > 0 {
		t.Fatalf("%d creations failed, first: %v", failed.Load(), firstErr.Load())
	}
}

func createBigService(ctx context.Context, cs kubernetes.Interface, i, e int) error {
	ns := fmt.Sprintf("heap-%d", i%10)
	name := fmt.Sprintf("svc-%d", i)
	svc := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, Labels: map[string]string{"app": name}},
		Spec: corev1.ServiceSpec{Selector: map[string]string{"app": name},
			Ports: []corev1.ServicePort{{Name: "http", Port: 80, Protocol: corev1.ProtocolTCP}}}}
	if _, err := cs.CoreV1().Services(ns).Create(ctx, svc, metav1.CreateOptions{}); err != nil {
		return err
	}
	sl := &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{Name: name + "-abcde", Namespace: ns,
			Labels: map[string]string{discoveryv1.LabelServiceName: name, discoveryv1.LabelManagedBy: "endpointslice-controller.k8s.io"}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       []discoveryv1.EndpointPort{{Name: ptr.To("http"), Port: ptr.To[int32](8080), Protocol: ptr.To(corev1.ProtocolTCP)}},
	}
	for j := range e {
		n := i*e + j
		sl.Endpoints = append(sl.Endpoints, discoveryv1.Endpoint{
			Addresses:  []string{fmt.Sprintf("10.%d.%d.%d", 64+(n>>16)&63, (n>>8)&255, n&255)},
			Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true), Serving: ptr.To(true), Terminating: ptr.To(false)},
			NodeName:   ptr.To(fmt.Sprintf("node-%d", n%500)),
			Zone:       ptr.To("zone-a"),
			TargetRef:  &corev1.ObjectReference{Kind: "Pod", Namespace: ns, Name: fmt.Sprintf("%s-pod-%d", name, j), UID: "0123456789"},
		})
	}
	_, err := cs.DiscoveryV1().EndpointSlices(ns).Create(ctx, sl, metav1.CreateOptions{})
	return err
}
