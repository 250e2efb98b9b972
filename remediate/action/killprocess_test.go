package action

import (
	"context"
	"reflect"
	"strings"
	"syscall"
	"testing"
	"time"

	"go.uber.org/zap"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/remediate-dev/remediate/detect"
	"github.com/remediate-dev/remediate/internal/node"
	"github.com/remediate-dev/remediate/internal/procs"
	"github.com/remediate-dev/remediate/policy"
)

var t0 = time.Date(2026, 11, 21, 12, 0, 0, 0, time.UTC)

const selfPID = 999

func restoreProc(pid int32) procs.FakeProcess {
	return procs.FakeProcess{Process: procs.Process{Pid: pid, PPid: 50, Comm: "iptables-legacy", State: "S",
		Cmdline: []string{"iptables-legacy-restore", "-w", "5"}, CreateTimeMs: t0.Add(-5 * time.Minute).UnixMilli()}}
}

func newKill(t *testing.T, f *procs.Fake, set func(*KillProcessParams)) Action {
	t.Helper()
	ty, ok := Lookup("KillProcess")
	if !ok {
		t.Fatal("KillProcess not registered")
	}
	p := ty.NewParams().(*KillProcessParams)
	p.GracePeriod = policy.D(40 * time.Millisecond)
	p.KillWait = policy.D(40 * time.Millisecond)
	if set != nil {
		set(p)
	}
	if errs := p.Validate(); len(errs) > 0 {
		t.Fatalf("params: %v", errs)
	}
	n := &node.Node{Clock: clocktesting.NewFakeClock(t0), Log: zap.NewNop(), Procs: f}
	a, err := ty.New(p, n)
	if err != nil {
		t.Fatal(err)
	}
	return a
}

func procFinding(pid int32, ct int64, ev map[string]any) detect.Finding {
	return detect.Finding{Detector: "HungIPTablesRestore", Target: procs.Target(pid, ct), Evidence: ev}
}

func sigs(f *procs.Fake) []syscall.Signal {
	var out []syscall.Signal
	for _, s := range f.Signals() {
		out = append(out, s.Sig)
	}
	return out
}

func TestKillProcessPlanHasNoSideEffects(t *testing.T) {
	f := procs.NewFake(selfPID)
	p := restoreProc(200)
	f.Add(p)
	plan, err := newKill(t, f, nil).Plan(context.Background(), procFinding(200, p.CreateTimeMs, nil))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(plan.Summary, "send SIGTERM to pid 200 (iptables-legacy-restore -w 5)") || plan.Details["pid"] != int32(200) {
		t.Errorf("plan = %+v", plan)
	}
	if len(f.Signals()) != 0 {
		t.Errorf("Plan sent signals: %v", f.Signals())
	}
	if ok, _ := procs.Alive(context.Background(), f, 200, p.CreateTimeMs); !ok {
		t.Error("Plan killed the process")
	}
}

func TestKillProcessExecute(t *testing.T) {
	ct := restoreProc(0).CreateTimeMs
	cases := []struct {
		name      string
		setup     func(f *procs.Fake)
		params    func(*KillProcessParams)
		f         detect.Finding
		wantSigs  []syscall.Signal
		wantSkip  string // substring of the skip reason
		wantErr   string // substring of a non-skip error
		wantAlive bool
	}{
		{name: "exits on SIGTERM", setup: func(f *procs.Fake) { f.Add(restoreProc(200)) },
			f: procFinding(200, ct, nil), wantSigs: []syscall.Signal{syscall.SIGTERM}},
		{name: "ignores SIGTERM, SIGKILL after grace", setup: func(f *procs.Fake) {
			p := restoreProc(200)
			p.IgnoreTERM = true
			f.Add(p)
		}, f: procFinding(200, ct, nil), wantSigs: []syscall.Signal{syscall.SIGTERM, syscall.SIGKILL}},
		{name: "unkillable (D state) is a failure", setup: func(f *procs.Fake) {
			p := restoreProc(200)
			p.Unkillable = true
			p.State = "D"
			f.Add(p)
		}, f: procFinding(200, ct, nil), wantSigs: []syscall.Signal{syscall.SIGTERM, syscall.SIGKILL}, wantErr: "state D", wantAlive: true},
		{name: "pid reused by another process", setup: func(f *procs.Fake) {
			p := restoreProc(200)
			p.CreateTimeMs += 1000
			f.Add(p)
		}, f: procFinding(200, ct, nil), wantSkip: "now another process", wantAlive: true},
		{name: "already gone", setup: func(f *procs.Fake) {}, f: procFinding(200, ct, nil), wantSkip: "gone"},
		{name: "not in allowlist", setup: func(f *procs.Fake) {
			p := restoreProc(200)
			p.Cmdline = []string{"/usr/bin/sleep", "300"}
			f.Add(p)
		}, f: procFinding(200, ct, nil), wantSkip: "not in the allowlist", wantAlive: true},
		{name: "never pid 1", setup: func(f *procs.Fake) { f.Add(restoreProc(1)) },
			f: procFinding(1, ct, nil), wantSkip: "pid 1", wantAlive: true},
		{name: "never itself", setup: func(f *procs.Fake) { f.Add(restoreProc(selfPID)) },
			f: procFinding(selfPID, ct, nil), wantSkip: "itself", wantAlive: true},
		{name: "not a process target", setup: func(f *procs.Fake) {},
			f: detect.Finding{Target: "xtables-lock/holder-not-visible"}, wantSkip: "not a process target"},
		{name: "lock holder under minHoldTime", setup: func(f *procs.Fake) { f.Add(restoreProc(200)) },
			f: procFinding(200, ct, map[string]any{"holdSeconds": 12.5}), wantSkip: "under minHoldTime", wantAlive: true},
		{name: "lock holder over minHoldTime (JSON number)", setup: func(f *procs.Fake) { f.Add(restoreProc(200)) },
			f: procFinding(200, ct, map[string]any{"holdSeconds": float64(31)}), wantSigs: []syscall.Signal{syscall.SIGTERM}},
		{name: "execs another program after SIGTERM: no SIGKILL", setup: func(f *procs.Fake) {
			p := restoreProc(200)
			p.IgnoreTERM = true
			f.Add(p)
			f.AfterSignal = func(f *procs.Fake, pid int32, sig syscall.Signal) {
				q := restoreProc(200)
				q.Cmdline = []string{"bash"}
				f.Add(q)
			}
		}, f: procFinding(200, ct, nil), wantSigs: []syscall.Signal{syscall.SIGTERM}, wantErr: "not sending SIGKILL", wantAlive: true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			f := procs.NewFake(selfPID)
			c.setup(f)
			a := newKill(t, f, c.params)
			res, err := a.Execute(context.Background(), c.f)
			reason, skip := detect.IsSkip(err)
			switch {
			case c.wantSkip != "":
				if !skip || !strings.Contains(reason, c.wantSkip) {
					t.Fatalf("err = %v, want skip %q", err, c.wantSkip)
				}
				// Plan refuses the same way.
				if _, perr := a.Plan(context.Background(), c.f); perr == nil {
					t.Error("Plan accepted what Execute refused")
				}
			case c.wantErr != "":
				if err == nil || skip || !strings.Contains(err.Error(), c.wantErr) {
					t.Fatalf("err = %v, want error %q", err, c.wantErr)
				}
			default:
				if err != nil {
					t.Fatal(err)
				}
				if !strings.Contains(res.Summary, "is gone after") || res.Details["createTimeMs"] != ct || res.Details["cmdline"] != "iptables-legacy-restore -w 5" {
					t.Errorf("result = %+v", res)
				}
			}
			if got := sigs(f); !reflect.DeepEqual(got, c.wantSigs) {
				t.Errorf("signals = %v, want %v", got, c.wantSigs)
			}
			// Whatever runs under the PID is still there exactly when expected.
			if pid, _, perr := procs.ParseTarget(c.f.Target); perr == nil {
				_, gerr := f.Get(context.Background(), pid)
				if exists := gerr == nil; exists != c.wantAlive {
					t.Errorf("pid %d exists = %v, want %v", pid, exists, c.wantAlive)
				}
			}
		})
	}
}

func TestKillProcessParamsValidate(t *testing.T) {
	p := &KillProcessParams{Names: []string{"ok", "/bin/sh", ""}, GracePeriod: policy.D(0), KillWait: policy.D(-1), MinHoldTime: policy.D(-1)}
	var fields []string
	for _, e := range p.Validate() {
		fields = append(fields, e.Field)
	}
	want := []string{"names[1]", "names[2]", "gracePeriod", "killWait", "minHoldTime"}
	if !reflect.DeepEqual(fields, want) {
		t.Errorf("fields = %v, want %v", fields, want)
	}
	if errs := (&KillProcessParams{}).Validate(); len(errs) != 3 || errs[0].Field != "names" {
		t.Errorf("empty = %v", errs)
	}
}
