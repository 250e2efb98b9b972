package detect

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/remediate-dev/remediate/internal/finding"
	"github.com/remediate-dev/remediate/internal/kubeproxy"
	"github.com/remediate-dev/remediate/internal/lockwatch"
	"github.com/remediate-dev/remediate/internal/procs"
	"github.com/remediate-dev/remediate/policy"
)

// TestXtablesLockRestoreWaiterSingleLook (issue 15): one look at a lock
// held by a stuck process while a real iptables-legacy-restore has waited
// 25 s names the holder, the waiter and "held ≥ 25s" at once, although
// the hold itself was never watched; the watcher is started lazily.
func TestXtablesLockRestoreWaiterSingleLook(t *testing.T) {
	f := procs.NewFake(999)
	f.Add(fakeProc(100, 1, "stuck", procT0.Add(-time.Hour), "S", "stuck-agent"))
	f.Add(fakeProc(200, 50, "iptables-legacy", procT0.Add(-25*time.Second), "S", "iptables-legacy-restore", "-w"))
	f.SetLocks("/run/xtables.lock", procs.FileLocks{Held: true, Dev: "00:1a:5", LockPIDs: []int32{100},
		Holders: []procs.Process{f.MustGet(100)}, Waiters: []procs.Process{f.MustGet(200)}})
	n, _ := newIssue3Node(f)
	w := &lockwatch.Fake{}
	n.XtablesLockWatch = w
	d := newIssue3Detector(t, "XtablesLockContention", n, nil) // maxHold 30s, maxWaiters 3, maxRestoreWait 5s
	got, err := d.Detect(context.Background())
	if err != nil || len(got) != 1 {
		t.Fatalf("findings %+v %v", got, err)
	}
	m := got[0].Message
	for _, want := range []string{"held by stuck-agent (pid 100)", "held ≥ 25s", "iptables-legacy-restore pid 200 has waited 25s since it started", "1 waiting (max 3): iptables-legacy-restore (pid 200, 25s since it started)"} {
		if !strings.Contains(m, want) {
			t.Errorf("message lacks %q: %s", want, m)
		}
	}
	ev := got[0].Evidence
	// The holder's own hold was not watched: KillProcess's minHoldTime
	// sees 0, not the waiter's estimate.
	if ev["holdSeconds"] != 0.0 || ev["lockHeldAtLeastSeconds"] != 25.0 || ev["holdMeasured"] != "watched since first seen holding" {
		t.Errorf("evidence %v", ev)
	}
	if w.Starts() != 1 {
		t.Errorf("watcher started %d times", w.Starts())
	}
	// A restore that has waited less than maxRestoreWait: no finding; the
	// check says what it judged.
	f.Add(fakeProc(200, 50, "iptables-legacy", procT0.Add(-2*time.Second), "S", "iptables-legacy-restore", "-w"))
	f.SetLocks("/run/xtables.lock", procs.FileLocks{Held: true, LockPIDs: []int32{100},
		Holders: []procs.Process{f.MustGet(100)}, Waiters: []procs.Process{f.MustGet(200)}})
	if got, _ := d.Detect(context.Background()); len(got) != 0 {
		t.Fatalf("2s wait: %+v", got)
	}
	if j := d.(Judged).Judged(); !strings.Contains(j, "held ≥ 2s, 1 waiting") {
		t.Errorf("judged %q", j)
	}
}

// TestXtablesLockHoldsAsObserved: a program taking the lock for 2 s every
// 5 s, seen by the watcher, is never one continuous hold: the holder seen
// at a cycle has held it for as long as its current hold (2 s), and four
// such holds in the window (more than repeatMax 3) give the micro-outage
// finding naming the program, its count and longest hold, and kube-proxy's
// restore failures and queued sync in that window.
func TestXtablesLockHoldsAsObserved(t *testing.T) {
	f := procs.NewFake(999)
	f.Add(fakeProc(42, 1, "python3", procT0.Add(-time.Hour), "S", "python3", "hold.py"))
	n, clk := newIssue3Node(f)
	w := &lockwatch.Fake{}
	n.XtablesLockWatch = w
	kp := kubeproxy.NewFake(clk, 30*time.Second)
	n.KubeProxy = kp
	kpMetrics := func(failures int, queued, synced float64) string {
		return fmt.Sprintf(`# TYPE kubeproxy_sync_proxy_rules_iptables_restore_failures_total counter
kubeproxy_sync_proxy_rules_iptables_restore_failures_total{ip_family="IPv4"} %d
# TYPE kubeproxy_sync_proxy_rules_last_queued_timestamp_seconds gauge
kubeproxy_sync_proxy_rules_last_queued_timestamp_seconds{ip_family="IPv4"} %g
# TYPE kubeproxy_sync_proxy_rules_last_timestamp_seconds gauge
kubeproxy_sync_proxy_rules_last_timestamp_seconds{ip_family="IPv4"} %g
`, failures, queued, synced)
	}
	t0 := float64(procT0.Unix())
	kp.SetMetrics(kpMetrics(1, t0, t0))
	d := newIssue3Detector(t, "XtablesLockContention", n, nil)
	ctx := context.Background()
	py := lockwatch.Proc{Pid: 42, CreateTimeMs: procT0.Add(-time.Hour).UnixMilli(), Program: "python3"}
	at := func(s float64) time.Time { return procT0.Add(time.Duration(s * float64(time.Second))) }
	restore := lockwatch.Proc{Pid: 300, Program: "iptables-legacy-restore", Since: at(0.5), Until: at(1.9)}
	var holds []lockwatch.Hold
	for i := 0; i < 4; i++ {
		st := float64(i * 5)
		holds = append(holds, lockwatch.Hold{Start: at(st), End: at(st + 2), Exact: true, LockPIDs: []int32{42},
			Holders: []lockwatch.Proc{py}, Waiters: []lockwatch.Proc{restore}, MaxWaiting: 1})
	}
	// First cycle at 0 s: nothing seen yet.
	if got, err := d.Detect(ctx); err != nil || len(got) != 0 {
		t.Fatalf("t=0: %+v %v", got, err)
	}
	// At 11 s: the third hold goes on, python3 holds the lock now, for 1 s.
	clk.SetTime(at(11))
	cur := holds[2]
	cur.End = time.Time{}
	w.SetHolds(holds[0], holds[1], cur)
	f.SetLocks("/run/xtables.lock", procs.FileLocks{Held: true, LockPIDs: []int32{42}, Holders: []procs.Process{f.MustGet(42)}})
	got, err := d.Detect(ctx)
	if err != nil || len(got) != 0 {
		t.Fatalf("t=11: %+v %v", got, err)
	}
	if j := d.(Judged).Judged(); !strings.Contains(j, "held ≥ 1s, 0 waiting") || !strings.Contains(j, "3 holds ≥ 1s in the last 5m0s (at most 3), 3 holds in all, longest 2.0s by python3") {
		t.Errorf("judged %q", j)
	}
	// At 17.5 s: four holds of 2 s, the lock free, 3 restore failures and
	// a sync queued 4.5 s ago.
	clk.SetTime(at(17.5))
	w.SetHolds(holds...)
	f.SetLocks("/run/xtables.lock", procs.FileLocks{})
	kp.SetMetrics(kpMetrics(4, t0+13, t0+10))
	got, err = d.Detect(ctx)
	if err != nil || len(got) != 1 || got[0].Target != "xtables-lock/repeated-holds" || got[0].Severity != finding.Warning {
		t.Fatalf("t=17.5: %+v %v", got, err)
	}
	m := got[0].Message
	for _, want := range []string{"held 4 times for ≥ 1s in the last 5m0s (more than 3): python3 ×4 (longest 2.0s, pid 42)",
		"waiting meanwhile: iptables-legacy-restore ×1 (longest seen waiting 1.4s)",
		// kube-proxy is sampled from t=11 s, the first cycle with a hold.
		"kube-proxy in that window: IPv4 3 restore failures in 7s, IPv4 a sync queued 5s ago not done"} {
		if !strings.Contains(m, want) {
			t.Errorf("message lacks %q: %s", want, m)
		}
	}
	ev := got[0].Evidence
	if ev["holds"] != 4 || ev["longestSeconds"] != 2.0 || ev["kubeProxyRestoreFailuresIPv4"] != 3.0 || len(ev["recentHolds"].([]map[string]any)) != 4 {
		t.Errorf("evidence %v", ev)
	}
	// Five minutes later the holds have left the window.
	clk.SetTime(at(17.5 + 301))
	if got, _ := d.Detect(ctx); len(got) != 0 {
		t.Fatalf("after the window: %+v", got)
	}
}

// TestXtablesLockWatchedHoldIsTheCurrentOne: with the watcher, a holder
// seen at two cycles 10 s apart but re-taking the lock in between has held
// it only for its current hold: no maxHold finding, unlike the cross-cycle
// tracking without the watcher.
func TestXtablesLockWatchedHoldIsTheCurrentOne(t *testing.T) {
	f := procs.NewFake(999)
	f.Add(fakeProc(300, 1, "iptables", procT0.Add(-time.Hour), "S", "iptables-legacy", "-A", "X"))
	p := f.MustGet(300)
	f.SetLocks("/run/xtables.lock", procs.FileLocks{Held: true, LockPIDs: []int32{300}, Holders: []procs.Process{p}})
	me := lockwatch.Proc{Pid: 300, CreateTimeMs: p.CreateTimeMs, Program: "iptables-legacy"}
	for _, watched := range []bool{true, false} {
		n, clk := newIssue3Node(f)
		w := &lockwatch.Fake{}
		if watched {
			n.XtablesLockWatch = w
		}
		d := newIssue3Detector(t, "XtablesLockContention", n, func(pp any) { pp.(*XtablesLockContentionParams).MaxHold = policy.D(5 * time.Second) })
		if got, _ := d.Detect(context.Background()); len(got) != 0 {
			t.Fatalf("first look: %+v", got)
		}
		clk.Step(10 * time.Second)
		w.SetHolds(lockwatch.Hold{Start: procT0, End: procT0.Add(2 * time.Second), Holders: []lockwatch.Proc{me}, LockPIDs: []int32{300}},
			lockwatch.Hold{Start: procT0.Add(8 * time.Second), Holders: []lockwatch.Proc{me}, LockPIDs: []int32{300}})
		got, _ := d.Detect(context.Background())
		if watched && len(got) != 0 {
			t.Errorf("watched: reported %+v", got)
		}
		if !watched && (len(got) != 1 || got[0].Evidence["holdSeconds"] != 10.0) {
			t.Errorf("unwatched: %+v", got)
		}
	}
	// A watcher that cannot start: the cycle tracking, and the reason.
	n, clk := newIssue3Node(f)
	n.XtablesLockWatch = &lockwatch.Fake{StartErr: fmt.Errorf("no inotify")}
	d := newIssue3Detector(t, "XtablesLockContention", n, func(pp any) { pp.(*XtablesLockContentionParams).MaxHold = policy.D(5 * time.Second) })
	d.Detect(context.Background())
	clk.Step(6 * time.Second)
	got, _ := d.Detect(context.Background())
	if len(got) != 1 || got[0].Evidence["lockWatchError"] != "no inotify" {
		t.Errorf("watcher error: %+v", got)
	}
}

// TestXtablesLockRestoreHolderNamedWithAge: a restore the watcher has seen
// holding the lock for maxRestoreWait is reported at once, named with its
// age, well before maxHold.
func TestXtablesLockRestoreHolderNamedWithAge(t *testing.T) {
	f := procs.NewFake(999)
	f.Add(fakeProc(400, 50, "iptables-legacy", procT0.Add(-7*time.Second), "S", "iptables-legacy-restore", "-w"))
	p := f.MustGet(400)
	f.SetLocks("/run/xtables.lock", procs.FileLocks{Held: true, LockPIDs: []int32{400}, Holders: []procs.Process{p}})
	n, _ := newIssue3Node(f)
	w := &lockwatch.Fake{}
	n.XtablesLockWatch = w
	d := newIssue3Detector(t, "XtablesLockContention", n, nil)
	w.SetHolds(lockwatch.Hold{Start: procT0.Add(-4 * time.Second), Exact: true, LockPIDs: []int32{400},
		Holders: []lockwatch.Proc{{Pid: 400, CreateTimeMs: p.CreateTimeMs, Program: "iptables-legacy-restore"}}})
	if got, _ := d.Detect(context.Background()); len(got) != 0 {
		t.Fatalf("held 4s: %+v", got)
	}
	w.SetHolds(lockwatch.Hold{Start: procT0.Add(-6 * time.Second), Exact: true, LockPIDs: []int32{400},
		Holders: []lockwatch.Proc{{Pid: 400, CreateTimeMs: p.CreateTimeMs, Program: "iptables-legacy-restore"}}})
	got, _ := d.Detect(context.Background())
	if len(got) != 1 || !strings.Contains(got[0].Message, "held by iptables-legacy-restore running 7s (pid 400) for ≥ 6s (watched;") || got[0].Evidence["holdSeconds"] != 6.0 {
		t.Fatalf("held 6s: %+v", got)
	}
}

// Without fd access the holders are /proc/locks' callers: one created
// after the watched hold began is a reused PID (the caller exited, its
// child holds the lock), never named the holder (nor a target).
func TestXtablesLockReusedCallerPID(t *testing.T) {
	f := procs.NewFake(999)
	f.Add(fakeProc(100, 1, "iptables-legacy", procT0.Add(-10*time.Second), "S", "iptables-legacy-restore", "-w"))
	f.SetLocks("/run/xtables.lock", procs.FileLocks{Held: true, Dev: "00:1a:5", LockPIDs: []int32{100}, HoldersFrom: procs.HoldersFromProcLocks,
		Holders: []procs.Process{f.MustGet(100)}})
	n, _ := newIssue3Node(f)
	w := &lockwatch.Fake{}
	w.SetHolds(lockwatch.Hold{Start: procT0.Add(-time.Minute), Exact: true, LockPIDs: []int32{100}})
	n.XtablesLockWatch = w
	d := newIssue3Detector(t, "XtablesLockContention", n, nil)
	got, err := d.Detect(context.Background())
	if err != nil || len(got) != 1 || got[0].Target != unknownHolder || !strings.Contains(got[0].Message, "/proc/locks pid [100] now names a process created after the hold began") {
		t.Fatalf("findings %+v %v (judged %q)", got, err, d.(Judged).Judged())
	}
	// Created before the hold began: the holder.
	w.SetHolds(lockwatch.Hold{Start: procT0.Add(-5 * time.Second), Exact: true, LockPIDs: []int32{100}})
	f.SetLocks("/run/xtables.lock", procs.FileLocks{Held: true, Dev: "00:1a:5", LockPIDs: []int32{100}, HoldersFrom: procs.HoldersFromProcLocks,
		Holders: []procs.Process{f.MustGet(100)}})
	got, err = newIssue3Detector(t, "XtablesLockContention", n, func(p any) {
		p.(*XtablesLockContentionParams).MaxHold = policy.D(time.Second)
	}).Detect(context.Background())
	if err != nil || len(got) != 1 || got[0].Target != procs.Target(100, procT0.Add(-10*time.Second).UnixMilli()) {
		t.Fatalf("findings %+v %v", got, err)
	}
}
