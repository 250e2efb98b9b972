package kube

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/tools/cache"
	"k8s.io/utils/ptr"

	"github.com/remediate-dev/remediate/internal/cluster"
)

func testService() *corev1.Service {
	return &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "dns", Namespace: "kube-system", ResourceVersion: "7",
			Annotations:   map[string]string{"big": "annotation"},
			Labels:        map[string]string{"k8s-app": "kube-dns"},
			ManagedFields: []metav1.ManagedFieldsEntry{{Manager: "kubectl"}}},
		Spec: corev1.ServiceSpec{
			ClusterIP: "10.96.0.10", ClusterIPs: []string{"10.96.0.10"}, Type: corev1.ServiceTypeClusterIP,
			Selector: map[string]string{"k8s-app": "kube-dns"},
			Ports: []corev1.ServicePort{{Name: "dns", Protocol: corev1.ProtocolUDP, Port: 53},
				{Name: "dns-tcp", Protocol: corev1.ProtocolTCP, Port: 53, NodePort: 30053}},
		},
	}
}

func testSlice(name string, addrs ...string) *discoveryv1.EndpointSlice {
	s := &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "kube-system",
			Labels:        map[string]string{discoveryv1.LabelServiceName: "dns", "other": "x"},
			ManagedFields: []metav1.ManagedFieldsEntry{{Manager: "endpointslice-controller"}}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       []discoveryv1.EndpointPort{{Name: ptr.To("dns"), Protocol: ptr.To(corev1.ProtocolUDP), Port: ptr.To[int32](53)}},
	}
	for _, a := range addrs {
		s.Endpoints = append(s.Endpoints, discoveryv1.Endpoint{Addresses: []string{a}, NodeName: ptr.To("node1"),
			Zone: ptr.To("z1"), TargetRef: &corev1.ObjectReference{Kind: "Pod", Name: "p"},
			Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true)}})
	}
	return s
}

// The fields kube-proxy's semantics and the drift detector's grace need:
// traffic policies as pkg/api/v1/service defines them, the proxy-name
// label, and the change time from managedFields.
func TestTransformPoliciesAndTimes(t *testing.T) {
	created := metav1.NewTime(time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC))
	later := metav1.NewTime(created.Add(90 * time.Second))
	local := corev1.ServiceInternalTrafficPolicyLocal
	for _, tc := range []struct {
		name         string
		typ          corev1.ServiceType
		externalIPs  []string
		etp          corev1.ServiceExternalTrafficPolicy
		wantExtLocal bool
		itp          *corev1.ServiceInternalTrafficPolicy
		wantIntLocal bool
	}{
		{"nodeport etp local", corev1.ServiceTypeNodePort, nil, corev1.ServiceExternalTrafficPolicyLocal, true, nil, false},
		{"lb etp local", corev1.ServiceTypeLoadBalancer, nil, corev1.ServiceExternalTrafficPolicyLocal, true, nil, false},
		{"clusterip with external IPs etp local", corev1.ServiceTypeClusterIP, []string{"192.0.2.1"}, corev1.ServiceExternalTrafficPolicyLocal, true, nil, false},
		{"clusterip etp local ignored", corev1.ServiceTypeClusterIP, nil, corev1.ServiceExternalTrafficPolicyLocal, false, nil, false},
		{"etp cluster", corev1.ServiceTypeNodePort, nil, corev1.ServiceExternalTrafficPolicyCluster, false, nil, false},
		{"itp local", corev1.ServiceTypeClusterIP, nil, "", false, &local, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := testService()
			s.Spec.Type, s.Spec.ExternalIPs, s.Spec.ExternalTrafficPolicy, s.Spec.InternalTrafficPolicy = tc.typ, tc.externalIPs, tc.etp, tc.itp
			s.CreationTimestamp = created
			s.ManagedFields = []metav1.ManagedFieldsEntry{{Manager: "a", Time: &created}, {Manager: "b", Time: &later}, {Manager: "c"}}
			s.Labels["service.kubernetes.io/service-proxy-name"] = "other"
			c := toCompactService(s).svc
			if c.ExternalPolicyLocal != tc.wantExtLocal || c.InternalPolicyLocal != tc.wantIntLocal {
				t.Errorf("ext %v int %v", c.ExternalPolicyLocal, c.InternalPolicyLocal)
			}
			if !c.Created.Equal(created.Time) || !c.Changed.Equal(later.Time) || c.ProxyName != "other" || c.Type != string(tc.typ) {
				t.Errorf("created %v changed %v proxy %q type %q", c.Created, c.Changed, c.ProxyName, c.Type)
			}
		})
	}
	sl := testSlice("a", "10.0.0.1")
	sl.CreationTimestamp = created
	sl.ManagedFields[0].Time = &later
	sl.Endpoints[0].Addresses = append(sl.Endpoints[0].Addresses, "10.0.0.2")
	sl.Endpoints[0].Hints = &discoveryv1.EndpointHints{ForZones: []discoveryv1.ForZone{{Name: "z1"}}}
	sl.Endpoints[0].Conditions = discoveryv1.EndpointConditions{Ready: ptr.To(false), Terminating: ptr.To(true)} // serving nil: true, as kube-proxy reads it
	eps := MergeSlices([]*discoveryv1.EndpointSlice{sl})
	if len(eps) != 2 || eps[0].Secondary || !eps[1].Secondary || !eps[0].Hinted || !eps[0].SliceChanged.Equal(later.Time) ||
		eps[0].Ready || !eps[0].Serving || !eps[0].Terminating {
		t.Errorf("endpoints %+v", eps)
	}
}

func TestTransformCompacts(t *testing.T) {
	o, err := Transform(testService())
	if err != nil {
		t.Fatal(err)
	}
	s := o.(*compactService)
	want := cluster.Service{Namespace: "kube-system", Name: "dns", ClusterIPs: []string{"10.96.0.10"}, Type: "ClusterIP",
		Ports: []cluster.ServicePort{{Name: "dns", Protocol: "UDP", Port: 53}, {Name: "dns-tcp", Protocol: "TCP", Port: 53, NodePort: 30053}}}
	if diff := cmp.Diff(want, s.svc); diff != "" {
		t.Errorf("service (-want +got):\n%s", diff)
	}
	if m := s.GetObjectMeta(); m.GetName() != "dns" || m.GetNamespace() != "kube-system" || m.GetResourceVersion() != "7" {
		t.Errorf("meta %+v", m)
	}
	o, _ = Transform(testSlice("a", "10.0.0.1"))
	sl := o.(*compactSlice)
	if sl.service != "dns" || len(sl.endpoints) != 1 || sl.endpoints[0] != (compactEndpoint{"10.0.0.1", "node1", epReady | epServing}) {
		t.Errorf("slice %+v", sl)
	}
	if keys, _ := sliceServiceKey(sl); len(keys) != 1 || keys[0] != "kube-system/dns" {
		t.Errorf("index keys %v", keys)
	}
	// Idempotent: a record passes unchanged; so do other objects.
	if o2, _ := Transform(sl); o2 != sl {
		t.Error("record transformed twice")
	}
	n := &corev1.Node{}
	if o, _ := Transform(n); o != n {
		t.Error("node changed")
	}
	// The store keys records like API objects.
	if k, err := cache.MetaNamespaceKeyFunc(sl); err != nil || k != "kube-system/a" {
		t.Errorf("key %q %v", k, err)
	}
	// Headless: no ClusterIPs.
	h := testService()
	h.Spec.ClusterIP, h.Spec.ClusterIPs = "None", []string{"None"}
	if o, _ := Transform(h); len(o.(*compactService).svc.ClusterIPs) != 0 {
		t.Error("headless service has a cluster IP")
	}
}

func TestMergeSlices(t *testing.T) {
	a := testSlice("a", "10.0.0.2", "10.0.0.1")
	b := testSlice("b", "10.0.0.1", "10.0.0.3")
	// The duplicate 10.0.0.1 in b is terminating: a's ready copy wins.
	b.Endpoints[0].Conditions = discoveryv1.EndpointConditions{Ready: ptr.To(false), Serving: ptr.To(true), Terminating: ptr.To(true)}
	// 10.0.0.3 has no conditions: nil ready means ready.
	b.Endpoints[1].Conditions = discoveryv1.EndpointConditions{}
	b.Endpoints[1].NodeName = nil
	got := MergeSlices([]*discoveryv1.EndpointSlice{b, a})
	want := []cluster.Endpoint{
		{Address: "10.0.0.1", Port: 53, Protocol: "UDP", PortName: "dns", NodeName: "node1", Ready: true, Serving: true},
		{Address: "10.0.0.2", Port: 53, Protocol: "UDP", PortName: "dns", NodeName: "node1", Ready: true, Serving: true},
		{Address: "10.0.0.3", Port: 53, Protocol: "UDP", PortName: "dns", Ready: true, Serving: true},
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("MergeSlices (-want +got):\n%s", diff)
	}
}

func TestViewWithFakeClient(t *testing.T) {
	other := testService()
	other.Name, other.Labels = "cilium-managed", map[string]string{"service.kubernetes.io/service-proxy-name": "cilium"}
	cs := fake.NewClientset(testService(), testSlice("a", "10.0.0.1"), other)
	v, err := NewView(cs, nil, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	if v.Freshness().Synced {
		t.Fatal("synced before start")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	v.Start(ctx)
	if !v.WaitForSync(ctx) {
		t.Fatal("no sync")
	}
	f := v.Freshness()
	if !f.Synced || !f.Connected || f.LastEvent.IsZero() {
		t.Errorf("freshness %+v", f)
	}
	svcs := v.Services()
	// Like kube-proxy, the view ignores Services of another service proxy.
	if len(svcs) != 1 || svcs[0].Name != "dns" || len(svcs[0].Ports) != 2 || svcs[0].Ports[1].NodePort != 30053 {
		t.Fatalf("services %+v", svcs)
	}
	if eps := v.Endpoints("kube-system", "dns"); len(eps) != 1 || eps[0].Address != "10.0.0.1" {
		t.Fatalf("endpoints %+v", eps)
	}
	// A change arrives through the watch and invalidates the snapshot.
	if _, err := cs.DiscoveryV1().EndpointSlices("kube-system").Create(ctx, testSlice("b", "10.0.0.9"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	s2 := testService()
	s2.Name = "other"
	if _, err := cs.CoreV1().Services("kube-system").Create(ctx, s2, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for len(v.Endpoints("kube-system", "dns")) != 2 || len(v.Services()) != 2 {
		if time.Now().After(deadline) {
			t.Fatalf("watch events not seen: %v %v", v.Endpoints("kube-system", "dns"), v.Services())
		}
		time.Sleep(20 * time.Millisecond)
	}
	v.recordWatchError("services", errors.New("boom"))
	if f := v.Freshness(); f.Connected || f.LastError == nil {
		t.Errorf("watch error not reflected: %+v", f)
	}
}

// TestViewServiceVersions: a Service's version (cluster.ServiceVersions)
// moves with its own events and its slices' (a slice moved to another
// Service moves both), not with other Services' events; a deleted
// Service has none, and created again gets a newer one.
func TestViewServiceVersions(t *testing.T) {
	cs := fake.NewClientset(testService(), testSlice("a", "10.0.0.1"))
	v, err := NewView(cs, nil, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	v.Start(ctx)
	if !v.WaitForSync(ctx) {
		t.Fatal("no sync")
	}
	ver := func(name string) uint64 { return v.ServiceVersion("kube-system", name) }
	waitFor := func(what string, ok func() bool) {
		t.Helper()
		deadline := time.Now().Add(5 * time.Second)
		for !ok() {
			if time.Now().After(deadline) {
				t.Fatalf("%s: not seen (dns %d, other %d, generation %d)", what, ver("dns"), ver("other"), v.Generation())
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	waitFor("initial versions", func() bool { return ver("dns") != 0 })
	dns0 := ver("dns")
	s2 := testService()
	s2.Name = "other"
	if _, err := cs.CoreV1().Services("kube-system").Create(ctx, s2, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor("other created", func() bool { return ver("other") != 0 })
	if ver("dns") != dns0 {
		t.Fatalf("another Service's creation moved dns's version %d -> %d", dns0, ver("dns"))
	}
	// A slice of dns added: dns moves, other does not.
	other0 := ver("other")
	if _, err := cs.DiscoveryV1().EndpointSlices("kube-system").Create(ctx, testSlice("b", "10.0.0.9"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor("slice b", func() bool { return ver("dns") != dns0 })
	if ver("other") != other0 {
		t.Fatal("dns's slice moved other's version")
	}
	// Slice a moved to other: both move.
	dns1 := ver("dns")
	a := testSlice("a", "10.0.0.1")
	a.Labels[discoveryv1.LabelServiceName] = "other"
	if _, err := cs.DiscoveryV1().EndpointSlices("kube-system").Update(ctx, a, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor("slice a moved", func() bool { return ver("dns") != dns1 && ver("other") != other0 })
	// other deleted: no version; created again: a newer one than any.
	if err := cs.CoreV1().Services("kube-system").Delete(ctx, "other", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor("other deleted", func() bool { return ver("other") == 0 })
	before := v.Generation()
	if _, err := cs.CoreV1().Services("kube-system").Create(ctx, s2, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor("other created again", func() bool { return ver("other") > before })

	// A Service deleted before its slices (the usual order: the
	// EndpointSlice controller cleans up after it) leaves no version
	// behind once they go: churn must not grow the map.
	if err := cs.CoreV1().Services("kube-system").Delete(ctx, "dns", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor("dns deleted", func() bool { return ver("dns") == 0 })
	if err := cs.DiscoveryV1().EndpointSlices("kube-system").Delete(ctx, "b", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	gen := v.Generation()
	waitFor("slice b deleted", func() bool { return v.Generation() != gen })
	if ver("dns") != 0 {
		t.Errorf("the slice of a deleted Service recorded a version for it: %d", ver("dns"))
	}
	v.mu.Lock()
	kept := len(v.versions)
	v.mu.Unlock()
	if kept != 1 { // other
		t.Errorf("%d Service versions kept for 1 Service in the view", kept)
	}
}
