package kube

import (
	"fmt"
	"os"
	"runtime"
	"runtime/debug"
	"strconv"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/utils/ptr"
)

// bigService is issue #27's large object: one Service with 10,000 ports.
func bigService() *corev1.Service {
	s := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "big", Namespace: "bench", ResourceVersion: "1"},
		Spec: corev1.ServiceSpec{ClusterIP: "10.96.1.1", ClusterIPs: []string{"10.96.1.1"}, Type: corev1.ServiceTypeClusterIP}}
	for p := range 10000 {
		s.Spec.Ports = append(s.Spec.Ports, corev1.ServicePort{Name: "p" + strconv.Itoa(p), Port: int32(1000 + p), Protocol: corev1.ProtocolTCP})
	}
	return s
}

// bigSlice is one of 1,000 EndpointSlices x 1,000 endpoints (one port).
func bigSlice(i int) *discoveryv1.EndpointSlice {
	sl := &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("big-%04d", i), Namespace: "bench", ResourceVersion: strconv.Itoa(10 + i),
			Labels: map[string]string{discoveryv1.LabelServiceName: "big"}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       []discoveryv1.EndpointPort{{Name: ptr.To("p0"), Port: ptr.To[int32](8080), Protocol: ptr.To(corev1.ProtocolTCP)}},
	}
	for e := range 1000 {
		n := i*1000 + e
		sl.Endpoints = append(sl.Endpoints, discoveryv1.Endpoint{Addresses: []string{fmt.Sprintf("10.%d.%d.%d", 64+n>>16, (n>>8)&255, n&255)},
			Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true)}, NodeName: ptr.To(fmt.Sprintf("node-%d", n%500))})
	}
	return sl
}

func vmRSS() int64 {
	b, _ := os.ReadFile("/proc/self/status")
	for _, l := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(l, "VmRSS:") {
			kb, _ := strconv.ParseInt(strings.Fields(l)[1], 10, 64)
			return kb << 10
		}
	}
	return -1
}

// BenchmarkViewBudget1MEndpoints feeds issue #27's large cluster (a
// Service with 10,000 ports, 1,000 EndpointSlices x 1,000 endpoints: 1M
// endpoints) through the view's transform and store, as the informers do,
// then reads the Service's endpoints once as a check does. "none": no
// budget; "default": DefaultMemoryBudget (it trips: the slices past it are
// held empty and the checks are off, so nobody reads). Reported: live heap
// and the process's RSS growth (a test binary's; run each alone with
// -benchtime 1x -run '^$').
func BenchmarkViewBudget1MEndpoints(b *testing.B) {
	for _, tc := range []struct {
		name   string
		budget int64
	}{{"none", -1}, {"default", 0}} {
		b.Run(tc.name, func(b *testing.B) {
			for range b.N {
				debug.FreeOSMemory()
				rss0 := vmRSS()
				var m0 runtime.MemStats
				runtime.ReadMemStats(&m0)
				v, err := NewLimitedView(fake.NewClientset(), nil, nil, nil, ViewLimits{MemoryBudget: tc.budget})
				if err != nil {
					b.Fatal(err)
				}
				o, _ := v.transform(bigService())
				_ = v.svc.GetIndexer().Add(o)
				for i := range 1000 {
					o, _ := v.transform(bigSlice(i))
					_ = v.eps.GetIndexer().Add(o)
				}
				held := 0
				if v.budget.reason() == "" {
					held = len(v.Endpoints("bench", "big")) // what a check builds
				}
				peakRSS := vmRSS()
				runtime.GC()
				var m1 runtime.MemStats
				runtime.ReadMemStats(&m1)
				st := v.Budget()
				b.ReportMetric(float64(int64(m1.HeapAlloc)-int64(m0.HeapAlloc))/(1<<20), "heap-live-MiB")
				b.ReportMetric(float64(peakRSS-rss0)/(1<<20), "RSS-growth-MiB")
				b.ReportMetric(float64(st.Bytes)/(1<<20), "accounted-MiB")
				b.ReportMetric(float64(st.Dropped), "dropped")
				b.ReportMetric(float64(held), "endpoints-read")
				if tc.budget == 0 && (st.Dropped == 0 || st.Bytes > DefaultMemoryBudget) {
					b.Errorf("default budget: %+v", st)
				}
				runtime.KeepAlive(v)
			}
		})
	}
}
