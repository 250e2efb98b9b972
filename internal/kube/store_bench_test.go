package kube

import (
	"fmt"
	"runtime"
	"testing"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/tools/cache"
	"k8s.io/utils/ptr"
)

func benchObjects(i int) (*corev1.Service, *discoveryv1.EndpointSlice) {
	ns, name := fmt.Sprintf("bench-%d", i%10), fmt.Sprintf("svc-%d", i)
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, UID: types.UID(fmt.Sprintf("%036d", i)), ResourceVersion: fmt.Sprint(100000 + i),
			Labels: map[string]string{"app": name}, Annotations: map[string]string{"a": "b"}},
		Spec: corev1.ServiceSpec{ClusterIP: fmt.Sprintf("10.96.%d.%d", i>>8, i&255), ClusterIPs: []string{fmt.Sprintf("10.96.%d.%d", i>>8, i&255)},
			Type: corev1.ServiceTypeClusterIP, Selector: map[string]string{"app": name},
			Ports: []corev1.ServicePort{{Name: "http", Port: 80, TargetPort: intstr.FromInt32(8080), Protocol: corev1.ProtocolTCP},
				{Name: "metrics", Port: 9090, TargetPort: intstr.FromInt32(9090), Protocol: corev1.ProtocolTCP}}},
	}
	sl := &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{Name: name + "-abcde", Namespace: ns, UID: types.UID(fmt.Sprintf("%036d", i)), ResourceVersion: fmt.Sprint(200000 + i),
			Labels: map[string]string{discoveryv1.LabelServiceName: name, discoveryv1.LabelManagedBy: "x"}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports: []discoveryv1.EndpointPort{{Name: ptr.To("http"), Port: ptr.To[int32](8080), Protocol: ptr.To(corev1.ProtocolTCP)},
			{Name: ptr.To("metrics"), Port: ptr.To[int32](9090), Protocol: ptr.To(corev1.ProtocolTCP)}},
	}
	for e := range 5 {
		n := i*5 + e
		sl.Endpoints = append(sl.Endpoints, discoveryv1.Endpoint{
			Addresses:  []string{fmt.Sprintf("10.%d.%d.%d", 64+n>>16, (n>>8)&255, n&255)},
			Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true), Serving: ptr.To(true), Terminating: ptr.To(false)},
			NodeName:   ptr.To(fmt.Sprintf("node-%d", n%500)),
			TargetRef:  &corev1.ObjectReference{Kind: "Pod", Name: "p"},
		})
	}
	return svc, sl
}

// BenchmarkStoreHeap measures the live heap of the view's stores (after
// Transform) holding 10,000 Services and 10,000 EndpointSlices of 5
// endpoints, without an apiserver: the part of the view's memory that
// stays.
func BenchmarkStoreHeap(b *testing.B) {
	for range b.N {
		var before, after runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&before)
		svcs := cache.NewIndexer(cache.DeletionHandlingMetaNamespaceKeyFunc, cache.Indexers{})
		eps := cache.NewIndexer(cache.DeletionHandlingMetaNamespaceKeyFunc, cache.Indexers{serviceIndex: sliceServiceKey})
		for i := range 10000 {
			s, e := benchObjects(i)
			ts, _ := Transform(s)
			te, _ := Transform(e)
			_ = svcs.Add(ts)
			_ = eps.Add(te)
		}
		runtime.GC()
		runtime.ReadMemStats(&after)
		b.ReportMetric(float64(after.HeapAlloc-before.HeapAlloc)/(1<<20), "heap-MiB")
		runtime.KeepAlive(svcs)
		runtime.KeepAlive(eps)
	}
}
