package kube

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"runtime"
	"runtime/debug"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	kruntime "k8s.io/apimachinery/pkg/runtime"
	clientfeatures "k8s.io/client-go/features"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/rest"

	"github.com/remediate-dev/remediate/internal/testing/memstat"
)

// listServer answers the cluster view's requests as a kube-apiserver
// whose watch cache serves the LIST and which refuses the streaming list
// (its WatchList gate off, or an apiserver before it): a watch with
// sendInitialEvents gets the apiserver's 422; a LIST at
// resourceVersion="0" is served whole, its limit ignored (the watch
// cache's behaviour); any other LIST honours limit and continue (etcd's).
// Objects are written as JSON one by one, so the server itself holds
// almost nothing in the test's heap. It counts the LISTs and the largest
// page it served.
type listServer struct {
	slices, endpoints int // slices, endpoints per slice (one Service per slice)
	// burst, closed by the test, makes the EndpointSlice watch send a
	// MODIFIED event of every slice at once.
	burst chan struct{}

	lists   atomic.Int64
	maxPage atomic.Int64
	refused atomic.Int64
}

const listServerRV = "1000"

func (s *listServer) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	var kind string
	switch r.URL.Path {
	case "/api/v1/services":
		kind = "Service"
	case "/apis/discovery.k8s.io/v1/endpointslices":
		kind = "EndpointSlice"
	default:
		http.NotFound(w, r)
		return
	}
	if q.Get("watch") == "true" || q.Get("watch") == "1" {
		if q.Get("sendInitialEvents") == "true" {
			s.refused.Add(1)
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusUnprocessableEntity)
			fmt.Fprint(w, `{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"ListOptions.meta.k8s.io \"\" is invalid: sendInitialEvents: Forbidden: sendInitialEvents is forbidden for watch unless the WatchList feature gate is enabled","reason":"Invalid","code":422}`)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusOK)
		w.(http.Flusher).Flush()
		// On the test's signal, a burst: every slice changed at once.
		if kind == "EndpointSlice" && s.burst != nil {
			select {
			case <-s.burst:
				bw := bufio.NewWriterSize(w, 64<<10)
				for i := range s.slices {
					bw.WriteString(`{"type":"MODIFIED","object":`)
					s.writeSlice(bw, i, 100000+i)
					bw.WriteString("}\n")
				}
				bw.Flush()
				w.(http.Flusher).Flush()
			case <-r.Context().Done():
			}
		}
		<-r.Context().Done()
		return
	}
	s.lists.Add(1)
	from := 0
	if c := q.Get("continue"); c != "" {
		n, err := strconv.Atoi(c)
		if err != nil {
			http.Error(w, "bad continue", http.StatusBadRequest)
			return
		}
		from = n
	}
	to := s.slices
	if l, _ := strconv.Atoi(q.Get("limit")); l > 0 && q.Get("resourceVersion") != "0" && from+l < to {
		to = from + l
	}
	if n := int64(to - from); n > s.maxPage.Load() {
		s.maxPage.Store(n)
	}
	cont := ""
	if to < s.slices {
		cont = strconv.Itoa(to)
	}
	w.Header().Set("Content-Type", "application/json")
	bw := bufio.NewWriterSize(w, 64<<10)
	defer bw.Flush()
	group := "v1"
	if kind == "EndpointSlice" {
		group = "discovery.k8s.io/v1"
	}
	fmt.Fprintf(bw, `{"kind":"%sList","apiVersion":"%s","metadata":{"resourceVersion":"%s","continue":"%s"},"items":[`, kind, group, listServerRV, cont)
	for i := from; i < to; i++ {
		if i > from {
			bw.WriteByte(',')
		}
		if kind == "Service" {
			s.writeService(bw, i)
		} else {
			s.writeSlice(bw, i, 100+i)
		}
	}
	bw.WriteString("]}")
}

// managedFields as the apiserver returns them: a good part of a real
// object's bytes.
const listServerManaged = `"managedFields":[{"manager":"kube-controller-manager","operation":"Update","apiVersion":"discovery.k8s.io/v1","time":"2026-11-01T10:00:00Z","fieldsType":"FieldsV1","fieldsV1":{"f:addressType":{},"f:endpoints":{},"f:metadata":{"f:labels":{".":{},"f:endpointslice.kubernetes.io/managed-by":{},"f:kubernetes.io/service-name":{}}},"f:ports":{}}}]`

func (s *listServer) writeService(w *bufio.Writer, i int) {
	fmt.Fprintf(w, `{"metadata":{"name":"svc-%d","namespace":"ns-%d","uid":"00000000-0000-0000-0000-%012d","resourceVersion":"%d","creationTimestamp":"2026-11-01T10:00:00Z","labels":{"app":"svc-%d"},%s},`+
		`"spec":{"type":"ClusterIP","clusterIP":"10.96.%d.%d","clusterIPs":["10.96.%d.%d"],"selector":{"app":"svc-%d"},"ports":[{"name":"http","protocol":"TCP","port":80,"targetPort":8080}]},"status":{"loadBalancer":{}}}`,
		i, i%10, i, 100+i, i, listServerManaged, (i>>8)&255, i&255, (i>>8)&255, i&255, i)
}

func (s *listServer) writeSlice(w *bufio.Writer, i, rv int) {
	fmt.Fprintf(w, `{"kind":"EndpointSlice","apiVersion":"discovery.k8s.io/v1","metadata":{"name":"svc-%d-abcde","generateName":"svc-%d-","namespace":"ns-%d","uid":"00000000-0000-0000-0001-%012d","resourceVersion":"%d","creationTimestamp":"2026-11-01T10:00:00Z","labels":{"endpointslice.kubernetes.io/managed-by":"endpointslice-controller.k8s.io","kubernetes.io/service-name":"svc-%d"},%s},"addressType":"IPv4","endpoints":[`,
		i, i, i%10, i, rv, i, listServerManaged)
	for e := range s.endpoints {
		if e > 0 {
			w.WriteByte(',')
		}
		n := i*s.endpoints + e
		fmt.Fprintf(w, `{"addresses":["10.%d.%d.%d"],"conditions":{"ready":true,"serving":true,"terminating":false},"targetRef":{"kind":"Pod","namespace":"ns-%d","name":"svc-%d-pod-%d","uid":"11111111-2222-3333-4444-%012d"},"nodeName":"node-%d","zone":"zone-a"}`,
			64+(n>>16)&63, (n>>8)&255, n&255, i%10, i, e, n, n%500)
	}
	w.WriteString(`],"ports":[{"name":"http","protocol":"TCP","port":8080}]}`)
}

// TestViewSyncHeapBounded: a large cluster view synced under a small
// memory budget, against an apiserver that refuses the streaming list
// (client-go then LISTs; at resourceVersion 0 the watch cache serves the
// whole list, whatever the limit), keeps the heap near the budget plus a
// fixed overhead: the LIST is made in pages and each page is compacted
// (and admitted by the budget) before the next is fetched. Before, the
// whole list (200,000 endpoints here, about 70 MB of JSON) was decoded
// before the transform and the budget saw one object, and the heap
// peaked past 150 MiB. A burst of changes after the sync (every slice
// modified at once over the watch) stays bounded too.
func TestViewSyncHeapBounded(t *testing.T) {
	if testing.Short() {
		t.Skip("decodes ~70 MB of JSON")
	}
	srv := &listServer{slices: 2000, endpoints: 100, burst: make(chan struct{})}
	ts := httptest.NewUnstartedServer(srv)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ts.Listener = l
	ts.Start()
	defer ts.Close()

	// As the daemon: the streaming list asked for first (the apiserver
	// refuses it here), GOGC=25 (internal/memlimit).
	prev := setStreamingList()
	defer clientfeatures.ReplaceFeatureGates(prev)
	defer debug.SetGCPercent(debug.SetGCPercent(25))

	cfg := &rest.Config{Host: ts.URL, QPS: -1}
	cfg.AcceptContentTypes = "application/vnd.kubernetes.protobuf,application/json" // as Connect
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	const budget = 4 << 20
	v, err := NewLimitedView(cs, nil, nil, nil, ViewLimits{MemoryBudget: budget})
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
	start := time.Now()
	v.Start(ctx)
	if !v.WaitForSync(ctx) {
		t.Fatal("no sync")
	}
	synced := time.Since(start)
	peak := stop()
	st := v.Budget()
	held := len(v.eps.GetStore().ListKeys())

	t.Logf("synced %d slices (%d endpoints) in %s: heap peak %.1f MiB above a %.1f MiB baseline; budget %+v; %d LISTs, largest page %d, %d streaming lists refused",
		srv.slices, srv.slices*srv.endpoints, synced.Round(time.Millisecond), float64(peak-min(base, peak))/(1<<20), float64(base)/(1<<20),
		st, srv.lists.Load(), srv.maxPage.Load(), srv.refused.Load())

	// Then a burst of changes: every slice modified at once over the
	// watch (decoded and compacted one event at a time).
	gen := v.Generation()
	runtime.GC()
	runtime.ReadMemStats(&ms)
	burstBase := ms.HeapAlloc
	stopBurst := memstat.HeapObjectsPeak()
	close(srv.burst)
	deadline := time.Now().Add(60 * time.Second)
	for v.Generation() < gen+uint64(srv.slices) {
		if time.Now().After(deadline) {
			t.Fatalf("the burst was not seen: generation %d, want %d", v.Generation(), gen+uint64(srv.slices))
		}
		time.Sleep(5 * time.Millisecond)
	}
	burstPeak := stopBurst()
	burstOver := burstPeak - min(burstBase, burstPeak)
	t.Logf("burst of %d slice changes: heap peak %.1f MiB above %.1f MiB; budget %+v", srv.slices, float64(burstOver)/(1<<20), float64(burstBase)/(1<<20), v.Budget())
	if burstOver > 48<<20 {
		t.Errorf("heap peaked %.1f MiB above the synced view during a burst of changes: want < 48 MiB", float64(burstOver)/(1<<20))
	}
	if srv.refused.Load() == 0 {
		t.Error("the view did not ask for the streaming list: the test does not test the fallback")
	}
	if held != srv.slices || st.Dropped == 0 || st.Bytes > budget {
		t.Errorf("view holds %d slice records (want %d), budget %+v: want some held empty and at most %d bytes", held, srv.slices, st, budget)
	}
	// Budget 4 MiB: broken, the peak is the whole decoded list (> 150 MiB
	// measured); bounded, one page (100 slices, ~3.5 MB of JSON) plus the
	// records (~10 MiB measured).
	if over := peak - min(base, peak); over > 48<<20 {
		t.Errorf("heap peaked %.1f MiB above the baseline while syncing under a %s budget: want < 48 MiB (the budget, one page of the LIST and a fixed overhead)",
			float64(over)/(1<<20), FormatBytes(budget))
	}
}

// TestPagedListOptions: the view's LIST asks for pages of ListPageSize;
// the reflector's first LIST (resourceVersion "0", which the watch cache
// serves whole) is made at "" (paged by the apiserver), a relist keeps its
// version; pages after the first carry only the continue token; an
// apiserver error reaches the reflector as is (an "Expired" makes it list
// again at ""); every item is compacted before the reflector sees it.
func TestPagedListOptions(t *testing.T) {
	v, err := NewLimitedView(fake.NewClientset(), nil, nil, nil, ViewLimits{})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ rv, wantFirst string }{{"0", ""}, {"", ""}, {"4711", "4711"}} {
		var got []metav1.ListOptions
		list := v.pagedList(func(_ context.Context, o metav1.ListOptions) (kruntime.Object, error) {
			got = append(got, o)
			l := &discoveryv1.EndpointSliceList{ListMeta: metav1.ListMeta{ResourceVersion: "5000"}}
			l.Items = []discoveryv1.EndpointSlice{*testSlice(fmt.Sprintf("s%d", len(got)), "10.0.0.1")}
			if len(got) < 3 {
				l.Continue = fmt.Sprintf("c%d", len(got))
			}
			return l, nil
		})
		out, err := list(context.Background(), metav1.ListOptions{ResourceVersion: tc.rv, Limit: 500, LabelSelector: "x"})
		if err != nil {
			t.Fatal(err)
		}
		want := []metav1.ListOptions{{ResourceVersion: tc.wantFirst, Limit: ListPageSize, LabelSelector: "x"},
			{Continue: "c1", Limit: ListPageSize, LabelSelector: "x"}, {Continue: "c2", Limit: ListPageSize, LabelSelector: "x"}}
		if diff := cmp.Diff(want, got); diff != "" {
			t.Errorf("rv %q: requests (-want +got):\n%s", tc.rv, diff)
		}
		items, err := apimeta.ExtractList(out)
		if err != nil {
			t.Fatal(err)
		}
		if lm, _ := apimeta.ListAccessor(out); lm.GetResourceVersion() != "5000" || len(items) != 3 {
			t.Fatalf("rv %q: list at %q with %d items", tc.rv, lm.GetResourceVersion(), len(items))
		}
		for _, it := range items {
			if _, ok := it.(*compactSlice); !ok {
				t.Errorf("item %T, want a compact record", it)
			}
		}
	}
	expired := apierrors.NewResourceExpired("too old resource version")
	_, err = v.pagedList(func(context.Context, metav1.ListOptions) (kruntime.Object, error) { return nil, expired })(context.Background(), metav1.ListOptions{})
	if !apierrors.IsResourceExpired(err) {
		t.Errorf("error %v: the reflector must see Expired", err)
	}
}

// TestPagedListFailureRestoresBudget: a LIST that fails after some pages
// never reaches the store, so the budget's entries of the records it
// admitted go back to what they were: a record held before keeps its
// accounting, one seen only by the failed LIST leaves none (no cost, no
// "held empty" that would keep the view over budget for ever).
func TestPagedListFailureRestoresBudget(t *testing.T) {
	v, err := NewLimitedView(fake.NewClientset(), nil, nil, nil, ViewLimits{MemoryBudget: 2 << 10})
	if err != nil {
		t.Fatal(err)
	}
	held := testSlice("held", "10.0.0.1")
	held.ResourceVersion = "10"
	if _, err := v.transform(held); err != nil {
		t.Fatal(err)
	}
	before := v.Budget()
	if before.Bytes == 0 || before.Dropped != 0 {
		t.Fatalf("budget %+v", before)
	}
	addrs := make([]string, 50)
	for i := range addrs {
		addrs[i] = fmt.Sprintf("10.1.0.%d", i)
	}
	calls := 0
	list := v.pagedList(func(context.Context, metav1.ListOptions) (kruntime.Object, error) {
		calls++
		if calls == 2 {
			return nil, apierrors.NewResourceExpired("The provided continue parameter is too old")
		}
		newer := testSlice("held", "10.0.0.1", "10.0.0.2")
		newer.ResourceVersion = "20"
		big := testSlice("big", addrs...) // past the 2Ki budget: held empty
		return &discoveryv1.EndpointSliceList{ListMeta: metav1.ListMeta{ResourceVersion: "20", Continue: "c1"},
			Items: []discoveryv1.EndpointSlice{*newer, *big, *testSlice("new", "10.0.0.3")}}, nil
	})
	if _, err := list(context.Background(), metav1.ListOptions{}); !apierrors.IsResourceExpired(err) {
		t.Fatalf("error %v, want Expired", err)
	}
	if after := v.Budget(); after.Bytes != before.Bytes || after.Dropped != 0 {
		t.Errorf("budget after the failed LIST %+v, want %+v as before", after, before)
	}
	if e := v.budget.entry("eps/kube-system/held"); !e.had || e.entry.rv != "10" {
		t.Errorf("held record's entry %+v, want its own (rv 10)", e)
	}
	for _, k := range []string{"eps/kube-system/big", "eps/kube-system/new"} {
		if e := v.budget.entry(k); e.had {
			t.Errorf("%s left in the budget: %+v", k, e)
		}
	}
	if v.Freshness().OverBudget != "" {
		t.Errorf("over budget after the failed LIST: %s", v.Freshness().OverBudget)
	}
}
