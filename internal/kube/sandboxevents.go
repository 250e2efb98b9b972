package kube

import (
	"context"
	"fmt"
	"sort"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/clock"

	"github.com/remediate-dev/remediate/internal/clip"
	"github.com/remediate-dev/remediate/internal/cluster"
)

// SandboxEvents is the cluster.PodEvents of one node: for a pod, one LIST
// of the core/v1 Events in its namespace with the field selector
// involvedObject.kind=Pod,involvedObject.uid=<uid> (fields the apiserver
// indexes for events: pkg/registry/core/event ToSelectableFields), a page
// limit, resourceVersion "0" (any version: the watch cache answers where
// the apiserver keeps one for Events; kube-apiserver's default has none,
// then etcd does) and a timeout. Only the kubelet's sandbox reasons of
// this node (source.host or reportingInstance) are kept.
//
// A pod's answer is kept for TTL (per pod UID): a pod stuck for hours is
// read once per TTL, not once per cycle, so N nodes with stuck pods cost
// the apiserver at most one LIST per stuck pod per TTL (`make bench-fleet`
// counts them). Errors are not kept. At most maxSandboxCache pods are
// kept; answers past their TTL are dropped at each read.
type SandboxEvents struct {
	cs      kubernetes.Interface
	node    string
	timeout time.Duration
	// TTL is how long a pod's Events are kept (NewSandboxEvents:
	// DefaultSandboxEventsTTL; <= 0: not kept).
	TTL time.Duration
	// Clock times the kept answers (NewSandboxEvents: the real clock).
	Clock clock.PassiveClock

	mu    sync.Mutex
	cache map[string]sandboxRead // pod UID -> its last read
}

// sandboxRead is one pod's Events as read at a time.
type sandboxRead struct {
	at     time.Time
	events []cluster.SandboxEvent
}

var _ cluster.PodEvents = (*SandboxEvents)(nil)

// Bounds of one pod's read.
const (
	// sandboxEventsPage is the LIST's limit: a pod has a handful of
	// Events (the kubelet's correlator aggregates repeats into one
	// Event's count).
	sandboxEventsPage = 100
	// maxEventMessage bounds a message kept.
	maxEventMessage = 1024
	// DefaultSandboxEventsTimeout bounds one LIST.
	DefaultSandboxEventsTimeout = 5 * time.Second
	// DefaultSandboxEventsTTL is how long a pod's Events are kept: the
	// pods read are stuck for minutes already (PodsNetworkNotReady's
	// minAge), and the kubelet's repeats only move an Event's count.
	DefaultSandboxEventsTTL = 5 * time.Minute
	// maxSandboxCache bounds the pods kept (a detector reads at most 50
	// a cycle).
	maxSandboxCache = 1000
)

// NewSandboxEvents returns the reader of node's pods' sandbox Events.
// timeout <= 0 is DefaultSandboxEventsTimeout.
func NewSandboxEvents(cs kubernetes.Interface, node string, timeout time.Duration) *SandboxEvents {
	if timeout <= 0 {
		timeout = DefaultSandboxEventsTimeout
	}
	return &SandboxEvents{cs: cs, node: node, timeout: timeout, TTL: DefaultSandboxEventsTTL, Clock: clock.RealClock{},
		cache: map[string]sandboxRead{}}
}

// SandboxEventsSelector is the field selector of a pod's Events.
func SandboxEventsSelector(uid string) string {
	return fields.AndSelectors(fields.OneTermEqualSelector("involvedObject.kind", "Pod"),
		fields.OneTermEqualSelector("involvedObject.uid", uid)).String()
}

// SandboxEvents implements cluster.PodEvents: the pod's kept answer when
// younger than TTL, else one LIST.
func (s *SandboxEvents) SandboxEvents(ctx context.Context, pod *cluster.Pod, max int) ([]cluster.SandboxEvent, error) {
	if pod.UID == "" {
		return nil, fmt.Errorf("pod %s has no UID", pod.Key())
	}
	out, ok := s.kept(pod.UID)
	if !ok {
		var err error
		if out, err = s.list(ctx, pod); err != nil {
			return nil, err
		}
		s.keep(pod.UID, out)
	}
	if max > 0 && len(out) > max {
		out = out[:max]
	}
	return append([]cluster.SandboxEvent(nil), out...), nil
}

func (s *SandboxEvents) list(ctx context.Context, pod *cluster.Pod) ([]cluster.SandboxEvent, error) {
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	l, err := s.cs.CoreV1().Events(pod.Namespace).List(ctx, metav1.ListOptions{FieldSelector: SandboxEventsSelector(pod.UID),
		Limit: sandboxEventsPage, ResourceVersion: "0"})
	if err != nil {
		return nil, fmt.Errorf("listing the events of pod %s: %w", pod.Key(), err)
	}
	return FilterSandboxEvents(l.Items, s.node), nil
}

// emptyTTLDivisor: an answer with no sandbox Event is kept for
// TTL/emptyTTLDivisor (1 minute by default), not TTL.
const emptyTTLDivisor = 5

// kept returns uid's answer if it is younger than TTL (TTL/emptyTTLDivisor
// for an answer with no Event), dropping every answer past it.
func (s *SandboxEvents) kept(uid string) ([]cluster.SandboxEvent, bool) {
	if s.TTL <= 0 {
		return nil, false
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.Clock.Now()
	for k, r := range s.cache {
		ttl := s.TTL
		if len(r.events) == 0 {
			// No sandbox Event yet: the kubelet writes its first one
			// seconds after the pod is bound, and a cause read before it
			// must not be missing for a whole TTL.
			ttl = s.TTL / emptyTTLDivisor
		}
		if age := now.Sub(r.at); age >= ttl || age < 0 {
			delete(s.cache, k)
		}
	}
	r, ok := s.cache[uid]
	return r.events, ok
}

func (s *SandboxEvents) keep(uid string, events []cluster.SandboxEvent) {
	if s.TTL <= 0 {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cache == nil {
		s.cache = map[string]sandboxRead{}
	}
	if len(s.cache) >= maxSandboxCache {
		return
	}
	s.cache[uid] = sandboxRead{at: s.Clock.Now(), events: events}
}

// FilterSandboxEvents keeps the sandbox Events of events written by node's
// kubelet (an Event without a host is kept: the selector already named
// the pod), newest first.
func FilterSandboxEvents(events []corev1.Event, node string) []cluster.SandboxEvent {
	var out []cluster.SandboxEvent
	for i := range events {
		e := &events[i]
		if e.Reason != cluster.ReasonFailedCreatePodSandBox && e.Reason != cluster.ReasonFailedKillPod {
			continue
		}
		host := e.Source.Host
		if host == "" {
			host = e.ReportingInstance
		}
		if host != "" && node != "" && host != node {
			continue
		}
		count := int(e.Count)
		if e.Series != nil && int(e.Series.Count) > count {
			count = int(e.Series.Count)
		}
		if count < 1 {
			count = 1
		}
		last := e.LastTimestamp.Time
		if e.Series != nil && e.Series.LastObservedTime.After(last) {
			last = e.Series.LastObservedTime.Time
		}
		if last.IsZero() {
			last = e.EventTime.Time
		}
		if last.IsZero() {
			last = e.CreationTimestamp.Time
		}
		out = append(out, cluster.SandboxEvent{Reason: e.Reason, Message: clip.String(e.Message, maxEventMessage), Count: count, Last: last, Host: host})
	}
	sort.SliceStable(out, func(i, j int) bool { return out[i].Last.After(out[j].Last) })
	return out
}
