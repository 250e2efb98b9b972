package lockwatch

import (
	"testing"
	"time"
)

var t0 = time.Date(2026, 11, 23, 12, 0, 0, 0, time.UTC)

func at(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }

// TestTrackerReportsHoldsAsObserved: 2 s holds every 5 s are three holds
// of 2 s, not one of 12 s; each new hold asks for its holders once, each
// new waiter once.
func TestTrackerReportsHoldsAsObserved(t *testing.T) {
	tr := newTracker(8)
	if st := tr.observe(Sample{At: at(0), Continuous: true}); st.newHold || st.ended != nil {
		t.Fatalf("free: %+v", st)
	}
	var resolves int
	for cycle := 0; cycle < 3; cycle++ {
		base := cycle * 5000
		for ms := 0; ms <= 2000; ms += 100 {
			var waiters []int32
			if ms >= 500 {
				waiters = []int32{900 + int32(cycle)}
			}
			st := tr.observe(Sample{At: at(base + ms), LockPIDs: []int32{42}, WaiterPIDs: waiters, Continuous: true})
			if st.newHold {
				resolves++
				tr.setHolders([]Proc{{Pid: 42, Program: "python3"}})
			}
			for _, w := range st.newWaiters {
				tr.addWaiter(Proc{Pid: w, Program: "iptables-legacy-restore"})
			}
			if ms == 500 && len(st.newWaiters) != 1 || ms > 500 && len(st.newWaiters) != 0 {
				t.Fatalf("cycle %d ms %d: new waiters %v", cycle, ms, st.newWaiters)
			}
		}
		st := tr.observe(Sample{At: at(base + 2100), Continuous: true})
		if st.ended == nil || st.ended.Duration(at(0)) != 2100*time.Millisecond {
			t.Fatalf("cycle %d: ended %+v", cycle, st.ended)
		}
		tr.observe(Sample{At: at(base + 4900), Continuous: true})
	}
	if resolves != 3 {
		t.Errorf("resolves = %d, want 3", resolves)
	}
	hs := tr.holds(time.Time{})
	if len(hs) != 3 {
		t.Fatalf("holds = %d, want 3", len(hs))
	}
	for i, h := range hs {
		if !h.Exact || h.Program() != "python3" || h.Duration(at(99999)) != 2100*time.Millisecond ||
			len(h.Waiters) != 1 || h.Waiters[0].Pid != 900+int32(i) || h.MaxWaiting != 1 ||
			h.Waiters[0].Until.Sub(h.Waiters[0].Since) != 1500*time.Millisecond {
			t.Errorf("hold %d = %+v", i, h)
		}
	}
	if got := tr.holds(at(5000)); len(got) != 2 {
		t.Errorf("holds since 5s = %d, want 2", len(got))
	}
	hg := tr.histogram()[HistKey{Program: Other}]
	// 2.1 s: above the 2 s bucket, within 3 s.
	if hg.Count != 3 || hg.Counts[6] != 0 || hg.Counts[7] != 3 || hg.Sum < 6.29 || hg.Sum > 6.31 {
		t.Errorf("histogram = %+v", hg)
	}
}

// TestTrackerHolderChangeAndInexactStart: a hold seen first after a gap
// (not Continuous) or at the first sample is not exact; a different flock
// caller between two samples ends one hold and starts another.
func TestTrackerHolderChangeAndInexactStart(t *testing.T) {
	tr := newTracker(8)
	if st := tr.observe(Sample{At: at(0), LockPIDs: []int32{1}, Continuous: true}); !st.newHold {
		t.Fatal("no new hold")
	}
	st := tr.observe(Sample{At: at(10), LockPIDs: []int32{2}, Continuous: true})
	if !st.newHold || st.ended == nil || st.ended.Exact {
		t.Fatalf("holder change: %+v", st)
	}
	tr.observe(Sample{At: at(20)})
	if st := tr.observe(Sample{At: at(500), LockPIDs: []int32{3}}); !st.newHold {
		t.Fatal("no new hold after gap")
	}
	hs := tr.holds(time.Time{})
	if len(hs) != 3 || !hs[1].Exact || hs[2].Exact || !hs[2].End.IsZero() || hs[2].Program() != Unknown {
		t.Fatalf("holds = %+v", hs)
	}
	if hs[1].Duration(at(0)) != 10*time.Millisecond {
		t.Errorf("duration = %v", hs[1].Duration(at(0)))
	}
	if tr.histogram()[HistKey{Program: Unknown}].Count != 2 {
		t.Errorf("histogram %+v", tr.histogram())
	}
}

// TestTrackerBounded: the ring keeps the newest holds and a hold keeps at
// most MaxWaitersPerHold waiters.
func TestTrackerBounded(t *testing.T) {
	tr := newTracker(4)
	for i := 0; i < 10; i++ {
		tr.observe(Sample{At: at(i * 100), LockPIDs: []int32{int32(i + 1)}, Continuous: true})
		tr.setHolders([]Proc{{Pid: int32(i + 1), Program: "iptables"}, {Pid: 2}, {Pid: 3}, {Pid: 4}, {Pid: 5}, {Pid: 6}})
		tr.observe(Sample{At: at(i*100 + 50), Continuous: true})
	}
	hs := tr.holds(time.Time{})
	if len(hs) != 4 || hs[0].LockPIDs[0] != 7 || hs[3].LockPIDs[0] != 10 || len(hs[0].Holders) != maxHoldersPerHold {
		t.Fatalf("ring = %+v", hs)
	}
	if c := tr.histogram()[HistKey{Program: "iptables"}]; c.Count != 10 {
		t.Errorf("histogram count %d", c.Count)
	}
	many := make([]int32, 50)
	for i := range many {
		many[i] = int32(100 + i)
	}
	st := tr.observe(Sample{At: at(2000), LockPIDs: []int32{1}, WaiterPIDs: many, Continuous: true})
	if len(st.newWaiters) != MaxWaitersPerHold {
		t.Fatalf("new waiters %d", len(st.newWaiters))
	}
	for _, p := range many {
		tr.addWaiter(Proc{Pid: p})
	}
	cur := tr.holds(at(1999))
	if n := len(cur[len(cur)-1].Waiters); n != MaxWaitersPerHold || cur[len(cur)-1].MaxWaiting != 50 {
		t.Errorf("waiters kept %d, max %d", n, cur[len(cur)-1].MaxWaiting)
	}
}

func TestLabel(t *testing.T) {
	for in, want := range map[string]string{"iptables-legacy-restore": "iptables-legacy-restore", "python3": Other, Unknown: Unknown, "": Other} {
		if got := Label(in); got != want {
			t.Errorf("Label(%q) = %q, want %q", in, got, want)
		}
	}
	if h := (Hold{Holders: []Proc{{Program: "iptables-restore", Parent: "kube-proxy", KubeProxy: true}}}); !h.KubeProxy() {
		t.Error("kube-proxy child not kube-proxy's")
	}
}

// TestTrackerUnsampledUsesAndWaitStarts: an open and close with no hold
// sampled in between is one Unsampled hold (overlapping uses count once);
// opens around a sampled hold are not; a close without an open (opened
// before the watcher, or merged by inotify) is ignored. A waiter seen at the first sample was already waiting; one
// that appears later was seen to start.
func TestTrackerUnsampledUsesAndWaitStarts(t *testing.T) {
	tr := newTracker(8)
	tr.closed(at(0))
	tr.opened(at(1))
	tr.opened(at(2))
	tr.closed(at(3))
	tr.closed(at(4))
	tr.closed(at(5))
	tr.opened(at(10))
	tr.observe(Sample{At: at(11), LockPIDs: []int32{5}, WaiterPIDs: []int32{6}, Continuous: true})
	tr.addWaiter(Proc{Pid: 6})
	tr.observe(Sample{At: at(12), LockPIDs: []int32{5}, WaiterPIDs: []int32{6, 7}, Continuous: true})
	tr.addWaiter(Proc{Pid: 7})
	tr.closed(at(13))
	hs := tr.holds(time.Time{})
	if len(hs) != 2 || !hs[0].Unsampled || hs[0].Program() != Unsampled || hs[0].Duration(at(0)) != 2*time.Millisecond || hs[1].Unsampled {
		t.Fatalf("holds = %+v", hs)
	}
	if w := hs[1].Waiters; len(w) != 2 || w[0].SeenStart || !w[1].SeenStart {
		t.Errorf("waiters = %+v", w)
	}
	if tr.histogram()[HistKey{Program: Unsampled}].Count != 1 {
		t.Errorf("histogram %+v", tr.histogram())
	}
	// The first sample of all: a waiter there was already waiting.
	tr2 := newTracker(2)
	tr2.observe(Sample{At: at(0), LockPIDs: []int32{5}, WaiterPIDs: []int32{6}, Continuous: true})
	tr2.addWaiter(Proc{Pid: 6})
	if w := tr2.holds(time.Time{})[0].Waiters; len(w) != 1 || w[0].SeenStart {
		t.Errorf("first-sample waiter = %+v", w)
	}
}

// TestWindowOf: the likely causes' lock window groups holds by program,
// with counts, longest hold, latest pid and most waiters; unsampled uses
// and holds that ended before the window are left out.
func TestWindowOf(t *testing.T) {
	now := at(60000)
	hs := []Hold{
		{Start: at(0), End: at(2000), Holders: []Proc{{Pid: 1, Program: "python3"}}},
		{Start: at(30000), End: at(32000), Holders: []Proc{{Pid: 2, Program: "python3"}}, MaxWaiting: 2},
		{Start: at(40000), End: at(40001), Unsampled: true},
		{Start: at(50000), End: at(50300), Holders: []Proc{{Pid: 3, Program: "iptables-restore", KubeProxy: true}}},
		{Start: at(59000), LockPIDs: []int32{4}},
	}
	w := WindowOf(hs, now, 45*time.Second)
	if w.Window != 45*time.Second || w.Waiters != 2 || len(w.Holders) != 3 {
		t.Fatalf("window = %+v", w)
	}
	if h := w.Holders[0]; h.Program != "python3" || h.Holds != 1 || h.Longest != 2*time.Second || h.PID != 2 || h.KubeProxy {
		t.Errorf("python3 = %+v", h)
	}
	if h := w.Holders[1]; h.Program != Unknown || h.Longest != time.Second || h.PID != 4 {
		t.Errorf("ongoing = %+v", h)
	}
	if h := w.Holders[2]; !h.KubeProxy || h.Holds != 1 {
		t.Errorf("kube-proxy = %+v", h)
	}
}
