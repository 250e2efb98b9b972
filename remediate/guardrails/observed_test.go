package guardrails

import (
	"testing"
	"time"

	coordv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	clocktesting "k8s.io/utils/clock/testing"
	"k8s.io/utils/ptr"
)

// TestObservedJudgesByWhatItSaw: a Lease is live for its duration after
// this process first saw its current renewal, whatever its renewTime says
// against the local clock: a renewTime in 2099 is free one duration after
// it was seen, and a renewTime a day behind the local clock (the local
// clock runs ahead) is live until then too. A new renewal starts over; a
// Lease this process wrote counts from before the write.
func TestObservedJudgesByWhatItSaw(t *testing.T) {
	clk := clocktesting.NewFakeClock(time.Date(2026, 11, 28, 3, 0, 0, 0, time.UTC))
	lease := func(holder string, renew time.Time) *coordv1.Lease {
		mt := metav1.NewMicroTime(renew)
		return &coordv1.Lease{ObjectMeta: metav1.ObjectMeta{Namespace: "remediate", Name: "remediate-budget-0"},
			Spec: coordv1.LeaseSpec{HolderIdentity: ptr.To(holder), RenewTime: &mt, LeaseDurationSeconds: ptr.To(int32(60))}}
	}
	for _, tc := range []struct {
		name  string
		renew time.Time
	}{
		{"renewed in 2099", time.Date(2099, 1, 1, 0, 0, 0, 0, time.UTC)},
		{"this clock a day ahead of the writer's", clk.Now().Add(-24 * time.Hour)},
		{"same clocks", clk.Now()},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := NewObserved(clk)
			l := lease("a", tc.renew)
			if o.Free(l) {
				t.Fatal("free at first sight")
			}
			clk.Step(59 * time.Second)
			if o.Free(l) {
				t.Fatal("free 59s after first sight (duration 60s)")
			}
			// Renewed: live for another duration from now.
			l = lease("a", tc.renew.Add(time.Second))
			clk.Step(30 * time.Second)
			if o.Free(l) {
				t.Fatal("a renewal seen now is free")
			}
			clk.Step(59 * time.Second)
			if o.Free(l) {
				t.Fatal("free 59s after the renewal was seen")
			}
			clk.Step(time.Second)
			if !o.Free(l) {
				t.Fatal("not free one duration after the last renewal was seen")
			}
		})
	}
	o := NewObserved(clk)
	if !o.Free(&coordv1.Lease{}) || !o.Free(lease("", clk.Now())) {
		t.Error("a Lease without a holder is not free")
	}
	mine := lease("me", clk.Now())
	o.Wrote(mine, clk.Now().Add(-10*time.Second))
	clk.Step(50 * time.Second)
	if !o.Free(mine) {
		t.Error("own Lease counted from after its write, not from before it")
	}
}
