// Command viewchild runs the cluster view alone, for
// BenchmarkViewSteadyState: it connects with the kubeconfig in
// $REMEDIATE_VIEW_CHILD_KUBECONFIG, syncs, prints SYNCED, waits for the
// benchmark's churn marker (the Service named $REMEDIATE_VIEW_CHILD_MARKER) and 20 s of steady state, then prints
// VIEWSTATS <json> (RSS, heap, LIST requests before and after sync) and
// exits. A separate small binary, so its RSS is the view's (plus the Go
// runtime and client-go), not a test binary's.
package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"runtime"
	"runtime/debug"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/remediate-dev/remediate/internal/kube"
	"github.com/remediate-dev/remediate/internal/memlimit"
)

// Stats is what the child reports.
type Stats struct {
	SyncSeconds     float64 `json:"syncSeconds"`
	Services        int     `json:"services"`
	Endpoints       int     `json:"endpoints"`
	RSSBytes        int64   `json:"rssBytes"`
	PeakRSSBytes    int64   `json:"peakRSSBytes"` // VmHWM: the initial sync's peak
	BaselineRSS     int64   `json:"baselineRSSBytes"`
	HeapInuseBytes  uint64  `json:"heapInuseBytes"`
	HeapAllocBytes  uint64  `json:"heapAllocBytes"`
	ListsBeforeSync int64   `json:"listsBeforeSync"`
	ListsAfterSync  int64   `json:"listsAfterSync"`
	Watches         int64   `json:"watches"`
	SawChurn        bool    `json:"sawChurn"`
}

type roundTripperFunc func(*http.Request) (*http.Response, error)

func (f roundTripperFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

func rss() int64 { return status("VmRSS:") }

func status(key string) int64 {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return -1
	}
	for _, l := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(l, key) {
			f := strings.Fields(l)
			kb, _ := strconv.ParseInt(f[1], 10, 64)
			return kb << 10
		}
	}
	return -1
}

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "viewchild:", err)
		os.Exit(1)
	}
}

func run() error {
	kc := os.Getenv("REMEDIATE_VIEW_CHILD_KUBECONFIG")
	if kc == "" {
		return fmt.Errorf("REMEDIATE_VIEW_CHILD_KUBECONFIG is not set")
	}
	marker := os.Getenv("REMEDIATE_VIEW_CHILD_MARKER")
	var synced atomic.Bool
	var listsBefore, listsAfter, watches atomic.Int64
	count := func(rt http.RoundTripper) http.RoundTripper {
		return roundTripperFunc(func(r *http.Request) (*http.Response, error) {
			p := r.URL.Path
			if r.Method == http.MethodGet && (strings.HasSuffix(p, "/services") || strings.HasSuffix(p, "/endpointslices")) {
				switch {
				case r.URL.Query().Get("watch") == "true":
					watches.Add(1)
				case synced.Load():
					listsAfter.Add(1)
				default:
					listsBefore.Add(1)
				}
			}
			return rt.RoundTrip(r)
		})
	}
	kube.EnableStreamingList() // as the daemon does, before client-go reads a gate
	c, err := kube.Connect(kube.Options{Kubeconfig: kc, WrapTransport: count})
	if err != nil {
		return err
	}
	memlimit.Set("") // as the daemon does
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	runtime.GC()
	debug.FreeOSMemory()
	baseline := rss()
	v, err := kube.NewView(c.Interface, c.Contact, nil, nil)
	if err != nil {
		return err
	}
	start := time.Now()
	v.Start(ctx)
	sctx, scancel := context.WithTimeout(ctx, 5*time.Minute)
	defer scancel()
	if !v.WaitForSync(sctx) {
		return fmt.Errorf("no sync")
	}
	syncTime := time.Since(start)
	synced.Store(true)
	// The daemon gives back its init-only pages after its first cycle.
	_, _ = memlimit.DropInitPages()
	fmt.Println("SYNCED")

	saw := false
	deadline := time.Now().Add(60 * time.Second)
	for !saw && time.Now().Before(deadline) {
		for _, s := range v.Services() {
			if s.Name == marker {
				saw = true
			}
		}
		time.Sleep(500 * time.Millisecond)
	}
	time.Sleep(20 * time.Second)
	st := Stats{SyncSeconds: syncTime.Seconds(), SawChurn: saw, BaselineRSS: baseline,
		ListsBeforeSync: listsBefore.Load(), ListsAfterSync: listsAfter.Load(), Watches: watches.Load()}
	for _, s := range v.Services() {
		if strings.HasPrefix(s.Name, "svc-") {
			st.Services++
			st.Endpoints += len(v.Endpoints(s.Namespace, s.Name)) / 2 // two ports per endpoint
		}
	}
	runtime.GC()
	debug.FreeOSMemory()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	st.HeapInuseBytes, st.HeapAllocBytes = ms.HeapInuse, ms.HeapAlloc
	st.RSSBytes = rss()
	st.PeakRSSBytes = status("VmHWM:")
	js, _ := json.Marshal(st)
	fmt.Println("VIEWSTATS " + string(js))
	runtime.KeepAlive(v)
	return nil
}
