// Command benchload measures the real remediate binary on a loaded node
// (`make bench-load`, root only): in a network namespace of its own it
// loads a kube-proxy-shaped nat table (about 20,000 rules) into
// iptables-legacy, starts 1,000 extra processes on the host (sleep), runs
// the daemon there with the audit policy at a short interval and no
// cluster access (no kube-proxy either), and prints its CPU per cycle (its
// own plus its waited-for children: the *-save runs) and its RSS. A first
// phase measures the same daemon idle: an empty namespace and no extra
// processes. A third phase adds a writer that rewrites an unchanged nat
// chain through iptables-legacy-restore every interval, taking the xtables
// lock as kube-proxy's periodic sync does: every cycle then reads the
// table's entries (the save itself is still reused).
//
// It deletes the namespace and stops the processes it started (by PID) at
// the end. The numbers go into docs/MEASUREMENTS.md, "The cost of a cycle".
package main

import (
	"bufio"
	"bytes"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"
)

func main() { os.Exit(benchMain()) }

// benchMain runs the benchmark and returns the exit status; deferred
// cleanups run before the process exits.
func benchMain() int {
	status := 0
	bin := flag.String("bin", "bin/remediate", "the remediate binary to measure")
	policy := flag.String("policy", "examples/audit.yaml", "policy (its interval is replaced by -interval)")
	services := flag.Int("services", 2500, "Services in the generated nat table (8 rules each: about 20k rules)")
	procs := flag.Int("procs", 1000, "extra processes started on the host")
	interval := flag.Duration("interval", 2*time.Second, "the daemon's detection interval")
	cycles := flag.Int("cycles", 20, "cycles measured per phase (after 3 warm-up cycles)")
	scrape := flag.String("scrape", "", "internal: print this URL's body (run inside the namespace)")
	idlePhase := flag.Bool("idle", true, "measure the idle phase too")
	printRules := flag.Bool("print-rules", false, "print the generated save text (for iptables-legacy-restore) and exit")
	flag.Parse()
	if *scrape != "" {
		return get(*scrape)
	}
	if *printRules {
		fmt.Print(natTable(*services))
		return 0
	}
	if os.Geteuid() != 0 {
		fatalf("needs root (network namespaces, iptables-legacy-restore)")
	}
	for _, c := range []string{"ip", "nsenter", "iptables-legacy-restore", "sleep"} {
		if _, err := exec.LookPath(c); err != nil {
			fatalf("needs %s: %v", c, err)
		}
	}
	absBin, err := filepath.Abs(*bin)
	if err != nil {
		fatalf("%v", err)
	}
	tmp, err := os.MkdirTemp("", "benchload-")
	if err != nil {
		fatalf("%v", err)
	}
	defer os.RemoveAll(tmp)
	pol, err := os.ReadFile(*policy)
	if err != nil {
		fatalf("%v", err)
	}
	pol = regexp.MustCompile(`(?m)^interval: .*$`).ReplaceAll(pol, []byte("interval: "+interval.String()+"\ndetectorTimeout: "+(*interval/2).String()+"\nactionTimeout: "+(*interval/2).String()))
	pol = regexp.MustCompile(`(?m)^jitter: .*$`).ReplaceAll(pol, []byte("jitter: 0"))
	polFile := filepath.Join(tmp, "policy.yaml")
	must(os.WriteFile(polFile, pol, 0o644))

	fmt.Printf("machine: %s, %d cores (%s), %s\n", hostname(), runtime.NumCPU(), cpuModel(), kernel())
	fmt.Printf("binary: %s; policy %s at interval %v; load average at start %s\n", *bin, *policy, *interval, loadavg())

	ns := fmt.Sprintf("rmdbench-%d", os.Getpid())
	run("ip", "netns", "add", ns)
	defer run("ip", "netns", "del", ns)
	run("ip", "netns", "exec", ns, "ip", "link", "set", "lo", "up")

	var results []result
	if *idlePhase {
		results = append(results, measure(absBin, ns, polFile, tmp, "idle", *interval, *cycles))
	}

	text := natTable(*services)
	restore := exec.Command("ip", "netns", "exec", ns, "iptables-legacy-restore", "-w", "5")
	restore.Env = append(os.Environ(), "XTABLES_LOCKFILE="+filepath.Join(tmp, "xtables.lock"))
	restore.Stdin = strings.NewReader(text)
	if out, err := restore.CombinedOutput(); err != nil {
		fatalf("iptables-legacy-restore: %v: %s", err, out)
	}
	fmt.Printf("loaded %d nat rules (%d bytes of save text) into iptables-legacy in %s\n", strings.Count(text, "\n-A "), len(text), ns)
	var pids []*exec.Cmd
	for i := 0; i < *procs; i++ {
		c := exec.Command("sleep", "3600")
		if err := c.Start(); err != nil {
			fatalf("starting sleep: %v", err)
		}
		pids = append(pids, c)
	}
	defer func() {
		for _, c := range pids {
			_ = c.Process.Signal(syscall.SIGTERM)
			_, _ = c.Process.Wait()
		}
	}()
	fmt.Printf("started %d extra processes (sleep); processes on the host now: %d\n", *procs, countProcs())
	results = append(results, measure(absBin, ns, polFile, tmp, "loaded", *interval, *cycles))
	// The writer reports its error instead of exiting from its goroutine:
	// the deferred cleanups (the namespace, the sleep processes) must run.
	stop := make(chan struct{})
	done := make(chan error, 1)
	go func() { // the writer: an unchanged KUBE-MARK-MASQ, as a sync that changes nothing
		t := time.NewTicker(*interval)
		defer t.Stop()
		for {
			w := exec.Command("ip", "netns", "exec", ns, "iptables-legacy-restore", "-w", "5", "--noflush")
			w.Env = append(os.Environ(), "XTABLES_LOCKFILE="+filepath.Join(tmp, "xtables.lock"))
			w.Stdin = strings.NewReader("*nat\n:KUBE-MARK-MASQ - [0:0]\n-A KUBE-MARK-MASQ -j MARK --set-xmark 0x4000/0x4000\nCOMMIT\n")
			if out, err := w.CombinedOutput(); err != nil {
				done <- fmt.Errorf("writer: %v: %s", err, out)
				return
			}
			select {
			case <-stop:
				done <- nil
				return
			case <-t.C:
			}
		}
	}()
	results = append(results, measure(absBin, ns, polFile, tmp, "loaded, a lock-taking writer every interval", *interval, *cycles))
	close(stop)
	if err := <-done; err != nil {
		fmt.Fprintf(os.Stderr, "benchload: %v (the last phase's figures are without it)\n", err)
		status = 1
	}

	fmt.Println()
	fmt.Println("| phase | CPU per cycle (mean) | legacy reads per cycle | RSS median / max | anonymous + file at the end |")
	fmt.Println("|---|---|---|---|---|")
	for _, r := range results {
		fmt.Printf("| %s | %s | %s | %.1f / %.1f MiB | %.1f + %.1f MiB |\n", r.phase, r.cpu, r.reads, r.rssMed, r.rssMax, r.anon, r.file)
	}
	return status
}

type result struct {
	phase          string
	cpu            string
	reads          string // legacy IPv4 entry reads and saves per cycle
	rssMed, rssMax float64
	anon, file     float64 // at the end: anonymous (heap, stacks) and file-backed (the binary)
}

// measure runs the daemon in the namespace until warm-up plus cycles
// cycles completed, sampling its CPU (own + children) and RSS after each.
func measure(bin, ns, pol, tmp, phase string, interval time.Duration, cycles int) result {
	state := filepath.Join(tmp, "state-"+phase)
	must(os.MkdirAll(state, 0o755))
	addr := "127.0.0.1:19808"
	cmd := exec.Command("nsenter", "--net=/var/run/netns/"+ns, bin,
		"--policy", pol, "--state-dir", state, "--node-name", "benchload",
		"--metrics-addr", addr, "--xtables-lock", filepath.Join(tmp, "xtables.lock"), "--log-level", "warn")
	cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "HOME=" + tmp} // no KUBECONFIG, no GOMEMLIMIT
	if p := os.Getenv("REMEDIATE_CPUPROFILE"); p != "" {
		cmd.Env = append(cmd.Env, "REMEDIATE_CPUPROFILE="+p) // a local profiling hook, if built in
	}
	var logs bytes.Buffer
	cmd.Stdout, cmd.Stderr = &logs, &logs
	if err := cmd.Start(); err != nil {
		fatalf("starting %s: %v", bin, err)
	}
	defer func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		done := make(chan struct{})
		go func() { _ = cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			_ = cmd.Process.Kill()
			<-done
		}
	}()
	pid := cmd.Process.Pid // nsenter execs the binary: same PID
	self, _ := os.Executable()
	var entries, saves float64 // of the last scrape
	count := func() int {
		out, err := exec.Command("nsenter", "--net=/var/run/netns/"+ns, self, "-scrape", "http://"+addr+"/metrics").Output()
		if err != nil {
			return -1
		}
		n := -1
		for _, l := range strings.Split(string(out), "\n") {
			f := strings.Fields(l)
			if len(f) != 2 {
				continue
			}
			v, _ := strconv.ParseFloat(f[1], 64)
			switch f[0] {
			case "remediate_cycle_duration_seconds_count":
				n = int(v)
			case `remediate_iptables_reads_total{backend="legacy",ip_family="IPv4",read="entries"}`:
				entries = v
			case `remediate_iptables_reads_total{backend="legacy",ip_family="IPv4",read="save"}`:
				saves = v
			}
		}
		return n
	}
	wait := func(n int) int {
		deadline := time.Now().Add(time.Duration(n+5) * (interval + 2*time.Second))
		for time.Now().Before(deadline) {
			if c := count(); c >= n {
				return c
			}
			time.Sleep(interval / 4)
		}
		fatalf("%s: %d cycles not reached; daemon log:\n%s", phase, n, logs.String())
		return 0
	}
	const warm = 3
	c0 := wait(warm)
	own0, kids0 := cpuTicks(pid)
	entries0, saves0 := entries, saves
	// Windows of 5 cycles: the poll for the cycle count is a scrape of
	// the daemon's /metrics, work we should not charge to its cycles.
	const window = 5
	var perCycle, rss []float64
	prevOwn, prevKids, prevC := own0, kids0, c0
	for i := 0; i < (cycles+window-1)/window; i++ {
		time.Sleep(time.Duration(window-1) * interval)
		c := wait(prevC + window)
		own, kids := cpuTicks(pid)
		perCycle = append(perCycle, float64(own+kids-prevOwn-prevKids)*1000/clkTck/float64(c-prevC))
		rss = append(rss, rssMiB(pid))
		prevOwn, prevKids, prevC = own, kids, c
	}
	n := float64(prevC - c0)
	if dir := os.Getenv("BENCHLOAD_SMAPS_DIR"); dir != "" { // where the RSS is, per mapping
		if b, err := os.ReadFile(fmt.Sprintf("/proc/%d/smaps", pid)); err == nil {
			_ = os.WriteFile(filepath.Join(dir, strings.Fields(phase)[0]+".smaps"), b, 0o644)
		}
	}
	ownMs := float64(prevOwn-own0) * 1000 / clkTck / n
	kidsMs := float64(prevKids-kids0) * 1000 / clkTck / n
	sort.Float64s(perCycle)
	sort.Float64s(rss)
	r := result{
		phase: phase,
		cpu: fmt.Sprintf("%.0f ms (%.0f own + %.0f children, over %d cycles; %d-cycle windows %.0f–%.0f)", ownMs+kidsMs, ownMs, kidsMs, prevC-c0,
			window, perCycle[0], perCycle[len(perCycle)-1]),
		reads:  fmt.Sprintf("%.2f entries, %.2f saves", (entries-entries0)/n, (saves-saves0)/n),
		rssMed: rss[len(rss)/2], rssMax: rss[len(rss)-1],
		anon: statusMiB(pid, "RssAnon:"), file: statusMiB(pid, "RssFile:"),
	}
	fmt.Printf("%s: CPU per cycle %s; legacy reads per cycle %s; RSS %.1f MiB median, %.1f max (at the end %.1f anonymous + %.1f file); load average %s\n", phase, r.cpu, r.reads, r.rssMed, r.rssMax, r.anon, r.file, loadavg())
	return r
}

// clkTck is USER_HZ, the unit of /proc/PID/stat times (100 on Linux).
const clkTck = 100

// cpuTicks is utime+stime and cutime+cstime (waited-for children) of pid.
func cpuTicks(pid int) (own, children int64) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		fatalf("%v", err)
	}
	s := string(b)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+2:])
	var t [4]int64
	for i := range t { // fields 14-17, counted from field 3
		t[i], _ = strconv.ParseInt(f[11+i], 10, 64)
	}
	return t[0] + t[1], t[2] + t[3]
}

func rssMiB(pid int) float64 { return statusMiB(pid, "VmRSS:") }

func statusMiB(pid int, key string) float64 {
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		fatalf("%v", err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if l := sc.Text(); strings.HasPrefix(l, key) {
			kb, _ := strconv.Atoi(strings.Fields(l)[1])
			return float64(kb) / 1024
		}
	}
	return 0
}

// natTable is a kube-proxy v1.34-shaped save (filter and nat) with n
// Services of two endpoints each: 8 nat rules per Service.
func natTable(n int) string {
	var b, rules strings.Builder
	b.WriteString("*filter\n:INPUT ACCEPT [0:0]\n:FORWARD ACCEPT [0:0]\n:OUTPUT ACCEPT [0:0]\n:KUBE-EXTERNAL-SERVICES - [0:0]\n:KUBE-FIREWALL - [0:0]\n:KUBE-FORWARD - [0:0]\n:KUBE-NODEPORTS - [0:0]\n:KUBE-PROXY-FIREWALL - [0:0]\n:KUBE-SERVICES - [0:0]\n" +
		"-A INPUT -j KUBE-FIREWALL\n-A INPUT -m conntrack --ctstate NEW -m comment --comment \"kubernetes load balancer firewall\" -j KUBE-PROXY-FIREWALL\n" +
		"-A INPUT -m comment --comment \"kubernetes health check service ports\" -j KUBE-NODEPORTS\n-A INPUT -m conntrack --ctstate NEW -m comment --comment \"kubernetes externally-visible service portals\" -j KUBE-EXTERNAL-SERVICES\n" +
		"-A FORWARD -m comment --comment \"kubernetes forwarding rules\" -j KUBE-FORWARD\n-A FORWARD -m conntrack --ctstate NEW -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES\n" +
		"-A OUTPUT -j KUBE-FIREWALL\n-A OUTPUT -m conntrack --ctstate NEW -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES\n" +
		"-A KUBE-FIREWALL ! -s 127.0.0.0/8 -d 127.0.0.0/8 -m comment --comment \"block incoming localnet connections\" -m conntrack ! --ctstate RELATED,ESTABLISHED,DNAT -j DROP\n" +
		"-A KUBE-FORWARD -m comment --comment \"kubernetes forwarding rules\" -m mark --mark 0x4000/0x4000 -j ACCEPT\n" +
		"-A KUBE-FORWARD -m comment --comment \"kubernetes forwarding conntrack rule\" -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT\nCOMMIT\n")
	b.WriteString("*nat\n:PREROUTING ACCEPT [0:0]\n:INPUT ACCEPT [0:0]\n:OUTPUT ACCEPT [0:0]\n:POSTROUTING ACCEPT [0:0]\n:KUBE-MARK-MASQ - [0:0]\n:KUBE-NODEPORTS - [0:0]\n:KUBE-POSTROUTING - [0:0]\n:KUBE-SERVICES - [0:0]\n")
	rules.WriteString("-A PREROUTING -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES\n-A OUTPUT -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES\n" +
		"-A POSTROUTING -m comment --comment \"kubernetes postrouting rules\" -j KUBE-POSTROUTING\n-A KUBE-MARK-MASQ -j MARK --set-xmark 0x4000/0x4000\n" +
		"-A KUBE-POSTROUTING -m mark ! --mark 0x4000/0x4000 -j RETURN\n-A KUBE-POSTROUTING -j MARK --set-xmark 0x4000/0x0\n" +
		"-A KUBE-POSTROUTING -m comment --comment \"kubernetes service traffic requiring SNAT\" -j MASQUERADE --random-fully\n")
	for i := 0; i < n; i++ {
		name := fmt.Sprintf("ns%d/svc%d:http", i%50, i)
		vip := fmt.Sprintf("10.96.%d.%d", i/250, i%250+1)
		svc := fmt.Sprintf("KUBE-SVC-%016X", uint64(i)*2654435761)
		fmt.Fprintf(&b, ":%s - [0:0]\n", svc)
		fmt.Fprintf(&rules, "-A KUBE-SERVICES -d %s/32 -p tcp -m comment --comment \"%s cluster IP\" -m tcp --dport 80 -j %s\n", vip, name, svc)
		fmt.Fprintf(&rules, "-A %s ! -s 10.244.0.0/16 -d %s/32 -p tcp -m comment --comment \"%s cluster IP\" -m tcp --dport 80 -j KUBE-MARK-MASQ\n", svc, vip, name)
		for j := 0; j < 2; j++ {
			k := 2*i + j
			addr := fmt.Sprintf("10.244.%d.%d", k/250, k%250+1)
			sep := fmt.Sprintf("KUBE-SEP-%016X", uint64(k)*40503+7)
			fmt.Fprintf(&b, ":%s - [0:0]\n", sep)
			prob := ""
			if j == 0 {
				prob = " -m statistic --mode random --probability 0.50000000000"
			}
			fmt.Fprintf(&rules, "-A %s -m comment --comment \"%s -> %s:8080\"%s -j %s\n", svc, name, addr, prob, sep)
			fmt.Fprintf(&rules, "-A %s -s %s/32 -m comment --comment \"%s\" -j KUBE-MARK-MASQ\n", sep, addr, name)
			fmt.Fprintf(&rules, "-A %s -p tcp -m comment --comment \"%s\" -m tcp -j DNAT --to-destination %s:8080\n", sep, name, addr)
		}
	}
	rules.WriteString("-A KUBE-SERVICES -m comment --comment \"kubernetes service nodeports; NOTE: this must be the last rule in this chain\" -m addrtype --dst-type LOCAL -j KUBE-NODEPORTS\n")
	b.WriteString(rules.String())
	b.WriteString("COMMIT\n")
	return b.String()
}

func get(url string) int {
	// Uncompressed: gzip would be work the daemon does for us only.
	c := http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{DisableCompression: true}}
	resp, err := c.Get(url)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer resp.Body.Close()
	_, _ = io.Copy(os.Stdout, resp.Body)
	return 0
}

func run(args ...string) {
	if out, err := exec.Command(args[0], args[1:]...).CombinedOutput(); err != nil {
		fatalf("%s: %v: %s", strings.Join(args, " "), err, out)
	}
}

func countProcs() int {
	ents, _ := os.ReadDir("/proc")
	n := 0
	for _, e := range ents {
		if _, err := strconv.Atoi(e.Name()); err == nil {
			n++
		}
	}
	return n
}

func hostname() string { h, _ := os.Hostname(); return h }

func loadavg() string {
	b, _ := os.ReadFile("/proc/loadavg")
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "?"
	}
	return strings.Join(f[:3], " ")
}

func kernel() string {
	b, _ := os.ReadFile("/proc/sys/kernel/osrelease")
	return "Linux " + strings.TrimSpace(string(b))
}

func cpuModel() string {
	b, _ := os.ReadFile("/proc/cpuinfo")
	for _, l := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(l, "model name") {
			if i := strings.IndexByte(l, ':'); i >= 0 {
				return strings.TrimSpace(l[i+1:])
			}
		}
	}
	return "unknown CPU"
}

func must(err error) {
	if err != nil {
		fatalf("%v", err)
	}
}

func fatalf(format string, a ...any) {
	fmt.Fprintf(os.Stderr, "benchload: "+format+"\n", a...)
	os.Exit(1)
}
