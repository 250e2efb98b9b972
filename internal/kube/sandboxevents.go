package kube

import (
	"context"
	"fmt"
	"sort"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/kubernetes"

	"github.com/remediate-dev/remediate/internal/clip"
	"github.com/remediate-dev/remediate/internal/cluster"
)

// SandboxEvents is the cluster.PodEvents of one node: for a pod, one LIST
// of the core/v1 Events in its namespace with the field selector
// involvedObject.kind=Pod,involvedObject.uid=<uid> (fields the apiserver
// indexes for events: pkg/registry/core/event ToSelectableFields), a page
// limit and a timeout. Only the kubelet's sandbox reasons of this node
// (source.host or reportingInstance) are kept.
type SandboxEvents struct {
	cs      kubernetes.Interface
	node    string
	timeout time.Duration
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
)

// NewSandboxEvents returns the reader of node's pods' sandbox Events.
// timeout <= 0 is DefaultSandboxEventsTimeout.
func NewSandboxEvents(cs kubernetes.Interface, node string, timeout time.Duration) *SandboxEvents {
	if timeout <= 0 {
		timeout = DefaultSandboxEventsTimeout
	}
	return &SandboxEvents{cs: cs, node: node, timeout: timeout}
}

// SandboxEventsSelector is the field selector of a pod's Events.
func SandboxEventsSelector(uid string) string {
	return fields.AndSelectors(fields.OneTermEqualSelector("involvedObject.kind", "Pod"),
		fields.OneTermEqualSelector("involvedObject.uid", uid)).String()
}

// SandboxEvents implements cluster.PodEvents.
func (s *SandboxEvents) SandboxEvents(ctx context.Context, pod *cluster.Pod, max int) ([]cluster.SandboxEvent, error) {
	if pod.UID == "" {
		return nil, fmt.Errorf("pod %s has no UID", pod.Key())
	}
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	l, err := s.cs.CoreV1().Events(pod.Namespace).List(ctx, metav1.ListOptions{FieldSelector: SandboxEventsSelector(pod.UID), Limit: sandboxEventsPage})
	if err != nil {
		return nil, fmt.Errorf("listing the events of pod %s: %w", pod.Key(), err)
	}
	out := FilterSandboxEvents(l.Items, s.node)
	if max > 0 && len(out) > max {
		out = out[:max]
	}
	return out, nil
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
