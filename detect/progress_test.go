package detect

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/remediate-dev/remediate/internal/cluster"
	"github.com/remediate-dev/remediate/internal/cluster/clustertest"
	"github.com/remediate-dev/remediate/internal/finding"
	"github.com/remediate-dev/remediate/internal/procs"
)

// Issue 41 part 2: progress, not age. A busy nft under kube-proxy (the
// field's nft at 5k-44k Services, kubernetes/kubernetes#135639) is old but
// at work: no finding, the judgement says so; once it stops using CPU the
// next cycle (its reading remembered) reports it with the CPU seconds and
// the window, and the typed subject KillProcess re-checks. On main the
// first cycle reported it (age alone).
func TestHungNFTJudgesProgressNotAge(t *testing.T) {
	ctx := context.Background()
	fp := procs.NewFake(999)
	fp.Add(fakeProc(60, 1, "kube-proxy", procT0.Add(-time.Hour), "S", "kube-proxy"))
	nft := fakeProc(700, 60, "nft", procT0.Add(-10*time.Minute), "S", "/usr/sbin/nft", "-f", "-")
	nft.CPUPerRead = 50
	fp.Add(nft)
	n, clk := newIssue3Node(fp)
	d := newIssue3Detector(t, "HungNFT", n, nil)
	fs, err := d.Detect(ctx)
	if err != nil || len(fs) != 0 {
		t.Fatalf("busy nft: %+v %v", fs, err)
	}
	if j := d.(Judged).Judged(); !strings.Contains(j, "1 of them making progress, not hung (pid 700: 0.50 s of CPU in") || !strings.Contains(j, "over a second read") {
		t.Fatalf("judgement %q", j)
	}
	// Still busy at the next cycle: judged since the last one.
	clk.Step(30 * time.Second)
	if fs, err := d.Detect(ctx); err != nil || len(fs) != 0 || !strings.Contains(d.(Judged).Judged(), "(since the last cycle)") {
		t.Fatalf("still busy: %+v %v %q", fs, err, d.(Judged).Judged())
	}
	// Stuck: no CPU over the next interval.
	nft.CPUTicks = fp.MustGet(700).CPUTicks - nft.CPUPerRead // as last read (MustGet is a read too)
	nft.CPUPerRead = 0
	fp.Add(nft)
	clk.Step(30 * time.Second)
	fs, err = d.Detect(ctx)
	if err != nil || len(fs) != 1 {
		t.Fatalf("stuck nft: %+v %v", fs, err)
	}
	f := fs[0]
	sp := f.Subject.Process
	if f.Severity != finding.Warning || sp == nil || !sp.ProgressChecked || sp.CPUTicks != nft.CPUTicks || sp.ProgressWindowSeconds != 30 ||
		f.Evidence["cpuSecondsInWindow"] != 0.0 || f.Evidence["progressWindow"] != "since the last cycle" ||
		!strings.Contains(f.Message, "making no progress (0.00 s of CPU in 30s (since the last cycle))") || f.Evidence["identity"] != "host-cgroup,exe" {
		t.Fatalf("finding %s %s %+v %v", f.Severity, f.Message, sp, f.Evidence)
	}
}

// A restore spinning (state R or CPU advancing) is never hung; a
// sleeping one with no CPU is, with its identity: kube-proxy's pod by
// cgroup+api, or, in a user pod's cgroup, not a target whatever its
// executable.
func TestHungIPTablesRestoreProgressAndIdentity(t *testing.T) {
	ctx := context.Background()
	fp := procs.NewFake(999)
	busy := fakeProc(300, 1, "iptables-legacy", procT0.Add(-5*time.Minute), "R", "iptables-legacy-restore", "-w", "5")
	fp.Add(busy)
	spin := fakeProc(301, 1, "iptables-legacy", procT0.Add(-5*time.Minute), "S", "iptables-legacy-restore", "-w", "5")
	spin.CPUPerRead = 3
	fp.Add(spin)
	kp := fakeProc(302, 1, "iptables-legacy", procT0.Add(-5*time.Minute), "S", "iptables-legacy-restore", "-w", "5")
	kp.Exe = "" // no ptrace
	kp.Cgroup = procs.Cgroup{Place: procs.CgroupPod, PodUID: "11111111-1111-1111-1111-111111111111"}
	fp.Add(kp)
	user := fakeProc(303, 1, "iptables-legacy", procT0.Add(-5*time.Minute), "S", "iptables-legacy-restore", "-w", "5")
	user.Cgroup = procs.Cgroup{Place: procs.CgroupPod, PodUID: "22222222-2222-2222-2222-222222222222"}
	fp.Add(user)
	n, _ := newIssue3Node(fp)
	pv := clustertest.NewPods(procT0)
	pv.Set(cluster.Pod{Namespace: "kube-system", Name: "kube-proxy-a", UID: "11111111-1111-1111-1111-111111111111", Labels: map[string]string{"k8s-app": "kube-proxy"}, ControllerKind: "DaemonSet", ControllerName: "kube-proxy"},
		cluster.Pod{Namespace: "default", Name: "app", UID: "22222222-2222-2222-2222-222222222222", ControllerKind: "ReplicaSet"})
	n.Pods = pv
	fs, err := newIssue3Detector(t, "HungIPTablesRestore", n, nil).Detect(ctx)
	if err != nil {
		t.Fatal(err)
	}
	got := map[int32]finding.Finding{}
	for _, f := range fs {
		got[f.Evidence["pid"].(int32)] = f
	}
	if _, ok := got[300]; ok {
		t.Errorf("a running (R) restore reported: %s", got[300].Message)
	}
	if _, ok := got[301]; ok {
		t.Errorf("a restore using CPU reported: %s", got[301].Message)
	}
	if f := got[302]; f.Severity != finding.Warning || f.Evidence["identity"] != "cgroup+api" || f.Evidence["identityPod"] != "kube-system/kube-proxy-a" {
		t.Errorf("kube-proxy's stuck restore: %s %s %v", f.Severity, f.Message, f.Evidence)
	}
	if f := got[303]; f.Severity != finding.Info || !strings.Contains(f.Message, "not a target: pid 303 runs in the cgroup of pod default/app") {
		t.Errorf("a restore in a user pod: %s %s", f.Severity, f.Message)
	}
}
