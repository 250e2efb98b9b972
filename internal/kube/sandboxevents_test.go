package kube

import (
	"context"
	"errors"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/remediate-dev/remediate/internal/cluster"
)

func TestFilterSandboxEvents(t *testing.T) {
	t0 := time.Date(2026, 11, 25, 12, 0, 0, 0, time.UTC)
	ev := func(reason, host string, count int32, last time.Time) corev1.Event {
		return corev1.Event{Reason: reason, Message: reason + " msg", Count: count, LastTimestamp: metav1.NewTime(last),
			Source: corev1.EventSource{Component: "kubelet", Host: host}}
	}
	series := ev(cluster.ReasonFailedKillPod, "", 0, time.Time{})
	series.ReportingInstance = "n1"
	series.Series = &corev1.EventSeries{Count: 7, LastObservedTime: metav1.NewMicroTime(t0.Add(time.Minute))}
	got := FilterSandboxEvents([]corev1.Event{
		ev(cluster.ReasonFailedCreatePodSandBox, "n1", 3, t0),
		ev(cluster.ReasonFailedCreatePodSandBox, "n2", 9, t0), // another node's kubelet
		ev("Scheduled", "n1", 1, t0),                          // not a sandbox reason
		ev(cluster.ReasonFailedCreatePodSandBox, "", 0, t0.Add(-time.Minute)),
		series,
	}, "n1")
	if len(got) != 3 || got[0].Reason != cluster.ReasonFailedKillPod || got[0].Count != 7 || got[0].Host != "n1" ||
		got[1].Count != 3 || got[2].Count != 1 || got[2].Host != "" {
		t.Fatalf("%+v", got)
	}
	if s := SandboxEventsSelector("u-1"); s != "involvedObject.kind=Pod,involvedObject.uid=u-1" {
		t.Errorf("selector %q", s)
	}
}

// TestSandboxEventsKeptForTTL: a pod's answer is kept per UID for TTL
// (one LIST per pod per TTL however many cycles ask), read again after
// it, never shared between pods, and an error is not kept. Counted on
// client-go's fake clientset (the real apiserver's audit count is
// internal/kube/e2e TestSandboxEventsKeptPerPod).
func TestSandboxEventsKeptForTTL(t *testing.T) {
	now := time.Date(2026, 11, 25, 12, 0, 0, 0, time.UTC)
	ev := func(ns, name, uid string) *corev1.Event {
		return &corev1.Event{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
			InvolvedObject: corev1.ObjectReference{Kind: "Pod", Name: "p", Namespace: ns, UID: types.UID(uid)},
			Reason:         cluster.ReasonFailedCreatePodSandBox, Message: "no IP addresses available", Count: 2,
			Source: corev1.EventSource{Component: "kubelet", Host: "n1"}, LastTimestamp: metav1.NewTime(now)}
	}
	// One pod per namespace: the fake clientset ignores field selectors.
	cs := fake.NewSimpleClientset(ev("a", "e1", "u1"), ev("b", "e2", "u2"))
	lists := 0
	fail := false
	cs.PrependReactor("list", "events", func(k8stesting.Action) (bool, runtime.Object, error) {
		lists++
		if fail {
			return true, nil, errors.New("apiserver down")
		}
		return false, nil, nil
	})
	clk := clocktesting.NewFakeClock(now)
	s := NewSandboxEvents(cs, "n1", 0)
	s.Clock = clk
	p1 := &cluster.Pod{Namespace: "a", Name: "p1", UID: "u1"}
	p2 := &cluster.Pod{Namespace: "b", Name: "p2", UID: "u2"}
	read := func(p *cluster.Pod) []cluster.SandboxEvent {
		t.Helper()
		got, err := s.SandboxEvents(context.Background(), p, 20)
		if err != nil {
			t.Fatal(err)
		}
		return got
	}
	for i := 0; i < 5; i++ {
		if got := read(p1); len(got) != 1 || got[0].Count != 2 {
			t.Fatalf("read %d: %+v", i, got)
		}
		clk.Step(time.Minute - time.Second)
	}
	if lists != 1 {
		t.Fatalf("5 reads of one pod within the TTL: %d LISTs, want 1", lists)
	}
	read(p2) // another pod: its own LIST
	if lists != 2 {
		t.Fatalf("a second pod: %d LISTs, want 2", lists)
	}
	clk.Step(DefaultSandboxEventsTTL)
	read(p1)
	if lists != 3 {
		t.Fatalf("after the TTL: %d LISTs, want 3", lists)
	}
	if len(s.cache) != 1 {
		t.Errorf("answers past the TTL are kept: %d", len(s.cache))
	}
	clk.Step(DefaultSandboxEventsTTL)
	fail = true
	if _, err := s.SandboxEvents(context.Background(), p2, 20); err == nil {
		t.Fatal("no error from a failing LIST")
	}
	fail = false
	read(p2)
	if lists != 5 {
		t.Fatalf("an error was kept: %d LISTs, want 5", lists)
	}
}

// TestSandboxEventsEmptyKeptBriefly: a pod read before the kubelet wrote
// its first sandbox Event (an empty answer) is read again after
// TTL/emptyTTLDivisor, not a whole TTL: the lane's IPAM test once read a
// just-created pod's Events before the kubelet's FailedCreatePodSandBox
// and missed it for five minutes.
func TestSandboxEventsEmptyKeptBriefly(t *testing.T) {
	now := time.Date(2026, 11, 25, 12, 0, 0, 0, time.UTC)
	cs := fake.NewSimpleClientset()
	lists := 0
	cs.PrependReactor("list", "events", func(k8stesting.Action) (bool, runtime.Object, error) {
		lists++
		return false, nil, nil
	})
	clk := clocktesting.NewFakeClock(now)
	s := NewSandboxEvents(cs, "n1", 0)
	s.Clock = clk
	p := &cluster.Pod{Namespace: "a", Name: "p", UID: "u"}
	read := func() int {
		t.Helper()
		got, err := s.SandboxEvents(context.Background(), p, 20)
		if err != nil {
			t.Fatal(err)
		}
		return len(got)
	}
	read()
	clk.Step(DefaultSandboxEventsTTL/emptyTTLDivisor - time.Second)
	read()
	if lists != 1 {
		t.Fatalf("an empty answer re-read within TTL/%d: %d LISTs", emptyTTLDivisor, lists)
	}
	if _, err := cs.CoreV1().Events("a").Create(context.Background(), &corev1.Event{ObjectMeta: metav1.ObjectMeta{Name: "e", Namespace: "a"},
		InvolvedObject: corev1.ObjectReference{Kind: "Pod", Name: "p", Namespace: "a", UID: "u"}, Reason: cluster.ReasonFailedCreatePodSandBox,
		Message: "no IP addresses available", Source: corev1.EventSource{Component: "kubelet", Host: "n1"}, LastTimestamp: metav1.NewTime(now)}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	clk.Step(2 * time.Second)
	if n := read(); n != 1 || lists != 2 {
		t.Fatalf("after TTL/%d: %d events, %d LISTs; want the kubelet's Event from a second LIST", emptyTTLDivisor, n, lists)
	}
	clk.Step(DefaultSandboxEventsTTL - time.Minute)
	if read(); lists != 2 {
		t.Fatalf("a pod with an Event re-read within TTL: %d LISTs", lists)
	}
}
