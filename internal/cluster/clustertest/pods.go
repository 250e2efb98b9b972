package clustertest

import (
	"sort"
	"sync"
	"time"

	"github.com/remediate-dev/remediate/internal/cluster"
)

// Pods is a goroutine-safe, mutable cluster.PodView. Use NewPods.
type Pods struct {
	mu    sync.Mutex
	pods  map[string]cluster.Pod
	fresh cluster.Freshness
}

var _ cluster.PodView = (*Pods)(nil)

// NewPods returns an empty pod view that is synced and connected as of now.
func NewPods(now time.Time) *Pods {
	return &Pods{pods: map[string]cluster.Pod{}, fresh: cluster.Freshness{Synced: true, Connected: true, LastEvent: now}}
}

// Set adds or replaces pods (keyed by namespace/name).
func (f *Pods) Set(pods ...cluster.Pod) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, p := range pods {
		f.pods[p.Key()] = p
	}
}

// Delete removes a pod.
func (f *Pods) Delete(namespace, name string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.pods, key(namespace, name))
}

// SetFreshness replaces the reported freshness.
func (f *Pods) SetFreshness(fr cluster.Freshness) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.fresh = fr
}

// NodePods implements cluster.PodView.
func (f *Pods) NodePods() []cluster.Pod {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := make([]cluster.Pod, 0, len(f.pods))
	for _, p := range f.pods {
		out = append(out, p)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Key() < out[j].Key() })
	return out
}

// Freshness implements cluster.PodView.
func (f *Pods) Freshness() cluster.Freshness {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.fresh
}
