package kubeexporter

import (
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
)

func TestNextCondition(t *testing.T) {
	t0 := time.Date(2026, 11, 21, 12, 0, 0, 0, time.UTC)
	h := Hysteresis{ProblemAfter: time.Minute, ClearAfter: 5 * time.Minute}
	type step struct {
		at      time.Duration
		problem bool
		reason  string
		status  corev1.ConditionStatus
		write   bool
	}
	for _, tc := range []struct {
		name  string
		steps []step
	}{
		{"first clear cycle sets True", []step{{0, false, "", corev1.ConditionTrue, true}, {time.Minute, false, "", corev1.ConditionTrue, false}}},
		{"first problem waits ProblemAfter", []step{
			{0, true, "A", corev1.ConditionStatus(""), false},
			{30 * time.Second, true, "A", "", false},
			{time.Minute, true, "A", corev1.ConditionFalse, true},
			{2 * time.Minute, true, "A", corev1.ConditionFalse, false},
			{3 * time.Minute, true, "B", corev1.ConditionFalse, true}, // reason changed
		}},
		{"flapping problem never turns False", []step{
			{0, false, "", corev1.ConditionTrue, true},
			{10 * time.Second, true, "A", corev1.ConditionTrue, false},
			{50 * time.Second, false, "", corev1.ConditionTrue, false},
			{60 * time.Second, true, "A", corev1.ConditionTrue, false},
			{100 * time.Second, false, "", corev1.ConditionTrue, false},
		}},
		{"clear waits ClearAfter, a relapse restarts it", []step{
			{0, false, "", corev1.ConditionTrue, true},
			{time.Minute, true, "A", corev1.ConditionTrue, false},
			{2 * time.Minute, true, "A", corev1.ConditionFalse, true},
			{3 * time.Minute, false, "", corev1.ConditionFalse, false},
			{7 * time.Minute, true, "A", corev1.ConditionFalse, false},
			{8 * time.Minute, false, "", corev1.ConditionFalse, false},
			{12 * time.Minute, false, "", corev1.ConditionFalse, false},
			{13 * time.Minute, false, "", corev1.ConditionTrue, true},
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var s ConditionState
			for i, st := range tc.steps {
				var w bool
				s, w = NextCondition(s, st.problem, st.reason, "key "+st.reason, "msg "+st.reason, t0.Add(st.at), h)
				if s.Status != st.status || w != st.write {
					t.Fatalf("step %d (%v): status %q write %v, want %q %v", i, st.at, s.Status, w, st.status, st.write)
				}
			}
		})
	}
}
