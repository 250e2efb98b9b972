// Package cluster is the daemon's read-only view of the Services and
// EndpointSlices that matter to this node, and its freshness. Detectors that
// compare kernel state with the desired state (IPVS drift, stale conntrack
// entries) read it through View; actions that delete kernel state must first
// check Freshness and refuse on a stale or unsynced view. PodView is the
// watch of the pods bound to this node (pods.go), with the node agents
// (kube-proxy, the CNI agents) named by namespaces and label selectors.
package cluster

import (
	"fmt"
	"time"
)

// ServicePort is one port of a Service.
type ServicePort struct {
	Name     string `json:"name,omitempty"`
	Protocol string `json:"protocol"` // "TCP", "UDP", "SCTP"
	Port     int32  `json:"port"`
	NodePort int32  `json:"nodePort,omitempty"`
}

// Service is the part of a Service the detectors use.
type Service struct {
	Namespace string `json:"namespace"`
	Name      string `json:"name"`
	// ClusterIPs excludes "None" (headless services have none).
	ClusterIPs      []string      `json:"clusterIPs,omitempty"`
	ExternalIPs     []string      `json:"externalIPs,omitempty"`
	LoadBalancerIPs []string      `json:"loadBalancerIPs,omitempty"`
	Ports           []ServicePort `json:"ports"`
	// Type is spec.type ("ClusterIP" when empty). kube-proxy skips
	// ExternalName Services.
	Type string `json:"type,omitempty"`
	// ExternalPolicyLocal is spec.externalTrafficPolicy Local on a Service
	// reachable from outside (NodePort, LoadBalancer or external IPs), as
	// k8s.io/kubernetes/pkg/api/v1/service.ExternalPolicyLocal.
	ExternalPolicyLocal bool `json:"externalPolicyLocal,omitempty"`
	// InternalPolicyLocal is spec.internalTrafficPolicy Local.
	InternalPolicyLocal bool `json:"internalPolicyLocal,omitempty"`
	// ProxyName is the service.kubernetes.io/service-proxy-name label: a
	// Service with one belongs to another proxy and kube-proxy ignores it.
	ProxyName string `json:"proxyName,omitempty"`
	// Created is metadata.creationTimestamp (API server clock).
	Created time.Time `json:"created,omitempty"`
	// Changed is when the Service last changed as far as its own metadata
	// says: the newest managedFields time, at least Created (API server
	// clock). Zero when unknown.
	Changed time.Time `json:"changed,omitempty"`
}

// Endpoint is one address:port of a Service's EndpointSlices, flattened.
type Endpoint struct {
	Address  string `json:"address"`
	Port     int32  `json:"port"`
	Protocol string `json:"protocol"`
	// PortName matches ServicePort.Name.
	PortName string `json:"portName,omitempty"`
	NodeName string `json:"nodeName,omitempty"`
	// Conditions as in discovery/v1: a terminating endpoint may still be
	// serving, and kube-proxy keeps sending to it when no ready one exists.
	Ready       bool `json:"ready"`
	Serving     bool `json:"serving"`
	Terminating bool `json:"terminating"`
	// Hinted is true when the endpoint carries topology hints (forZones or
	// forNodes): kube-proxy may then program only a subset of the ready
	// endpoints on this node.
	Hinted bool `json:"hinted,omitempty"`
	// Secondary is true for the second and later addresses of one slice
	// endpoint: kube-proxy uses only addresses[0] (pkg/proxy
	// endpointslicecache.go).
	Secondary bool `json:"secondary,omitempty"`
	// SliceChanged is when the EndpointSlice holding this endpoint last
	// changed per its own metadata (newest managedFields time, at least its
	// creationTimestamp; API server clock). Zero when unknown.
	SliceChanged time.Time `json:"sliceChanged,omitempty"`
}

// Freshness says how much the view can be trusted.
type Freshness struct {
	// Synced is true once the initial LIST of every informer completed.
	Synced bool
	// LastEvent is when the view last received an event or resync.
	LastEvent time.Time
	// LastError is the most recent watch or list error, if any.
	LastError error
	// LastErrorTime is when LastError happened.
	LastErrorTime time.Time
	// Connected is false while the watch is failing.
	Connected bool
	// CurrentAt is the last time the view is known to have matched the
	// cluster: now while Connected, else the API server's last answer
	// before the failure. Zero when unknown.
	CurrentAt time.Time
	// MaxAge is how old a disconnected view may be before the checks that
	// compare the node with it skip (zero: they skip at once).
	MaxAge time.Duration
	// OverBudget, when not empty, says that the view holds less than the
	// cluster: it went past its memory budget and dropped content, so no
	// check or action may trust it. It names the budget.
	OverBudget string
}

// Age is how old the view is at now: zero while connected, else the time
// since CurrentAt (-1 when that is unknown).
func (f Freshness) Age(now time.Time) time.Duration {
	if f.Connected {
		return 0
	}
	if f.CurrentAt.IsZero() {
		return -1
	}
	if a := now.Sub(f.CurrentAt); a > 0 {
		return a
	}
	return 0
}

// Usable says whether checks that compare the node with the view may run
// at now. skip is why not (unsynced, over its memory budget, or
// disconnected for longer than MaxAge, with its age); note, when the view
// is disconnected but young enough, says how old the view they use is
// (findings carry it). Actions that delete kernel state do not use this:
// they want a connected view (guardrails.StaleReason).
func (f Freshness) Usable(now time.Time) (note, skip string) {
	switch {
	case !f.Synced:
		return "", "cluster view not synced yet (initial list incomplete)"
	case f.OverBudget != "":
		return "", f.OverBudget
	case f.Connected:
		return "", ""
	}
	why := "API server unreachable"
	if f.LastError != nil {
		why += ": " + f.LastError.Error()
	}
	age := f.Age(now)
	if age < 0 || age > f.MaxAge {
		if age < 0 {
			return "", fmt.Sprintf("cluster view disconnected, its age unknown (%s): the desired state may be stale", why)
		}
		return "", fmt.Sprintf("cluster view %s old, older than its %s limit (%s): the desired state may be stale",
			age.Round(time.Second), f.MaxAge, why)
	}
	return fmt.Sprintf("cluster view %s old (%s; used up to %s)", age.Round(time.Second), why, f.MaxAge), ""
}

// View is a read-only snapshot source. Implementations are goroutine-safe;
// returned slices must not be modified by callers.
type View interface {
	// Services returns every Service known to the view.
	Services() []Service
	// Endpoints returns the endpoints of a Service (all its slices merged).
	Endpoints(namespace, name string) []Endpoint
	// Freshness reports the view's sync state.
	Freshness() Freshness
}

// SliceTimes is implemented by views that know when a Service's
// EndpointSlices last changed per their own metadata (API server clock),
// including slices that no longer hold any endpoint (a Service scaled to
// zero), which Endpoint.SliceChanged cannot carry.
type SliceTimes interface {
	// EndpointsChanged returns the newest change time of the Service's
	// slices, zero when it has none or the time is unknown.
	EndpointsChanged(namespace, name string) time.Time
}

// Generational is implemented by views that count their changes: two
// reads at the same generation see the same Services and Endpoints (and
// SliceTimes), so what is derived from the view can be kept until the
// generation moves. A view bumps it after its contents changed, so a
// derivation keyed on it is at most one change-notification late.
type Generational interface {
	Generation() uint64
}

// ServiceVersions is implemented by views that also count each Service's
// changes: ServiceVersion moves after any change of the Service or of one
// of its EndpointSlices (deleted and created again included), so what is
// derived from one Service's objects can be kept while it does not move.
// 0 means unknown: never keep on it.
type ServiceVersions interface {
	Generational
	ServiceVersion(namespace, name string) uint64
}

// UsableForCluster is kube-proxy's rule for the endpoints of Cluster
// traffic policy (pkg/proxy/topology.go CategorizeEndpoints): the ready
// ones when any endpoint is ready (anyReady), else the serving terminating
// ones, so traffic keeps flowing during a rollout's last pod. Only an
// endpoint's first address counts (Secondary ones never do).
func UsableForCluster(e Endpoint, anyReady bool) bool {
	if e.Secondary {
		return false
	}
	if anyReady {
		return e.Ready
	}
	return e.Serving && e.Terminating
}
