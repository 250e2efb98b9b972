package kube

import (
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/remediate-dev/remediate/internal/cluster"
)

// The informers' stores hold these compact, immutable records instead of
// the API objects: a Service is its cluster.Service, an EndpointSlice its
// service name, endpoints (address, node, three condition bits) and ports.
// That is about a fifth of the memory of even a stripped API object (whose
// ObjectMeta and Spec structs alone are ~600 bytes), and what the view
// returns needs no conversion.

// objMeta is the identity the store keys on (meta.Accessor reaches it
// through GetObjectMeta).
type objMeta struct {
	namespace, name, resourceVersion string
}

func (m objMeta) objectMeta() metav1.Object {
	return &metav1.ObjectMeta{Namespace: m.namespace, Name: m.name, ResourceVersion: m.resourceVersion}
}

type compactService struct {
	objMeta
	svc cluster.Service
}

// GetObjectMeta implements metav1.ObjectMetaAccessor (store keys).
func (c *compactService) GetObjectMeta() metav1.Object { return c.objectMeta() }

// GetObjectKind implements runtime.Object.
func (c *compactService) GetObjectKind() schema.ObjectKind { return schema.EmptyObjectKind }

// DeepCopyObject implements runtime.Object; records are immutable.
func (c *compactService) DeepCopyObject() runtime.Object { cp := *c; return &cp }

const (
	epReady uint8 = 1 << iota
	epServing
	epTerminating
	epHinted
	epSecondary
)

type compactEndpoint struct {
	address string
	node    string
	flags   uint8
}

type compactSlice struct {
	objMeta
	service   string
	changed   int64 // unix seconds of changedAt(ObjectMeta); 0 unknown
	endpoints []compactEndpoint
	ports     []cluster.ServicePort // NodePort unused
}

// GetObjectMeta implements metav1.ObjectMetaAccessor (store keys).
func (c *compactSlice) GetObjectMeta() metav1.Object { return c.objectMeta() }

// GetObjectKind implements runtime.Object.
func (c *compactSlice) GetObjectKind() schema.ObjectKind { return schema.EmptyObjectKind }

// DeepCopyObject implements runtime.Object; records are immutable.
func (c *compactSlice) DeepCopyObject() runtime.Object { cp := *c; return &cp }

// interner shares the backing arrays of strings that repeat across objects
// (namespaces, node names, port names, protocols).
var interner = struct {
	sync.Mutex
	m map[string]string
}{m: map[string]string{}}

func intern(s string) string {
	if s == "" {
		return ""
	}
	interner.Lock()
	defer interner.Unlock()
	if v, ok := interner.m[s]; ok {
		return v
	}
	if len(interner.m) > 100000 { // bound it; correctness does not depend on it
		interner.m = map[string]string{}
	}
	interner.m[s] = s
	return s
}

// Transform is the informers' cache.TransformFunc: each Service and
// EndpointSlice becomes a compact record holding only what the view uses,
// so the decoded API object (managedFields, annotations, labels, selectors,
// status, hints, target references) is garbage at once. Other objects (and
// records already transformed) pass unchanged.
func Transform(obj any) (any, error) {
	switch o := obj.(type) {
	case *corev1.Service:
		return toCompactService(o), nil
	case *discoveryv1.EndpointSlice:
		return toCompactSlice(o), nil
	default:
		return obj, nil
	}
}

func meta(m *metav1.ObjectMeta) objMeta {
	return objMeta{namespace: intern(m.Namespace), name: m.Name, resourceVersion: m.ResourceVersion}
}

// changedAt is when an object last changed according to its own metadata:
// the newest managedFields time (set by the API server when a manager adds,
// changes or removes a field), at least the creation time. Both are API
// server clock and have second resolution.
func changedAt(m *metav1.ObjectMeta) time.Time {
	t := m.CreationTimestamp.Time
	for _, f := range m.ManagedFields {
		if f.Time != nil && f.Time.After(t) {
			t = f.Time.Time
		}
	}
	return t
}

// externallyAccessible is k8s.io/kubernetes/pkg/api/v1/service.ExternallyAccessible.
func externallyAccessible(s *corev1.Service) bool {
	return s.Spec.Type == corev1.ServiceTypeLoadBalancer || s.Spec.Type == corev1.ServiceTypeNodePort ||
		(s.Spec.Type == corev1.ServiceTypeClusterIP && len(s.Spec.ExternalIPs) > 0)
}

func toCompactService(s *corev1.Service) *compactService {
	c := &compactService{objMeta: meta(&s.ObjectMeta)}
	out := cluster.Service{Namespace: c.namespace, Name: s.Name, Type: intern(string(s.Spec.Type)),
		ProxyName: s.Labels["service.kubernetes.io/service-proxy-name"],
		Created:   s.CreationTimestamp.Time, Changed: changedAt(&s.ObjectMeta)}
	out.ExternalPolicyLocal = externallyAccessible(s) && s.Spec.ExternalTrafficPolicy == corev1.ServiceExternalTrafficPolicyLocal
	out.InternalPolicyLocal = s.Spec.InternalTrafficPolicy != nil && *s.Spec.InternalTrafficPolicy == corev1.ServiceInternalTrafficPolicyLocal
	ips := s.Spec.ClusterIPs
	if len(ips) == 0 && s.Spec.ClusterIP != "" {
		ips = []string{s.Spec.ClusterIP}
	}
	for _, ip := range ips {
		if ip != "" && ip != corev1.ClusterIPNone {
			out.ClusterIPs = append(out.ClusterIPs, ip)
		}
	}
	if len(s.Spec.ExternalIPs) > 0 {
		out.ExternalIPs = append([]string(nil), s.Spec.ExternalIPs...)
	}
	for _, in := range s.Status.LoadBalancer.Ingress {
		// kube-proxy programs only VIP-mode ingress IPs (proxyutil.IsVIPMode).
		if in.IP != "" && (in.IPMode == nil || *in.IPMode == corev1.LoadBalancerIPModeVIP) {
			out.LoadBalancerIPs = append(out.LoadBalancerIPs, in.IP)
		}
	}
	out.Ports = make([]cluster.ServicePort, 0, len(s.Spec.Ports))
	for _, p := range s.Spec.Ports {
		proto := string(p.Protocol)
		if proto == "" {
			proto = string(corev1.ProtocolTCP)
		}
		out.Ports = append(out.Ports, cluster.ServicePort{Name: intern(p.Name), Protocol: intern(proto), Port: p.Port, NodePort: p.NodePort})
	}
	c.svc = out
	return c
}

func toCompactSlice(s *discoveryv1.EndpointSlice) *compactSlice {
	c := &compactSlice{objMeta: meta(&s.ObjectMeta), service: s.Labels[discoveryv1.LabelServiceName]}
	if t := changedAt(&s.ObjectMeta); !t.IsZero() {
		c.changed = t.Unix()
	}
	for _, p := range s.Ports {
		if p.Port == nil {
			continue // "all ports": not used by Services
		}
		proto := string(corev1.ProtocolTCP)
		if p.Protocol != nil {
			proto = string(*p.Protocol)
		}
		name := ""
		if p.Name != nil {
			name = *p.Name
		}
		c.ports = append(c.ports, cluster.ServicePort{Name: intern(name), Protocol: intern(proto), Port: *p.Port})
	}
	n := 0
	for _, e := range s.Endpoints {
		n += len(e.Addresses)
	}
	c.endpoints = make([]compactEndpoint, 0, n)
	for _, e := range s.Endpoints {
		// Conditions as kube-proxy reads them (pkg/proxy
		// endpointslicecache.go): nil ready and nil serving mean true.
		ready := e.Conditions.Ready == nil || *e.Conditions.Ready
		serving := e.Conditions.Serving == nil || *e.Conditions.Serving
		var f uint8
		if ready {
			f |= epReady
		}
		if serving {
			f |= epServing
		}
		if e.Conditions.Terminating != nil && *e.Conditions.Terminating {
			f |= epTerminating
		}
		node := ""
		if e.NodeName != nil {
			node = intern(*e.NodeName)
		}
		if e.Hints != nil && (len(e.Hints.ForZones) > 0 || len(e.Hints.ForNodes) > 0) {
			f |= epHinted
		}
		for i, a := range e.Addresses {
			ff := f
			if i > 0 {
				ff |= epSecondary
			}
			c.endpoints = append(c.endpoints, compactEndpoint{address: a, node: node, flags: ff})
		}
	}
	return c
}

func sliceServiceKey(obj any) ([]string, error) {
	s, ok := obj.(*compactSlice)
	if !ok || s.service == "" {
		return nil, nil
	}
	return []string{s.namespace + "/" + s.service}, nil
}
