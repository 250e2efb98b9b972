package kube

import (
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

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
