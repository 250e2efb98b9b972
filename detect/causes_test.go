package detect

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/remediate-dev/remediate/internal/causes"
	"github.com/remediate-dev/remediate/internal/cpustat"
	"github.com/remediate-dev/remediate/internal/iptables"
	"github.com/remediate-dev/remediate/internal/kubeproxy"
	"github.com/remediate-dev/remediate/internal/node"
	"github.com/remediate-dev/remediate/internal/procs"
)

// slowMetrics is kube-proxy 1.34 text with IPv4 syncs: count syncs, slow
// of them in the 8-16 s bucket, and the endpoint-changes counter.
func slowMetrics(count, slow int, changes float64) string {
	var b strings.Builder
	fmt.Fprintf(&b, "# TYPE kubeproxy_sync_proxy_rules_duration_seconds histogram\n")
	fast := count - slow
	for _, le := range []string{"0.001", "1", "8", "16"} {
		c := fast
		if le == "16" {
			c = count
		}
		fmt.Fprintf(&b, "kubeproxy_sync_proxy_rules_duration_seconds_bucket{ip_family=\"IPv4\",le=%q} %d\n", le, c)
	}
	fmt.Fprintf(&b, "kubeproxy_sync_proxy_rules_duration_seconds_bucket{ip_family=\"IPv4\",le=\"+Inf\"} %d\n", count)
	fmt.Fprintf(&b, "kubeproxy_sync_proxy_rules_duration_seconds_sum{ip_family=\"IPv4\"} %d\nkubeproxy_sync_proxy_rules_duration_seconds_count{ip_family=\"IPv4\"} %d\n", 10*slow, count)
	fmt.Fprintf(&b, "# TYPE kubeproxy_sync_proxy_rules_endpoint_changes_total counter\nkubeproxy_sync_proxy_rules_endpoint_changes_total %g\n", changes)
	fmt.Fprintf(&b, "# TYPE kubeproxy_sync_proxy_rules_iptables_total gauge\nkubeproxy_sync_proxy_rules_iptables_total{ip_family=\"IPv4\",table=\"nat\"} 12000\n")
	fmt.Fprintf(&b, "# TYPE kubernetes_build_info gauge\nkubernetes_build_info{git_version=\"v1.34.4\"} 1\n")
	return b.String()
}

// TestSlowSyncCarriesRankedCauses: a slow-sync finding carries causes from
// every source (fakes): throttling 60% since the cgroup started, then
// over the window; churn 450 per second; 12k nat rules; the lock held by
// another program; softirq; a clusterCIDR not containing the Node's
// podCIDR and minSyncPeriod 30 s on 1.34.
func TestSlowSyncCarriesRankedCauses(t *testing.T) {
	clk := clocktesting.NewFakeClock(time.Unix(1_800_000_000, 0))
	kp := kubeproxy.NewFake(clk, 10*time.Second)
	kp.SetConfigz(&kubeproxy.Configz{SyncPeriod: 10 * time.Second, MinSyncPeriod: 30 * time.Second, ClusterCIDR: "10.0.0.0/16"}, nil)
	ps := procs.NewFake(1)
	ps.Add(procs.FakeProcess{Process: procs.Process{Pid: 42, Comm: "kube-proxy", Cmdline: []string{"/usr/local/bin/kube-proxy"}, CapEff: procs.CapNetAdmin}})
	ps.Add(procs.FakeProcess{Process: procs.Process{Pid: 77, Comm: "python3", Cmdline: []string{"python3"}}})
	ps.SetLocks("/run/xtables.lock", procs.FileLocks{Held: true, Holders: []procs.Process{ps.MustGet(77)}, Waiters: []procs.Process{ps.MustGet(42)}})
	cpu := cpustat.NewFake()
	cpu.SetCgroup(42, cpustat.CgroupCPU{Version: 2, Path: "/kp", Periods: 100, Throttled: 60, ThrottledTime: 3 * time.Second, Quota: true})
	node0 := cpustat.CPUTimes{User: 1000, Idle: 9000, SoftIRQ: 100}
	cpu.SetNode(node0, nil)
	kube := fake.NewSimpleClientset(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1"}, Spec: corev1.NodeSpec{PodCIDRs: []string{"10.244.1.0/24"}}})
	n := &node.Node{Name: "n1", Clock: clk, Log: zap.NewNop(), KubeProxy: kp, Procs: ps, CPU: cpu, Kube: kube, XtablesLock: "/run/xtables.lock"}
	d := newDetector(t, "KubeProxySyncSlow", n, func(p any) { p.(*KubeProxySyncSlowParams).Window.Duration = time.Minute })
	ctx := context.Background()

	kp.SetMetrics(slowMetrics(100, 0, 10))
	if fs, err := d.Detect(ctx); err != nil || len(fs) != 0 {
		t.Fatalf("first scrape: %v %v", fs, err)
	}
	if cpu.Reads() != 1 {
		t.Errorf("healthy cycle read cpu accounting %d times, want 1 (/proc/stat only; kube-proxy's cgroup not looked for without a finding)", cpu.Reads())
	}
	clk.Step(20 * time.Second)
	cpu.SetNode(cpustat.CPUTimes{User: 1200, Idle: 9500, SoftIRQ: 400}, nil) // softirq 300 of 1000 ticks
	kp.SetMetrics(slowMetrics(110, 10, 9010))                                // 9000 changes in 20 s: 450/s
	fs, err := d.Detect(ctx)
	if err != nil || len(fs) != 1 {
		t.Fatalf("slow syncs: %v %v", fs, err)
	}
	ev := fs[0].Evidence
	likely, _ := ev[causes.EvidenceLikely].([]causes.Cause)
	var got []string
	for _, c := range likely {
		got = append(got, string(c.Kind))
	}
	// churn 45x, softirq 3x, minSyncPeriod 3x, throttling 2.4x, rules 1.2x,
	// lock holder and cidr 1x.
	want := "endpoint-churn,large-min-sync-period,node-softirq,cpu-throttling,rule-count,xtables-lock-holder,cluster-cidr-mismatch"
	if strings.Join(got, ",") != want {
		t.Errorf("likely causes %v\nwant %s", got, want)
	}
	top, _ := ev[causes.EvidenceTop].(string)
	if !strings.Contains(top, "endpoint churn 450 changes/s (9000 in the last 20s") {
		t.Errorf("top cause %q", top)
	}
	for _, c := range likely {
		switch c.Kind {
		case causes.CPUThrottling:
			if !strings.Contains(c.Summary, "60% of periods since its cgroup started (60 of 100, 3s throttled, summed over CPUs; cgroup /kp") {
				t.Errorf("throttling %q", c.Summary)
			}
		case causes.XtablesLockHolder:
			if !strings.Contains(c.Summary, "python3 (pid 77)") || !strings.Contains(c.Summary, "1 waiting") {
				t.Errorf("lock %q", c.Summary)
			}
		case causes.ClusterCIDRMismatch:
			if !strings.Contains(c.Summary, "10.0.0.0/16 does not contain this node's podCIDR 10.244.1.0/24") {
				t.Errorf("cidr %q", c.Summary)
			}
		case causes.LargeMinSyncPeriod:
			if !strings.Contains(c.Summary, "30s on 1.34") {
				t.Errorf("minSync %q", c.Summary)
			}
		}
	}

	// Next cycle: throttling over the window now (20 of 50 periods).
	clk.Step(20 * time.Second)
	cpu.SetCgroup(42, cpustat.CgroupCPU{Version: 2, Path: "/kp", Periods: 150, Throttled: 80, ThrottledTime: 4 * time.Second, Quota: true})
	kp.SetMetrics(slowMetrics(120, 20, 40))
	fs, err = d.Detect(ctx)
	if err != nil || len(fs) != 1 {
		t.Fatalf("still slow: %v %v", fs, err)
	}
	var thr *causes.Cause
	for _, c := range fs[0].Evidence[causes.EvidenceLikely].([]causes.Cause) {
		if c.Kind == causes.CPUThrottling {
			thr = &c
		}
	}
	if thr == nil || !strings.Contains(thr.Summary, "40% of periods over the last 20s (20 of 50, 1s throttled, summed over CPUs") {
		t.Errorf("windowed throttling %+v", thr)
	}

	// kube-proxy restarted (new PID): the old one is forgotten, the new
	// one found when causes are needed again.
	ps.Remove(42)
	cpu.RemoveCgroup(42)
	ps.Add(procs.FakeProcess{Process: procs.Process{Pid: 43, Comm: "kube-proxy", Cmdline: []string{"kube-proxy"}, CapEff: procs.CapNetAdmin}})
	cpu.SetCgroup(43, cpustat.CgroupCPU{Version: 2, Path: "/kp", Periods: 10, Quota: true})
	clk.Step(20 * time.Second)
	kp.SetMetrics(slowMetrics(130, 30, 40))
	fs, err = d.Detect(ctx)
	if err != nil || len(fs) != 1 {
		t.Fatalf("after restart: %v %v", fs, err)
	}
	found := false
	out, _ := fs[0].Evidence[causes.EvidenceRuledOut].([]causes.Cause)
	for _, c := range out {
		if c.Kind == causes.CPUThrottling && strings.Contains(c.Summary, "0% of periods since its cgroup started (0 of 10") {
			found = true
		}
	}
	if !found {
		t.Errorf("new kube-proxy's throttling not ruled out: %+v", fs[0].Evidence)
	}
}

// TestCausesNotObserved: without the CPU adapter, procs or cluster access
// the finding still carries what could be judged and says why the rest
// could not.
func TestCausesNotObserved(t *testing.T) {
	clk := clocktesting.NewFakeClock(time.Unix(1_800_000_000, 0))
	kp := kubeproxy.NewFake(clk, 10*time.Second)
	kp.SetConfigz(&kubeproxy.Configz{SyncPeriod: 10 * time.Second, ClusterCIDR: "10.244.0.0/16"}, nil)
	n := &node.Node{Name: "n1", Clock: clk, Log: zap.NewNop(), KubeProxy: kp,
		Unavailable: map[string]string{"cpustat": "cpu accounting unavailable: test", "kubernetes": "no cluster access: test"}}
	d := newDetector(t, "KubeProxySyncSlow", n, func(p any) { p.(*KubeProxySyncSlowParams).Window.Duration = time.Minute })
	ctx := context.Background()
	kp.SetMetrics(slowMetrics(100, 0, 10))
	if _, err := d.Detect(ctx); err != nil {
		t.Fatal(err)
	}
	clk.Step(20 * time.Second)
	kp.SetMetrics(slowMetrics(110, 10, 10))
	fs, err := d.Detect(ctx)
	if err != nil || len(fs) != 1 {
		t.Fatalf("%v %v", fs, err)
	}
	why := strings.Join(fs[0].Evidence[causes.EvidenceNotObserved].([]string), "; ")
	for _, w := range []string{"CPU throttling and softirq: cpu accounting unavailable: test", "xtables lock holders:",
		"clusterCIDR vs the Node's podCIDR: no cluster access: test"} {
		if !strings.Contains(why, w) {
			t.Errorf("not observed %q lacks %q", why, w)
		}
	}
	// Churn 0 in the window: ruled out with its figure; 12k rules likely.
	if top := fs[0].Evidence[causes.EvidenceTop]; top != "IPv4 (backend unknown) nat table has 12000 rules (field guides 1 and 2: > 10000 is concerning)" {
		t.Errorf("top %v", top)
	}
}

// TestLockFindingCarriesCauses: an XtablesLockContention finding carries
// the causes too (here the holder, and kube-proxy's rule count from the
// last scrape the kube-proxy detectors made: none yet, said so).
func TestLockFindingCarriesCauses(t *testing.T) {
	clk := clocktesting.NewFakeClock(time.Unix(1_800_000_000, 0))
	ps := procs.NewFake(1)
	ps.Add(procs.FakeProcess{Process: procs.Process{Pid: 77, Comm: "python3", Cmdline: []string{"python3"}}})
	ps.Add(procs.FakeProcess{Process: procs.Process{Pid: 78, Comm: "iptables-legacy", Cmdline: []string{"iptables-restore"}}})
	ps.SetLocks("/run/xtables.lock", procs.FileLocks{Held: true, Holders: []procs.Process{ps.MustGet(77)}, Waiters: []procs.Process{ps.MustGet(78)}})
	n := &node.Node{Name: "n1", Clock: clk, Log: zap.NewNop(), Procs: ps, CPU: cpustat.NewFake(), XtablesLock: "/run/xtables.lock"}
	d := newDetector(t, "XtablesLockContention", n, func(p any) { p.(*XtablesLockContentionParams).MaxWaiters = 1 })
	fs, err := d.Detect(context.Background())
	if err != nil || len(fs) != 1 {
		t.Fatalf("%v %v", fs, err)
	}
	ev := fs[0].Evidence
	if top, _ := ev[causes.EvidenceTop].(string); !strings.Contains(top, "xtables lock held by python3 (pid 77), not kube-proxy") || !strings.Contains(top, "1 waiting") {
		t.Errorf("top cause %q", top)
	}
	why := strings.Join(ev[causes.EvidenceNotObserved].([]string), "; ")
	if !strings.Contains(why, "endpoint churn: kube-proxy's metrics not read") {
		t.Errorf("not observed: %s", why)
	}
}

// TestSlowSaveFromLastSnapshot: rule counts and save time come from the
// shared iptables adapter's last save of the finding's family (never a save
// of their own), ahead of kube-proxy's own counts.
func TestSlowSaveFromLastSnapshot(t *testing.T) {
	clk := clocktesting.NewFakeClock(time.Unix(1_800_000_000, 0))
	kp := kubeproxy.NewFake(clk, 10*time.Second)
	ipt := iptables.NewFake()
	ipt.SetRules(iptables.IPv4, iptables.Legacy, "*nat\n:PREROUTING ACCEPT [0:0]\n-A PREROUTING -j ACCEPT\nCOMMIT\n")
	ipt.SetDuration(iptables.IPv4, iptables.Legacy, 700*time.Millisecond)
	ipt.SetRules(iptables.IPv6, iptables.Legacy, "*nat\n:PREROUTING ACCEPT [0:0]\nCOMMIT\n")
	ipt.SetDuration(iptables.IPv6, iptables.Legacy, 5*time.Second) // another family: not this finding's
	shared := iptables.NewShared(ipt, time.Minute)
	for _, f := range []iptables.Family{iptables.IPv4, iptables.IPv6} {
		if _, err := shared.Save(context.Background(), f, iptables.Legacy); err != nil {
			t.Fatal(err)
		}
	}
	n := &node.Node{Name: "n1", Clock: clk, Log: zap.NewNop(), KubeProxy: kp, IPTables: shared}
	d := newDetector(t, "KubeProxySyncSlow", n, func(p any) { p.(*KubeProxySyncSlowParams).Window.Duration = time.Minute })
	kp.SetMetrics(slowMetrics(100, 0, 10))
	if _, err := d.Detect(context.Background()); err != nil {
		t.Fatal(err)
	}
	clk.Step(20 * time.Second)
	kp.SetMetrics(slowMetrics(110, 10, 10))
	fs, err := d.Detect(context.Background())
	if err != nil || len(fs) != 1 {
		t.Fatalf("%v %v", fs, err)
	}
	if top := fs[0].Evidence[causes.EvidenceTop]; top != "IPv4 legacy save took 700ms (field guide 2: > 500 ms is bad)" {
		t.Errorf("top %v", top)
	}
	if ipt.Calls(iptables.IPv4, iptables.Legacy) != 1 {
		t.Errorf("causes ran a save of their own: %d saves", ipt.Calls(iptables.IPv4, iptables.Legacy))
	}
}
