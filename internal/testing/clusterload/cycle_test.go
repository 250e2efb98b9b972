package clusterload

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/remediate-dev/remediate/internal/testing/controlplane"
	"github.com/remediate-dev/remediate/internal/testing/deploytest"
)

func envInt(name string, def int) int {
	if v, err := strconv.Atoi(os.Getenv(name)); err == nil {
		return v
	}
	return def
}

func envDuration(name string, def time.Duration) time.Duration {
	if v, err := time.ParseDuration(os.Getenv(name)); err == nil {
		return v
	}
	return def
}

// BenchmarkCycleWithClusterView is `make bench-load`'s cluster part (root,
// -benchtime 1x): the real etcd + kube-apiserver and a real kube-proxy
// (iptables-legacy) in a namespace, Services with 5 ready endpoints each
// (CLUSTERLOAD_SERVICES, default 500,5000,10000, added in steps on the
// same control plane), and the released binary (REMEDIATE_BENCH_BIN) run
// beside them as the DaemonSet's ServiceAccount with examples/audit.yaml
// at CLUSTERLOAD_INTERVAL (default 5s). For each size it prints the
// daemon's CPU per cycle (own + children: the *-save runs) and its RSS,
// steady (nothing changes) and under churn (CLUSTERLOAD_CHURN changes a
// minute, default 20: Service creates, rescales, deletes in turn).
//
// CLUSTERLOAD_PHASES (default steady,churn) picks the phases.
// CLUSTERLOAD_BASELINE_BIN, if set, is a second binary (main's, for a
// before/after table) measured the same way right after the first in each
// phase (CLUSTERLOAD_BASELINE_PHASES, default steady,churn), on the same
// population. CLUSTERLOAD_PROFILE_DIR, if set, runs the
// first binary with --debug-pprof and keeps, per size and phase, its heap
// profile (in use after a GC) and a CPU profile of
// CLUSTERLOAD_PROFILE_DURATION (default 4 intervals) taken after
// the measured windows (so they do not weigh on the figures).
func BenchmarkCycleWithClusterView(b *testing.B) {
	bin := os.Getenv("REMEDIATE_BENCH_BIN")
	if bin == "" {
		b.Skip("REMEDIATE_BENCH_BIN (the binary to measure) is not set: run `make bench-load`")
	}
	bin, _ = filepath.Abs(bin)
	var sizes []int
	for _, s := range strings.Split(envOr("CLUSTERLOAD_SERVICES", "500,5000,10000"), ",") {
		n, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil {
			b.Fatalf("CLUSTERLOAD_SERVICES: %v", err)
		}
		sizes = append(sizes, n)
	}
	interval := envDuration("CLUSTERLOAD_INTERVAL", 5*time.Second)
	cycles := envInt("CLUSTERLOAD_CYCLES", 10)
	churn := envInt("CLUSTERLOAD_CHURN", 20)
	bins := []string{bin}
	if base := os.Getenv("CLUSTERLOAD_BASELINE_BIN"); base != "" {
		base, _ = filepath.Abs(base)
		bins = append(bins, base)
	}
	profDir := os.Getenv("CLUSTERLOAD_PROFILE_DIR")
	const eps = 5

	cp := controlplane.Start(b, controlplane.Options{})
	ctx := context.Background()
	cfg := rest.CopyConfig(cp.RestConfig)
	cfg.QPS, cfg.Burst = 500, 1000
	cs := kubernetes.NewForConfigOrDie(cfg)
	if _, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: deploytest.Namespace}}, metav1.CreateOptions{}); err != nil {
		b.Fatal(err)
	}
	deploytest.ApplyOverlay(b, cp, "audit", false)
	kubeconfig := deploytest.DaemonKubeconfig(b, cp, "node1")
	kp := cp.StartKubeProxy(controlplane.KubeProxyOptions{SyncPeriod: 30 * time.Second})
	pol := policyFile(b, interval)
	fmt.Printf("machine: %d cores, %s; interval %v, %d cycles a phase, churn %d a minute; load average at start %s\n",
		runtime.NumCPU(), kernel(), interval, cycles, churn, LoadAvg())

	have := 0
	var rows []string
	for _, n := range sizes {
		t0 := time.Now()
		if err := Populate(ctx, cs, have, n, eps, 0, 8); err != nil {
			b.Fatal(err)
		}
		fmt.Printf("%d Services (+%d) created in %v\n", n, n-have, time.Since(t0).Round(time.Second))
		have = n
		waitKubeProxySynced(b, cp, kp, time.Now())
		for _, phase := range strings.Split(envOr("CLUSTERLOAD_PHASES", "steady,churn"), ",") {
			fmt.Printf("phase %d %s\n", n, phase)
			cctx, stop := context.WithCancel(ctx)
			done := make(chan string, 1)
			if phase == "churn" {
				go func() {
					c, r, d, err := Churn(cctx, cs, churn, 1_000_000+n, n, eps, 0)
					s := fmt.Sprintf("%d created, %d rescaled, %d deleted", c, r, d)
					if err != nil {
						s += fmt.Sprintf(" (%v)", err)
					}
					done <- s
				}()
			} else {
				close(done)
			}
			var phaseRows []string
			for i, bn := range bins {
				if i > 0 && !strings.Contains(","+envOr("CLUSTERLOAD_BASELINE_PHASES", "steady,churn")+",", ","+phase+",") {
					continue
				}
				prof := ""
				if i == 0 && profDir != "" {
					prof = filepath.Join(profDir, fmt.Sprintf("%d-%s", n, phase))
				}
				r := measureDaemon(b, cp, bn, pol, kubeconfig, kp.XtablesLock, interval, cycles, prof)
				row := fmt.Sprintf("| %d | %s | %s | %s | %s | %.1f / %.1f MiB (peak %.1f; %.1f anonymous) | %s |", n, phase, filepath.Base(filepath.Dir(bn))+"/"+filepath.Base(bn), r.cpu, r.reads, r.rssMed, r.rssMax, r.hwm, r.anon, r.load)
				fmt.Println(row)
				phaseRows = append(phaseRows, row)
			}
			stop()
			churned := <-done
			for _, row := range phaseRows {
				if churned != "" {
					row += " " + churned
				}
				rows = append(rows, row)
			}
		}
	}
	fmt.Println("\n| Services | phase | binary | CPU per cycle (mean, own + children) | reads per cycle | RSS median / max | load average |")
	fmt.Println("|---|---|---|---|---|---|---|")
	for _, r := range rows {
		fmt.Println(r)
	}
}

func envOr(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}

func kernel() string {
	b, _ := os.ReadFile("/proc/sys/kernel/osrelease")
	return "Linux " + strings.TrimSpace(string(b))
}

// policyFile is examples/audit.yaml at interval, without jitter, the
// detector and action timeouts 4/5 of it.
func policyFile(b testing.TB, interval time.Duration) string {
	_, file, _, _ := runtime.Caller(0)
	root := filepath.Join(filepath.Dir(file), "..", "..", "..")
	pol, err := os.ReadFile(filepath.Join(root, "examples", "audit.yaml"))
	if err != nil {
		b.Fatal(err)
	}
	pol = regexp.MustCompile(`(?m)^interval: .*$`).ReplaceAll(pol, []byte("interval: "+interval.String()+
		"\ndetectorTimeout: "+(interval*4/5).String()+"\nactionTimeout: "+(interval*4/5).String()))
	pol = regexp.MustCompile(`(?m)^jitter: .*$`).ReplaceAll(pol, []byte("jitter: 0"))
	p := filepath.Join(b.TempDir(), "policy.yaml")
	if err := os.WriteFile(p, pol, 0o644); err != nil {
		b.Fatal(err)
	}
	return p
}

// waitKubeProxySynced waits until kube-proxy completed a sync after since
// with nothing queued.
func waitKubeProxySynced(b *testing.B, cp *controlplane.ControlPlane, kp *controlplane.KubeProxy, since time.Time) {
	c := cp.NetNS.HTTPClient(5 * time.Second)
	deadline := time.Now().Add(5 * time.Minute)
	for time.Now().Before(deadline) {
		time.Sleep(2 * time.Second)
		body, err := get(c, kp.MetricsURL)
		if err != nil {
			continue
		}
		last, ok1 := Metric(body, `kubeproxy_sync_proxy_rules_last_timestamp_seconds{ip_family="IPv4"}`)
		queued, ok2 := Metric(body, `kubeproxy_sync_proxy_rules_last_queued_timestamp_seconds{ip_family="IPv4"}`)
		if ok1 && ok2 && last > float64(since.Unix()) && queued <= last {
			return
		}
	}
	b.Fatal("kube-proxy did not sync within 5 minutes")
}

type result struct {
	cpu, reads, load          string
	rssMed, rssMax, hwm, anon float64
}

// measureDaemon runs the binary until 2 warm-up cycles and then cycles
// more completed, sampling its CPU and RSS over 5-cycle windows. With prof
// set, the binary serves /debug/pprof and its heap and CPU profiles are
// written to prof+"-heap.pb.gz" and prof+"-cpu.pb.gz" after the windows.
func measureDaemon(b *testing.B, cp *controlplane.ControlPlane, bin, pol, kubeconfig, lock string, interval time.Duration, cycles int, prof string) result {
	state := b.TempDir()
	addr := "127.0.0.1:19809"
	const pprofAddr = "127.0.0.1:19810"
	args := []string{"--policy", pol, "--state-dir", state, "--node-name", "node1", "--kubeconfig", kubeconfig,
		"--metrics-addr", addr, "--xtables-lock", lock, "--log-level", "info"}
	if prof != "" {
		args = append(args, "--debug-pprof", pprofAddr)
	}
	cmd := cp.NetNS.Command(bin, args...)
	// The environment the DaemonSet sets (deploy/base/daemonset.yaml).
	cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "HOME=" + state, "GOMEMLIMIT=150MiB", "KUBE_FEATURE_WatchListClient=true"}
	logf, err := os.Create(filepath.Join(b.TempDir(), "daemon.log"))
	if err != nil {
		b.Fatal(err)
	}
	defer logf.Close()
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	defer stopProcess(cmd)
	pid := findChild(b, cmd)
	fmt.Printf("daemon pid %d\n", pid)
	c := cp.NetNS.HTTPClient(5 * time.Second)
	var entries, saves, decodes float64
	var lastErr string
	// The cycles are counted from /metrics, which costs the daemon ~15 ms
	// a scrape (126 kB of text, gzip): it is polled before a window ends
	// only when the window's cycles are not done yet, so a window costs
	// about one scrape (a Prometheus at 25 s), not one a second as
	// before. (The "cycle done" log line is said at debug level while the
	// cycles are alike: it cannot count them at info.)
	count := func() int {
		body, err := get(c, "http://"+addr+"/metrics")
		if err != nil {
			lastErr = err.Error()
			return -1
		}
		n, ok := Metric(body, "remediate_cycle_duration_seconds_count")
		if !ok {
			lastErr = "no remediate_cycle_duration_seconds_count in /metrics"
			return -1
		}
		entries, _ = Metric(body, `remediate_iptables_reads_total{backend="legacy",ip_family="IPv4",read="entries"}`)
		saves, _ = Metric(body, `remediate_iptables_reads_total{backend="legacy",ip_family="IPv4",read="save"}`)
		decodes, _ = Metric(body, `remediate_iptables_reads_total{backend="legacy",ip_family="IPv4",read="decode"}`)
		return int(n)
	}
	wait := func(n int) int {
		// The first cycles wait for the view's initial sync: at 5,000
		// Services on a loaded machine that took more than 30 s.
		deadline := time.Now().Add(2*time.Minute + time.Duration(n)*(interval+5*time.Second))
		for time.Now().Before(deadline) {
			if k := count(); k >= n {
				return k
			}
			time.Sleep(interval / 5)
		}
		_ = cmd.Process.Signal(syscall.SIGQUIT) // its goroutines into the log
		time.Sleep(2 * time.Second)
		log, _ := os.ReadFile(logf.Name())
		b.Fatalf("%d cycles not reached (%s); daemon log:\n%s", n, lastErr, tailBytes(log, 20000))
		return 0
	}
	c0 := wait(2)
	own0, kids0, _ := CPU(pid)
	e0, s0, d0 := entries, saves, decodes
	const window = 5
	var perCycle, rss []float64
	pOwn, pKids, pC := own0, kids0, c0
	for i := 0; i < (cycles+window-1)/window; i++ {
		// The window's cycles end about window intervals after the last
		// count: one scrape then, rarely two.
		time.Sleep(time.Duration(window)*interval + interval/10)
		k := wait(pC + window)
		own, kids, err := CPU(pid)
		if err != nil {
			b.Fatal(err)
		}
		perCycle = append(perCycle, (own+kids-pOwn-pKids)/float64(k-pC))
		rss = append(rss, StatusMiB(pid, "VmRSS:"))
		pOwn, pKids, pC = own, kids, k
	}
	if prof != "" {
		profDur := envDuration("CLUSTERLOAD_PROFILE_DURATION", 4*interval)
		pc := cp.NetNS.HTTPClient(profDur + 30*time.Second)
		for _, p := range []struct{ path, file string }{
			{"/debug/pprof/heap?gc=1", prof + "-heap.pb.gz"},
			{fmt.Sprintf("/debug/pprof/profile?seconds=%d", int(profDur/time.Second)), prof + "-cpu.pb.gz"},
		} {
			body, err := get(pc, "http://"+pprofAddr+p.path)
			if err != nil {
				b.Fatalf("profile %s: %v", p.path, err)
			}
			if err := os.WriteFile(p.file, []byte(body), 0o644); err != nil {
				b.Fatal(err)
			}
		}
	}
	n := float64(pC - c0)
	sort.Float64s(perCycle)
	sort.Float64s(rss)
	return result{
		cpu: fmt.Sprintf("%.0f ms (%.0f + %.0f; %d cycles, windows %.0f–%.0f)", (pOwn+pKids-own0-kids0)/n, (pOwn-own0)/n, (pKids-kids0)/n,
			pC-c0, perCycle[0], perCycle[len(perCycle)-1]),
		reads:  fmt.Sprintf("%.2f entries, %.2f saves, %.2f decodes", (entries-e0)/n, (saves-s0)/n, (decodes-d0)/n),
		rssMed: rss[len(rss)/2], rssMax: rss[len(rss)-1], hwm: StatusMiB(pid, "VmHWM:"), anon: StatusMiB(pid, "RssAnon:"),
		load: LoadAvg(),
	}
}

// findChild is the PID of the binary: NetNS.Command runs it through
// `ip netns exec`, which execs it (same PID).
func findChild(b *testing.B, cmd *exec.Cmd) int {
	return cmd.Process.Pid
}

func stopProcess(cmd *exec.Cmd) {
	_ = cmd.Process.Signal(syscall.SIGTERM)
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(15 * time.Second):
		_ = cmd.Process.Kill()
		<-done
	}
}

func tailBytes(b []byte, n int) string {
	if len(b) > n {
		b = b[len(b)-n:]
	}
	return string(b)
}
