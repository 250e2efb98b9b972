package action

import (
	"context"
	"errors"
	"reflect"
	"strings"
	"syscall"
	"testing"
	"time"

	"go.uber.org/zap"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/remediate-dev/remediate/internal/cluster"
	"github.com/remediate-dev/remediate/internal/cluster/clustertest"
	"github.com/remediate-dev/remediate/internal/finding"
	"github.com/remediate-dev/remediate/internal/node"
	"github.com/remediate-dev/remediate/internal/procs"
	"github.com/remediate-dev/remediate/policy"
)

var t0 = time.Date(2026, 11, 21, 12, 0, 0, 0, time.UTC)

const selfPID = 999

// nodeNetNS is the daemon's (the node's) network namespace in the fakes.
const nodeNetNS = "net:[4026531840]"

func newFake() *procs.Fake {
	f := procs.NewFake(selfPID)
	f.NetNS = nodeNetNS
	return f
}

func restoreProc(pid int32) procs.FakeProcess {
	return procs.FakeProcess{Process: procs.Process{Pid: pid, PPid: 50, Comm: "iptables-legacy", State: "S",
		Cmdline: []string{"iptables-legacy-restore", "-w", "5"}, CreateTimeMs: t0.Add(-5 * time.Minute).UnixMilli(),
		Exe: "/usr/sbin/xtables-legacy-multi", CapEff: procs.CapNetAdmin, NetNS: nodeNetNS}}
}

func newKill(t *testing.T, f *procs.Fake, set func(*KillProcessParams)) Action {
	t.Helper()
	return newKillOn(t, f, set, nil)
}

// newKillOn is newKill on a node whose pod view is pv (nil: none).
func newKillOn(t *testing.T, f *procs.Fake, set func(*KillProcessParams), pv cluster.PodView) Action {
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
	if pv != nil {
		n.Pods = pv
	}
	a, err := ty.New(p, n)
	if err != nil {
		t.Fatal(err)
	}
	return a
}

// procFinding is a process finding whose detector judged the process
// making no progress (its CPU time 0 ticks, as the fake's processes).
func procFinding(pid int32, ct int64, sp *finding.Process) finding.Finding {
	if sp == nil {
		sp = &finding.Process{}
	}
	if !sp.MakingProgress {
		sp.ProgressChecked = true
	}
	return finding.Finding{Detector: "HungIPTablesRestore", Target: procs.Target(pid, ct),
		Subject: finding.Subject{Kind: finding.KindProcess, Process: sp}}
}

// Pods of the view the identity tests check cgroups against.
var (
	kubeProxyPod = cluster.Pod{Namespace: "kube-system", Name: "kube-proxy-abc", UID: "11111111-1111-1111-1111-111111111111",
		Labels: map[string]string{"k8s-app": "kube-proxy"}, ControllerKind: "DaemonSet", ControllerName: "kube-proxy"}
	userPod = cluster.Pod{Namespace: "default", Name: "app-1", UID: "22222222-2222-2222-2222-222222222222",
		Labels: map[string]string{"k8s-app": "kube-proxy"}, ControllerKind: "DaemonSet", ControllerName: "kube-proxy"}
)

func podView(pods ...cluster.Pod) cluster.PodView {
	v := clustertest.NewPods(t0)
	v.Set(pods...)
	return v
}

func inPod(p procs.FakeProcess, uid string) procs.FakeProcess {
	p.Cgroup = procs.Cgroup{Place: procs.CgroupPod, PodUID: uid, ContainerID: strings.Repeat("c", 64)}
	return p
}

func sigs(f *procs.Fake) []syscall.Signal {
	var out []syscall.Signal
	for _, s := range f.Signals() {
		out = append(out, s.Sig)
	}
	return out
}

func TestKillProcessPlanHasNoSideEffects(t *testing.T) {
	f := newFake()
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
		f         finding.Finding
		wantSigs  []syscall.Signal
		wantSkip  string // substring of the skip reason
		wantErr   string // substring of a non-skip error
		wantAlive bool
		pods      cluster.PodView
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
		{name: "impostor: argv[0] iptables-restore, executable sleep", setup: func(f *procs.Fake) {
			p := restoreProc(200)
			p.Exe = "/usr/bin/sleep"
			f.Add(p)
		}, f: procFinding(200, ct, nil), wantSkip: `executable "/usr/bin/sleep" is not an iptables/nft program`, wantAlive: true},
		// Issue 41: without CAP_SYS_PTRACE (no executable) the cgroup
		// and the API decide.
		{name: "no ptrace: a host process with CAP_NET_ADMIN in the node's namespace", setup: func(f *procs.Fake) {
			p := restoreProc(200)
			p.Exe = ""
			f.Add(p)
		}, f: procFinding(200, ct, nil), wantSigs: []syscall.Signal{syscall.SIGTERM}},
		{name: "no ptrace: kube-proxy's restore (its pod's cgroup, per the API)", setup: func(f *procs.Fake) {
			p := inPod(restoreProc(200), kubeProxyPod.UID)
			p.Exe = ""
			f.Add(p)
		}, pods: podView(kubeProxyPod, userPod), f: procFinding(200, ct, nil), wantSigs: []syscall.Signal{syscall.SIGTERM}},
		{name: "a restore in a user pod, its executable real", setup: func(f *procs.Fake) {
			f.Add(inPod(restoreProc(200), userPod.UID))
		}, pods: podView(kubeProxyPod, userPod), f: procFinding(200, ct, nil), wantSkip: "runs in the cgroup of pod default/app-1 (DaemonSet kube-proxy), which is not a pod of kube-proxy", wantAlive: true},
		{name: "in a pod's cgroup, no pod view", setup: func(f *procs.Fake) {
			f.Add(inPod(restoreProc(200), kubeProxyPod.UID))
		}, f: procFinding(200, ct, nil), wantSkip: "whose pod that is cannot be told", wantAlive: true},
		{name: "in a pod's cgroup, the pod view disconnected", setup: func(f *procs.Fake) {
			f.Add(inPod(restoreProc(200), kubeProxyPod.UID))
		}, pods: func() cluster.PodView {
			v := clustertest.NewPods(t0)
			v.Set(kubeProxyPod)
			v.SetFreshness(cluster.Freshness{Synced: true, Connected: false, CurrentAt: t0.Add(-time.Second), MaxAge: time.Minute, LastError: errors.New("connection refused")})
			return v
		}(), f: procFinding(200, ct, nil), wantSkip: "is disconnected: connection refused", wantAlive: true},
		{name: "ambiguous cgroup", setup: func(f *procs.Fake) {
			p := restoreProc(200)
			p.Cgroup = procs.Cgroup{Place: procs.CgroupAmbiguous, Why: "its cgroups name two pods"}
			f.Add(p)
		}, f: procFinding(200, ct, nil), wantSkip: "cannot be told: its cgroups name two pods", wantAlive: true},
		// Issue 41 part 2: progress, not age.
		{name: "the finding judged no progress", setup: func(f *procs.Fake) { f.Add(restoreProc(200)) },
			f: finding.Finding{Target: procs.Target(200, ct), Subject: finding.Subject{Kind: finding.KindProcess, Process: &finding.Process{}}}, wantSkip: "not killed on age alone", wantAlive: true},
		{name: "the detector saw it at work", setup: func(f *procs.Fake) { f.Add(restoreProc(200)) },
			f: procFinding(200, ct, &finding.Process{MakingProgress: true, HoldsXtablesLock: true}), wantSkip: "was making progress", wantAlive: true},
		{name: "using CPU since the detector's read", setup: func(f *procs.Fake) {
			p := restoreProc(200)
			p.CPUPerRead = 150
			f.Add(p)
		}, f: procFinding(200, ct, &finding.Process{CPUTicks: 0, ProgressWindowSeconds: 30}), wantSkip: "is making progress: 1.50 s of CPU since the last read", wantAlive: true},
		{name: "running (state R)", setup: func(f *procs.Fake) {
			p := restoreProc(200)
			p.State = "R"
			f.Add(p)
		}, f: procFinding(200, ct, nil), wantSkip: "is making progress", wantAlive: true},
		{name: "started using CPU after SIGTERM: no SIGKILL", setup: func(f *procs.Fake) {
			p := restoreProc(200)
			p.IgnoreTERM = true
			f.Add(p)
			f.AfterSignal = func(f *procs.Fake, pid int32, sig syscall.Signal) {
				q := restoreProc(200)
				q.IgnoreTERM, q.CPUPerRead = true, 10
				f.Add(q)
			}
		}, f: procFinding(200, ct, nil), wantSigs: []syscall.Signal{syscall.SIGTERM}, wantErr: "not sending SIGKILL after SIGTERM: skipped: pid 200 is making progress", wantAlive: true},
		{name: "impostor: real iptables without CAP_NET_ADMIN", setup: func(f *procs.Fake) {
			p := restoreProc(200)
			p.CapEff = 0x3fffffffff &^ procs.CapNetAdmin
			f.Add(p)
		}, f: procFinding(200, ct, nil), wantSkip: "without CAP_NET_ADMIN", wantAlive: true},
		{name: "another network namespace, not on the node's lock", setup: func(f *procs.Fake) {
			p := restoreProc(200)
			p.NetNS = "net:[4026532999]"
			f.Add(p)
		}, f: procFinding(200, ct, &finding.Process{}), wantSkip: "not the node's", wantAlive: true},
		{name: "another network namespace, waiting on the node's lock", setup: func(f *procs.Fake) {
			p := restoreProc(200)
			p.NetNS = "net:[4026532999]"
			f.Add(p)
		}, f: procFinding(200, ct, &finding.Process{WaitsOnXtablesLock: true}), wantSigs: []syscall.Signal{syscall.SIGTERM}},
		{name: "proc root of another PID namespace", setup: func(f *procs.Fake) {
			f.Add(restoreProc(200))
			f.PIDNamespaceErr = errors.New("proc root /host/proc shows this process as pid 4242")
		}, f: procFinding(200, ct, nil), wantSkip: "refusing to signal: proc root /host/proc shows this process as pid 4242", wantAlive: true},
		{name: "never pid 1", setup: func(f *procs.Fake) { f.Add(restoreProc(1)) },
			f: procFinding(1, ct, nil), wantSkip: "pid 1", wantAlive: true},
		{name: "never itself", setup: func(f *procs.Fake) { f.Add(restoreProc(selfPID)) },
			f: procFinding(selfPID, ct, nil), wantSkip: "itself", wantAlive: true},
		{name: "not a process target", setup: func(f *procs.Fake) {},
			f: finding.Finding{Target: "xtables-lock/holder-not-visible"}, wantSkip: "not a process target"},
		{name: "lock holder under minHoldTime", setup: func(f *procs.Fake) { f.Add(restoreProc(200)) },
			f: procFinding(200, ct, &finding.Process{HoldsXtablesLock: true, HoldMeasured: true, HoldSeconds: 12.5}), wantSkip: "under minHoldTime", wantAlive: true},
		{name: "lock holder over minHoldTime", setup: func(f *procs.Fake) { f.Add(restoreProc(200)) },
			f: procFinding(200, ct, &finding.Process{HoldMeasured: true, HoldSeconds: 31}), wantSigs: []syscall.Signal{syscall.SIGTERM}},
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
			f := newFake()
			c.setup(f)
			a := newKillOn(t, f, c.params, c.pods)
			res, err := a.Execute(context.Background(), c.f)
			reason, skip := finding.IsSkip(err)
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
	want := []string{"names[1]", "names[2]", "programs", "gracePeriod", "killWait", "minHoldTime"}
	if !reflect.DeepEqual(fields, want) {
		t.Errorf("fields = %v, want %v", fields, want)
	}
	if errs := (&KillProcessParams{}).Validate(); len(errs) != 4 || errs[0].Field != "names" || errs[1].Field != "programs" {
		t.Errorf("empty = %v", errs)
	}
}

// kube-proxy's stuck nft is killed like a hung iptables-restore, but only
// while its parent is kube-proxy (re-checked before every signal); an
// administrator's nft is refused.
func TestKillProcessNFTNeedsKubeProxyParent(t *testing.T) {
	nft := func(pid int32, parent string) procs.FakeProcess {
		ppid := int32(60)
		if parent != "kube-proxy" {
			ppid = 61
		}
		return procs.FakeProcess{Process: procs.Process{Pid: pid, PPid: ppid, ParentName: parent, Comm: "nft", State: "S",
			Cmdline: []string{"/usr/sbin/nft", "--json", "-f", "-"}, CreateTimeMs: t0.Add(-2 * time.Minute).UnixMilli(),
			Exe: "/usr/sbin/nft", CapEff: procs.CapNetAdmin, NetNS: nodeNetNS}}
	}
	ctx := context.Background()
	f := newFake()
	f.Add(kubeProxyParent(60))
	f.Add(nft(700, "kube-proxy"))
	f.Add(nft(701, "bash"))
	a := newKill(t, f, nil)
	if _, err := a.Execute(ctx, procFinding(701, t0.Add(-2*time.Minute).UnixMilli(), nil)); err == nil {
		t.Fatal("an nft whose parent is bash was signalled")
	} else if r, ok := finding.IsSkip(err); !ok || !strings.Contains(r, `has parent "bash"`) {
		t.Fatalf("refusal %v", err)
	}
	if len(f.Signals()) != 0 {
		t.Fatalf("signals sent: %v", f.Signals())
	}
	res, err := a.Execute(ctx, procFinding(700, t0.Add(-2*time.Minute).UnixMilli(), nil))
	if err != nil {
		t.Fatalf("kube-proxy's nft: %v", err)
	}
	if got := sigs(f); !reflect.DeepEqual(got, []syscall.Signal{syscall.SIGTERM}) {
		t.Errorf("signals %v (result %+v)", got, res)
	}
	// Without the Parents default, an nft is not even in the allowlist
	// of a policy that lists only the restore programs.
	b := newKill(t, procs.NewFake(selfPID), func(p *KillProcessParams) { p.Names = []string{"iptables-restore"} })
	if _, err := b.Plan(ctx, procFinding(700, t0.Add(-2*time.Minute).UnixMilli(), nil)); err == nil {
		t.Error("nft planned with a restore-only allowlist")
	}
}

// kubeProxyParent is a real kube-proxy as the fake shows it.
func kubeProxyParent(pid int32) procs.FakeProcess {
	return procs.FakeProcess{Process: procs.Process{Pid: pid, PPid: 1, Comm: "kube-proxy", State: "S",
		Cmdline: []string{"/usr/local/bin/kube-proxy", "--config=/var/lib/kube-proxy/config.conf"}, CreateTimeMs: t0.Add(-time.Hour).UnixMilli(),
		Exe: "/usr/local/bin/kube-proxy", CapEff: procs.CapNetAdmin, NetNS: nodeNetNS}, GoMain: "k8s.io/kubernetes/cmd/kube-proxy"}
}

// A parent that only calls itself kube-proxy is not kube-proxy: each
// identity check of a target applies to it, before every signal
// (issue 27 item 1; the real-process proof is
// TestRealImpostorKubeProxyNFTIsNotKilled).
func TestKillProcessNFTParentIdentity(t *testing.T) {
	ct := t0.Add(-2 * time.Minute).UnixMilli()
	nft := procs.FakeProcess{Process: procs.Process{Pid: 700, PPid: 60, Comm: "nft", State: "S",
		Cmdline: []string{"/usr/sbin/nft", "-f", "/tmp/fifo"}, CreateTimeMs: ct,
		Exe: "/usr/sbin/nft", CapEff: procs.CapNetAdmin, NetNS: nodeNetNS}}
	for _, tc := range []struct {
		name   string
		parent func(*procs.FakeProcess)
		want   string // "" = killed
	}{
		{"real kube-proxy", func(*procs.FakeProcess) {}, ""},
		{"bash copied as kube-proxy", func(p *procs.FakeProcess) { p.Exe, p.GoMain = "/tmp/x/kube-proxy", "" }, "not the Go program k8s.io/kubernetes/cmd/kube-proxy"},
		{"another Go program named kube-proxy", func(p *procs.FakeProcess) { p.GoMain = "example.com/evil" }, `is the Go program "example.com/evil"`},
		{"executable of another name", func(p *procs.FakeProcess) { p.Exe = "/usr/bin/bash" }, "executable is /usr/bin/bash, not a kube-proxy"},
		// Without CAP_SYS_PTRACE: a host kube-proxy with CAP_NET_ADMIN
		// in the node's namespace (issue 41); a kube-proxy in a user
		// pod, whatever its executable and build, is not.
		{"executable unreadable (no ptrace), a host process", func(p *procs.FakeProcess) { p.Exe = "" }, ""},
		{"a real kube-proxy build in a user pod", func(p *procs.FakeProcess) {
			p.Cgroup = procs.Cgroup{Place: procs.CgroupPod, PodUID: "22222222-2222-2222-2222-222222222222"}
		}, "whose pod that is cannot be told"},
		{"no CAP_NET_ADMIN", func(p *procs.FakeProcess) { p.CapEff = 0 }, "without CAP_NET_ADMIN"},
		{"another network namespace", func(p *procs.FakeProcess) { p.NetNS = "net:[1]" }, "another network namespace"},
		{"younger than its child (PID reused)", func(p *procs.FakeProcess) { p.CreateTimeMs = ct + 1 }, "is now another process"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFake()
			p := kubeProxyParent(60)
			tc.parent(&p)
			f.Add(p)
			f.Add(nft)
			_, err := newKill(t, f, nil).Execute(context.Background(), procFinding(700, ct, nil))
			if tc.want == "" {
				if err != nil || len(f.Signals()) == 0 {
					t.Fatalf("not killed: %v", err)
				}
				return
			}
			if r, ok := finding.IsSkip(err); !ok || !strings.Contains(r, tc.want) || !strings.Contains(r, `its parent "kube-proxy" (pid 60) is not a real kube-proxy`) {
				t.Fatalf("refusal %v, want a skip saying %q", err, tc.want)
			}
			if len(f.Signals()) != 0 {
				t.Fatalf("signals sent: %v", f.Signals())
			}
		})
	}
	// The parent is re-checked before SIGKILL: replaced by an impostor
	// after SIGTERM, nothing more is sent.
	f := newFake()
	f.Add(kubeProxyParent(60))
	term := nft
	term.IgnoreTERM = true
	f.Add(term)
	f.AfterSignal = func(f *procs.Fake, pid int32, sig syscall.Signal) {
		p := kubeProxyParent(60)
		p.GoMain = ""
		f.Add(p)
	}
	_, err := newKill(t, f, func(p *KillProcessParams) { p.GracePeriod = policy.D(time.Millisecond) }).Execute(context.Background(), procFinding(700, ct, nil))
	if err == nil || !strings.Contains(err.Error(), "not sending SIGKILL after SIGTERM") || !strings.Contains(err.Error(), "is not a real kube-proxy") {
		t.Fatalf("after the parent changed: %v", err)
	}
	if got := sigs(f); !reflect.DeepEqual(got, []syscall.Signal{syscall.SIGTERM}) {
		t.Errorf("signals %v", got)
	}
}
