package detect

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	clocktesting "k8s.io/utils/clock/testing"

	"github.com/remediate-dev/remediate/internal/cluster"
	"github.com/remediate-dev/remediate/internal/cluster/clustertest"
)

// fakePodEvents serves sandbox Events by pod UID and counts the reads.
type fakePodEvents struct {
	byUID map[string][]cluster.SandboxEvent
	err   error
	reads int
}

func (f *fakePodEvents) SandboxEvents(_ context.Context, p *cluster.Pod, max int) ([]cluster.SandboxEvent, error) {
	f.reads++
	if f.err != nil {
		return nil, f.err
	}
	evs := f.byUID[p.UID]
	if len(evs) > max {
		evs = evs[:max]
	}
	return evs, nil
}

const ipamMsg = `Failed to create pod sandbox: rpc error: code = Unknown desc = failed to setup network for sandbox "5d1b0b4f0a9e8c2a3f7b6d5e4c3b2a1908f7e6d5c4b3a29180f7e6d5c4b3a291": plugin type="bridge" failed (add): failed to allocate for range 0: no IP addresses available in range set: 10.244.0.2-10.244.0.3`

// TestPodsNetworkNotReadyReasons: the stuck pods' sandbox Events are read
// (bounded by maxEventPods), classified, and the finding carries the top
// kind, its count, one sanitised message and the correlated detector;
// unreadable Events never stop the finding; maxEventPods 0 reads none.
func TestPodsNetworkNotReadyReasons(t *testing.T) {
	ctx := context.Background()
	clk := clocktesting.NewFakePassiveClock(podsT0)
	view := clustertest.NewPods(podsT0)
	n := podsNode(view, clk)
	evs := &fakePodEvents{byUID: map[string][]cluster.SandboxEvent{}}
	n.PodEvents = evs
	d := newIssue3Detector(t, "PodsNetworkNotReady", n, nil)
	for i := 0; i < 12; i++ {
		name := fmt.Sprintf("p%02d", i)
		view.Set(stuck(name, podsT0.Add(-time.Duration(10+i)*time.Minute)))
		evs.byUID["uid-"+name] = []cluster.SandboxEvent{{Reason: cluster.ReasonFailedCreatePodSandBox, Message: ipamMsg, Count: 3, Last: podsT0}}
	}
	evs.byUID["uid-p11"] = append(evs.byUID["uid-p11"], cluster.SandboxEvent{Reason: cluster.ReasonFailedCreatePodSandBox,
		Message: "Failed to create pod sandbox: rpc error: code = DeadlineExceeded desc = context deadline exceeded", Count: 100, Last: podsT0})
	fs, err := d.Detect(ctx)
	if err != nil || len(fs) != 1 {
		t.Fatalf("%v %v", fs, err)
	}
	sf, ok := fs[0].Evidence["sandboxFailures"].(map[string]any)
	if !ok {
		t.Fatalf("evidence %v", fs[0].Evidence["sandboxFailures"])
	}
	// 10 pods read (the 10 oldest), 30 IPAM failures; 100 unknown do not
	// hide the known kind.
	if evs.reads != 10 || sf["topKind"] != "IPAMExhausted" || sf["count"] != 30 || sf["correlatesWith"] != "HostLocalIPAM" ||
		sf["podsRead"] != 10 || sf["kinds"].(map[string]int)["Unknown"] != 100 {
		t.Errorf("reads %d, evidence %v", evs.reads, sf)
	}
	if m := sf["message"].(string); strings.Contains(m, "Failed to create pod sandbox") || !strings.Contains(m, "no IP addresses available in range set") || strings.Contains(m, "a291") {
		t.Errorf("message %q", m)
	}
	if !strings.Contains(fs[0].Message, "sandbox failures: IPAMExhausted x30 in the events of 10 pods (see HostLocalIPAM)") {
		t.Errorf("message %q", fs[0].Message)
	}
	// Unreadable: said, the finding stays.
	evs.err, evs.reads = errors.New("events is forbidden"), 0
	fs, err = d.Detect(ctx)
	if err != nil || len(fs) != 1 || !strings.Contains(fmt.Sprint(fs[0].Evidence["sandboxFailures"]), "events is forbidden") {
		t.Fatalf("unreadable: %+v %v", fs, err)
	}
	// No Events: said.
	evs.err, evs.byUID = nil, nil
	fs, _ = d.Detect(ctx)
	if !strings.Contains(fmt.Sprint(fs[0].Evidence["sandboxFailures"]), "no FailedCreatePodSandBox or FailedKillPod event for the 10 pods read") {
		t.Errorf("none: %v", fs[0].Evidence["sandboxFailures"])
	}
	// Off.
	d = newIssue3Detector(t, "PodsNetworkNotReady", n, func(p any) { p.(*PodsNetworkNotReadyParams).MaxEventPods = 0 })
	evs.reads = 0
	fs, _ = d.Detect(ctx)
	if _, has := fs[0].Evidence["sandboxFailures"]; has || evs.reads != 0 {
		t.Errorf("off: %d reads, %v", evs.reads, fs[0].Evidence["sandboxFailures"])
	}
}
