package detect

import (
	"context"
	"fmt"
	"io/fs"
	"reflect"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/remediate-dev/remediate/internal/finding"
	"github.com/remediate-dev/remediate/internal/node"
	"github.com/remediate-dev/remediate/internal/procs"
	"github.com/remediate-dev/remediate/policy"
)

var procT0 = time.Date(2026, 11, 21, 12, 0, 0, 0, time.UTC)

func newIssue3Node(p *procs.Fake) (*node.Node, *clocktesting.FakeClock) {
	clk := clocktesting.NewFakeClock(procT0)
	n := &node.Node{Name: "node1", ProcRoot: "/proc", XtablesLock: "/run/xtables.lock", Clock: clk, Log: zap.NewNop()}
	if p != nil {
		p.NetNS = testNetNS
		n.Procs = p
	}
	return n, clk
}

// testNetNS is the daemon's (the node's) network namespace in the fakes.
const testNetNS = "net:[4026531840]"

// fakeProc is a process in the node's network namespace with
// CAP_NET_ADMIN; its executable is xtables-legacy-multi when argv[0]
// names an iptables program, /usr/bin/<name> otherwise.
func fakeProc(pid, ppid int32, comm string, started time.Time, state string, argv ...string) procs.FakeProcess {
	exe := "/usr/bin/" + procs.ArgvName(argv)
	if strings.Contains(procs.ArgvName(argv), "iptables") {
		exe = "/usr/sbin/xtables-legacy-multi"
	}
	return procs.FakeProcess{Process: procs.Process{Pid: pid, PPid: ppid, Comm: comm, Cmdline: argv, CreateTimeMs: started.UnixMilli(), State: state,
		Exe: exe, CapEff: 0x1ffffffffff, NetNS: testNetNS}}
}

func newIssue3Detector(t testing.TB, typ string, n *node.Node, set func(any)) Detector {
	t.Helper()
	ty, ok := Lookup(typ)
	if !ok {
		t.Fatalf("%s not registered", typ)
	}
	p := ty.NewParams()
	if set != nil {
		set(p)
	}
	if v, ok := p.(policy.Validator); ok {
		if errs := v.Validate(); len(errs) > 0 {
			t.Fatalf("defaults invalid: %v", errs)
		}
	}
	d, err := ty.New(p, n)
	if err != nil {
		t.Fatal(err)
	}
	return d
}

func TestHungIPTablesRestore(t *testing.T) {
	f := procs.NewFake(999)
	f.Add(fakeProc(50, 1, "kube-proxy", procT0.Add(-time.Hour), "S", "/usr/local/bin/kube-proxy", "--config=/c"))
	f.Add(fakeProc(100, 1, "flock", procT0.Add(-10*time.Minute), "S", "flock", "/run/xtables.lock", "sleep", "300"))
	f.Add(fakeProc(101, 100, "sleep", procT0.Add(-10*time.Minute), "S", "sleep", "300"))
	// comm is truncated; argv[0] is what matches.
	f.Add(fakeProc(200, 50, "iptables-legacy", procT0.Add(-5*time.Minute), "S", "iptables-legacy-restore", "-w", "5", "-W", "100000", "--noflush", "--counters"))
	f.Add(fakeProc(201, 50, "iptables-nft-re", procT0.Add(-3*time.Minute), "D", "/usr/sbin/iptables-nft-restore", "--noflush"))
	f.Add(fakeProc(202, 50, "iptables-legacy", procT0.Add(-10*time.Second), "S", "iptables-legacy-restore", "-w", "5")) // too young
	f.Add(fakeProc(203, 1, "iptables-legacy", procT0.Add(-10*time.Minute), "S", "iptables-legacy", "-L"))               // not a restore
	f.Add(fakeProc(204, 1, "iptables-restor", procT0.Add(-10*time.Minute), "S", "/opt/iptables-restore-wrapper", "x"))  // not in names
	f.SetLocks("/run/xtables.lock", procs.FileLocks{Held: true, Dev: "00:1a:5", LockPIDs: []int32{100},
		Holders: []procs.Process{f.MustGet(100), f.MustGet(101)},
		Waiters: []procs.Process{f.MustGet(200)}})
	n, _ := newIssue3Node(f)
	d := newIssue3Detector(t, "HungIPTablesRestore", n, nil)
	got, err := d.Detect(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 {
		t.Fatalf("got %d findings: %+v", len(got), got)
	}
	byTarget := map[string]finding.Finding{}
	for _, g := range got {
		byTarget[g.Target] = g
	}
	w := byTarget[procs.Target(200, procT0.Add(-5*time.Minute).UnixMilli())]
	if w.Severity != finding.Critical || w.Evidence["waitsOnXtablesLock"] != true || w.Evidence["parentName"] != "kube-proxy" || w.Evidence["ppid"] != int32(50) {
		t.Errorf("waiting restore = %+v", w)
	}
	if w.Evidence["cmdline"] != "iptables-legacy-restore -w 5 -W 100000 --noflush --counters" || w.Evidence["ageSeconds"] != 300.0 || w.Evidence["state"] != "S" {
		t.Errorf("evidence = %v", w.Evidence)
	}
	if !strings.Contains(w.Message, "held by flock (pid 100), sleep (pid 101)") {
		t.Errorf("message = %q", w.Message)
	}
	hs, _ := w.Evidence["xtablesLockHolders"].([]map[string]any)
	if len(hs) != 2 || hs[1]["name"] != "sleep" {
		t.Errorf("holders evidence = %v", w.Evidence["xtablesLockHolders"])
	}
	if w.Evidence["holdsXtablesLock"] != false {
		t.Errorf("waiter marked as holder: %v", w.Evidence)
	}
	dd := byTarget[procs.Target(201, procT0.Add(-3*time.Minute).UnixMilli())]
	if dd.Severity != finding.Critical || dd.Evidence["blocked"] != true || dd.Evidence["waitsOnXtablesLock"] != false {
		t.Errorf("D-state restore = %+v", dd)
	}

	// Lock-free node, a process that exited: nothing left but the D one.
	f.Remove(200)
	f.SetLocks("/run/xtables.lock", procs.FileLocks{})
	got, err = d.Detect(context.Background())
	if err != nil || len(got) != 1 || got[0].Evidence["pid"] != int32(201) {
		t.Fatalf("after exit: %+v %v", got, err)
	}

	// No adapter: skipped with the recorded reason.
	n2 := &node.Node{Clock: n.Clock, Unavailable: map[string]string{"procs": "proc root /host/proc not mounted"}}
	_, err = newIssue3Detector(t, "HungIPTablesRestore", n2, nil).Detect(context.Background())
	if r, ok := finding.IsSkip(err); !ok || !strings.Contains(r, "not mounted") {
		t.Errorf("nil adapter: %v", err)
	}
}

func TestXtablesLockContentionTracksHoldAcrossCycles(t *testing.T) {
	f := procs.NewFake(999)
	f.Add(fakeProc(100, 1, "flock", procT0.Add(-time.Hour), "S", "flock", "/run/xtables.lock", "sleep", "300"))
	f.Add(fakeProc(101, 100, "sleep", procT0.Add(-time.Hour), "S", "sleep", "300"))
	f.Add(fakeProc(200, 50, "iptables-legacy", procT0, "S", "iptables-legacy-restore", "-w"))
	holders := []procs.Process{f.MustGet(100), f.MustGet(101)}
	f.SetLocks("/run/xtables.lock", procs.FileLocks{Held: true, Dev: "00:1a:5", LockPIDs: []int32{100}, Holders: holders,
		Waiters: []procs.Process{f.MustGet(200)}})
	n, clk := newIssue3Node(f)
	d := newIssue3Detector(t, "XtablesLockContention", n, func(p any) {
		p.(*XtablesLockContentionParams).MaxHold = policy.D(30 * time.Second)
		p.(*XtablesLockContentionParams).MaxRestoreWait = policy.D(time.Hour) // see TestXtablesLockRestoreWaiterSingleLook
	})
	ctx := context.Background()
	got, err := d.Detect(ctx)
	if err != nil || len(got) != 0 {
		t.Fatalf("first sight, one waiter: %+v %v", got, err)
	}
	clk.Step(20 * time.Second)
	if got, _ := d.Detect(ctx); len(got) != 0 {
		t.Fatalf("held 20s: %+v", got)
	}
	clk.Step(15 * time.Second)
	got, err = d.Detect(ctx)
	if err != nil || len(got) != 2 {
		t.Fatalf("held 35s: %+v %v", got, err)
	}
	if got[0].Target != holders[0].Target() || got[1].Target != holders[1].Target() {
		t.Errorf("targets = %s %s", got[0].Target, got[1].Target)
	}
	ev := got[1].Evidence
	if ev["holdSeconds"] != 35.0 || ev["name"] != "sleep" || ev["waiterCount"] != 1 || ev["pid"] != int32(101) {
		t.Errorf("evidence = %v", ev)
	}
	ws := ev["waiters"].([]map[string]any)
	if len(ws) != 1 || ws[0]["name"] != "iptables-legacy-restore" {
		t.Errorf("waiters = %v", ws)
	}
	if !strings.Contains(got[1].Message, "held by sleep (pid 101) for ≥ 35s (seen holding at every cycle; max 30s); held ≥ 35s (its oldest waiter iptables-legacy-restore pid 200 has waited 35s since it started); 1 waiting (max 3)") {
		t.Errorf("message = %q", got[1].Message)
	}

	// The lock passes to a new holder: its hold time starts again.
	f.Remove(100)
	f.Remove(101)
	f.Add(fakeProc(300, 1, "iptables", procT0, "S", "iptables", "-A", "X"))
	f.SetLocks("/run/xtables.lock", procs.FileLocks{Held: true, Holders: []procs.Process{f.MustGet(300)}})
	if got, _ := d.Detect(ctx); len(got) != 0 {
		t.Fatalf("new holder flagged at once: %+v", got)
	}
	clk.Step(31 * time.Second)
	if got, _ := d.Detect(ctx); len(got) != 1 || got[0].Evidence["holdSeconds"] != 31.0 {
		t.Fatalf("new holder after 31s: %+v", got)
	}
	// Released: state forgotten; re-taken later starts from zero.
	f.SetLocks("/run/xtables.lock", procs.FileLocks{})
	if got, _ := d.Detect(ctx); len(got) != 0 {
		t.Fatalf("free lock: %+v", got)
	}
	f.SetLocks("/run/xtables.lock", procs.FileLocks{Held: true, Holders: []procs.Process{f.MustGet(300)}})
	if got, _ := d.Detect(ctx); len(got) != 0 {
		t.Fatalf("re-taken lock: %+v", got)
	}
}

func TestXtablesLockContentionWaitersAndInvisibleHolder(t *testing.T) {
	f := procs.NewFake(999)
	var waiters []procs.Process
	for i := int32(0); i < 3; i++ {
		f.Add(fakeProc(200+i, 50, "iptables-legacy", procT0, "S", "iptables-legacy-restore", "-w", "5"))
		waiters = append(waiters, f.MustGet(200+i))
	}
	f.SetLocks("/run/xtables.lock", procs.FileLocks{Held: true, LockPIDs: []int32{0}, Waiters: waiters})
	n, _ := newIssue3Node(f)
	d := newIssue3Detector(t, "XtablesLockContention", n, nil) // maxWaiters 3
	got, err := d.Detect(context.Background())
	if err != nil || len(got) != 1 {
		t.Fatalf("got %+v %v", got, err)
	}
	if got[0].Target != "xtables-lock/holder-not-visible" || got[0].Evidence["waiterCount"] != 3 || !strings.Contains(got[0].Message, "not visible") {
		t.Errorf("finding = %+v", got[0])
	}
	n.XtablesLock = ""
	if _, err := d.Detect(context.Background()); err == nil {
		t.Error("no lock path: want skip")
	} else if _, ok := finding.IsSkip(err); !ok {
		t.Errorf("no lock path: %v", err)
	}
}

func TestProcessParamsValidate(t *testing.T) {
	cases := []struct {
		p    policy.Validator
		want []string
	}{
		{&HungIPTablesRestoreParams{Names: nil, MinAge: policy.D(0)}, []string{"names", "programs", "minAge"}},
		{&HungIPTablesRestoreParams{Names: []string{"ok", "", "/usr/sbin/x"}, Programs: []string{"nft"}, MinAge: policy.D(time.Second)}, []string{"names[1]", "names[2]"}},
		{&HungIPTablesRestoreParams{Names: []string{"ok"}, Programs: []string{"/usr/sbin/nft"}, MinAge: policy.D(time.Second)}, []string{"programs[0]"}},
		{&XtablesLockContentionParams{MaxHold: policy.D(-1), MaxWaiters: 0, MaxRestoreWait: policy.D(time.Second), RepeatHold: policy.D(time.Second), RepeatWindow: policy.D(time.Minute)}, []string{"maxHold", "maxWaiters"}},
		{&XtablesLockContentionParams{MaxHold: policy.D(1), MaxWaiters: 1, RepeatMax: -1, RepeatHold: policy.D(time.Minute), RepeatWindow: policy.D(time.Second)}, []string{"maxRestoreWait", "repeatMax", "repeatWindow"}},
	}
	for _, c := range cases {
		var fields []string
		for _, e := range c.p.Validate() {
			fields = append(fields, e.Field)
		}
		if !reflect.DeepEqual(fields, c.want) {
			t.Errorf("%T: fields %v, want %v", c.p, fields, c.want)
		}
	}
}

// TestHungIPTablesRestoreImpostors: a name match is not enough. Another
// executable, no CAP_NET_ADMIN, or another network namespace without the
// node's lock make an info finding saying why; the real restore next to
// them stays critical.
func TestHungIPTablesRestoreImpostors(t *testing.T) {
	f := procs.NewFake(999)
	old := procT0.Add(-10 * time.Minute)
	sleeper := fakeProc(300, 1, "sleep", old, "D", "iptables-restore", "1000")
	sleeper.Exe = "/usr/bin/sleep"
	f.Add(sleeper)
	noCap := fakeProc(301, 1, "iptables-legacy", old, "D", "iptables-legacy-restore")
	noCap.CapEff = 0
	f.Add(noCap)
	otherNS := fakeProc(302, 1, "iptables-legacy", old, "D", "iptables-legacy-restore")
	otherNS.NetNS = "net:[4026532999]"
	f.Add(otherNS)
	deleted := fakeProc(303, 1, "iptables-legacy", old, "D", "iptables-legacy-restore")
	f.Add(deleted)
	otherNSWaiting := fakeProc(304, 1, "iptables-legacy", old, "S", "iptables-legacy-restore")
	otherNSWaiting.NetNS = "net:[4026532999]"
	f.Add(otherNSWaiting)
	f.SetLocks("/run/xtables.lock", procs.FileLocks{Held: true, Waiters: []procs.Process{f.MustGet(304)}})
	n, _ := newIssue3Node(f)
	got, err := newIssue3Detector(t, "HungIPTablesRestore", n, nil).Detect(context.Background())
	if err != nil || len(got) != 5 {
		t.Fatalf("got %+v %v", got, err)
	}
	want := map[int32]struct {
		sev finding.Severity
		why string
	}{
		300: {finding.Info, `executable "/usr/bin/sleep" is not an iptables/nft program`},
		301: {finding.Info, "without CAP_NET_ADMIN"},
		302: {finding.Info, "runs in network namespace net/dev inode 4026532999, not the node's (net/dev inode 4026531840), and neither holds nor waits"},
		303: {finding.Critical, ""},
		304: {finding.Critical, ""},
	}
	for _, g := range got {
		pid := g.Evidence["pid"].(int32)
		w := want[pid]
		if g.Severity != w.sev || (w.why != "" && !strings.Contains(g.Message, w.why)) || (w.why == "") != (g.Evidence["notATarget"] == nil) {
			t.Errorf("pid %d: %s %q notATarget=%v, want %s %q", pid, g.Severity, g.Message, g.Evidence["notATarget"], w.sev, w.why)
		}
		if g.Evidence["netns"] == "" || g.Evidence["exe"] == "" {
			t.Errorf("pid %d: no identity in evidence: %v", pid, g.Evidence)
		}
	}
}

func TestHungIPTablesRestoreHoldingTheLock(t *testing.T) {
	f := procs.NewFake(999)
	f.Add(fakeProc(200, 50, "iptables-legacy", procT0.Add(-10*time.Minute), "S", "iptables-legacy-restore", "-w", "5"))
	f.Add(fakeProc(201, 50, "iptables-legacy", procT0.Add(-time.Second), "S", "iptables-legacy-restore", "-w", "5"))
	f.SetLocks("/run/xtables.lock", procs.FileLocks{Held: true, Holders: []procs.Process{f.MustGet(200)}, Waiters: []procs.Process{f.MustGet(201)}})
	n, _ := newIssue3Node(f)
	got, err := newIssue3Detector(t, "HungIPTablesRestore", n, nil).Detect(context.Background())
	if err != nil || len(got) != 1 {
		t.Fatalf("got %+v %v", got, err)
	}
	if got[0].Evidence["holdsXtablesLock"] != true || got[0].Severity != finding.Critical || !strings.Contains(got[0].Message, "holding the xtables lock (1 waiting)") {
		t.Errorf("finding = %+v", got[0])
	}
}

func TestMissingXtablesLockFile(t *testing.T) {
	f := procs.NewFake(999)
	f.Add(fakeProc(200, 50, "iptables-legacy", procT0.Add(-10*time.Minute), "S", "iptables-legacy-restore", "-w", "5"))
	f.SetLocksError("/run/xtables.lock", fmt.Errorf("stat lock file /run/xtables.lock: %w", fs.ErrNotExist))
	n, _ := newIssue3Node(f)
	_, err := newIssue3Detector(t, "XtablesLockContention", n, nil).Detect(context.Background())
	if r, ok := finding.IsSkip(err); !ok || !strings.Contains(r, "does not exist") {
		t.Errorf("contention with no lock file: %v, want a skip saying why", err)
	}
	got, err := newIssue3Detector(t, "HungIPTablesRestore", n, nil).Detect(context.Background())
	if err != nil || len(got) != 1 {
		t.Fatalf("hung restore: %+v %v", got, err)
	}
	if got[0].Evidence["waitsOnXtablesLock"] != nil || !strings.Contains(got[0].Evidence["xtablesLockError"].(string), "file does not exist") {
		t.Errorf("evidence = %v", got[0].Evidence)
	}
}

// The second read of a process first seen old (kit_progress.go) waits
// progressProbe: short in tests.
func init() { progressProbe = 20 * time.Millisecond }
