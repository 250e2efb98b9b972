package fleetview_test

import (
	"context"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	testingclock "k8s.io/utils/clock/testing"

	"github.com/remediate-dev/remediate/internal/kube"
	"github.com/remediate-dev/remediate/internal/testing/controlplane"
	"github.com/remediate-dev/remediate/remediate"
	"github.com/remediate-dev/remediate/remediate/exporters/fleetview"
	"github.com/remediate-dev/remediate/remediate/exporters/kubeexporter"
)

type patchCounter struct {
	next    http.RoundTripper
	patches atomic.Int64
}

func (p *patchCounter) RoundTrip(r *http.Request) (*http.Response, error) {
	if r.Method == http.MethodPatch && strings.HasSuffix(r.URL.Path, "/status") {
		p.patches.Add(1)
	}
	return p.next.RoundTrip(r)
}

// Conditions that clear, on a real kube-apiserver: the daemon's reporter
// (kubeexporter, its default 5m heartbeat) driven through an hour of 30s
// cycles with nothing changing writes the node status 12 times (the first
// judgement and 11 heartbeats; 120 cycles: a write per cycle would be 10
// times as many), each refreshing lastHeartbeatTime. The view says True
// up to --stale-after (15m) after the last heartbeat and Unknown (stale,
// reported True) past it: the daemon is gone and nothing else rewrites the
// condition. The uninstall cleanup (kube.Cleanup, what the chart's hook
// runs) removes it: the view then says None.
func TestConditionHeartbeatAndStale(t *testing.T) {
	cp := controlplane.Start(t, controlplane.Options{})
	ctx := context.Background()
	const node = "fv-heartbeat"
	if _, err := cp.Client.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: node}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	pc := &patchCounter{}
	cfg := rest.CopyConfig(cp.RestConfig)
	cfg.WrapTransport = func(rt http.RoundTripper) http.RoundTripper { pc.next = rt; return pc }
	cs := kubernetes.NewForConfigOrDie(cfg)

	start := time.Now().Add(-2 * time.Hour).Truncate(time.Second)
	clk := testingclock.NewFakePassiveClock(start)
	r := kubeexporter.New(cs, kubeexporter.Options{Node: node, Clock: clk})
	const cycles = 120 // an hour of 30s cycles
	var heartbeats []time.Time
	for i := 0; i < cycles; i++ {
		if err := r.Report(ctx, &remediate.Report{}); err != nil {
			t.Fatal(err)
		}
		c := condition(t, cp.Client, node)
		if c == nil || c.Status != corev1.ConditionTrue {
			t.Fatalf("cycle %d: condition %+v", i, c)
		}
		if hb := c.LastHeartbeatTime.Time; len(heartbeats) == 0 || !hb.Equal(heartbeats[len(heartbeats)-1]) {
			heartbeats = append(heartbeats, hb)
		}
		clk.SetTime(clk.Now().Add(30 * time.Second))
	}
	if n := pc.patches.Load(); n != 12 {
		t.Errorf("%d node status writes in %d cycles, want 12 (one every 5m)", n, cycles)
	}
	if len(heartbeats) != 12 {
		t.Errorf("%d distinct heartbeats: %v", len(heartbeats), heartbeats)
	}
	for i := 1; i < len(heartbeats); i++ {
		if d := heartbeats[i].Sub(heartbeats[i-1]); d != 5*time.Minute {
			t.Errorf("heartbeat %d came %s after the previous", i, d)
		}
	}
	last := heartbeats[len(heartbeats)-1]
	view := func(at time.Time) fleetview.Node {
		t.Helper()
		f, _, err := fleetview.Collect(ctx, cp.Client, fleetview.CollectOptions{}, at)
		if err != nil {
			t.Fatal(err)
		}
		for _, n := range f.Nodes {
			if n.Name == node {
				return n
			}
		}
		t.Fatalf("no row for %s", node)
		return fleetview.Node{}
	}
	if n := view(last.Add(fleetview.DefaultStaleAfter)); n.Status != "True" || n.Stale {
		t.Errorf("at the stale limit: %+v", n)
	}
	if n := view(last.Add(fleetview.DefaultStaleAfter + time.Second)); n.Status != "Unknown" || !n.Stale || n.Reported != "True" {
		t.Errorf("past the stale limit: %+v", n)
	}
	if _, err := kube.Cleanup(ctx, cp.Client, node, kubeexporter.DefaultConditionType); err != nil {
		t.Fatal(err)
	}
	if n := view(time.Now()); n.Status != fleetview.StatusNone || n.Heartbeat != nil {
		t.Errorf("after cleanup: %+v", n)
	}
}

func condition(t *testing.T, cs kubernetes.Interface, node string) *corev1.NodeCondition {
	t.Helper()
	n, err := cs.CoreV1().Nodes().Get(context.Background(), node, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for i, c := range n.Status.Conditions {
		if string(c.Type) == kubeexporter.DefaultConditionType {
			return &n.Status.Conditions[i]
		}
	}
	return nil
}
