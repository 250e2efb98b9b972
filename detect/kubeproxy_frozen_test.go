package detect

import (
	"bufio"
	"context"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/remediate-dev/remediate/internal/cluster"
	"github.com/remediate-dev/remediate/internal/finding"
	"github.com/remediate-dev/remediate/internal/iptables"
	"github.com/remediate-dev/remediate/internal/kubeproxy"
	"github.com/remediate-dev/remediate/internal/nftables"
	"github.com/remediate-dev/remediate/internal/procs"
)

// timedOut is what the real client returns for a frozen kube-proxy: the
// connection was accepted by the kernel, nothing answered.
func timedOut(url string) error {
	return &kubeproxy.Error{Kind: kubeproxy.KindUnreachable, URL: url, Err: context.DeadlineExceeded}
}

// freeze makes the drift world's kube-proxy answer nothing, and gives the
// node a proc root of its own (no kube-ipvs0) so the host's interfaces do
// not count.
func (w *driftWorld) freeze(t *testing.T) {
	t.Helper()
	w.kp.SetMode("", timedOut("http://127.0.0.1:10249/proxyMode"))
	w.kp.SetMetricsError(timedOut("http://127.0.0.1:10249/metrics"))
	w.kp.SetHealthzError(timedOut("http://127.0.0.1:10256/healthz"))
	w.kp.SetConfigz(nil, timedOut("http://127.0.0.1:10249/configz"))
	root := t.TempDir()
	if err := os.MkdirAll(filepath.Join(root, "net"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(root, "net", "dev"), []byte("Inter-|   Receive\n face |bytes\n    lo: 0 0\n  eth0: 0 0\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	w.n.ProcRoot = root
}

func (w *driftWorld) addLate(t *testing.T, age time.Duration) {
	t.Helper()
	now := w.clock.Now()
	late := cluster.Service{Namespace: "team", Name: "late", ClusterIPs: []string{"10.96.7.7"}, Created: now.Add(-age), Changed: now.Add(-age),
		Ports: []cluster.ServicePort{{Name: "http", Protocol: "TCP", Port: 80}}}
	w.view.SetService(late, cluster.Endpoint{Address: "10.244.0.9", Port: 8080, Protocol: "TCP", PortName: "http", Ready: true, Serving: true})
}

// A frozen kube-proxy (nothing answers /proxyMode, /configz, /metrics) in
// iptables mode: the mode is read from its KUBE-SVC chains in the legacy
// save, the grace from the policy's syncPeriod, and the Service created
// after it froze is named, with the source in the evidence. On main the
// detector skipped ("cannot read kube-proxy proxy mode").
func TestDataplaneDriftFrozenKubeProxyIPTables(t *testing.T) {
	w := newDriftWorld(t)
	w.freeze(t)
	d, k := newDriftDetectors(t, w)
	w.addLate(t, 100*time.Second) // grace: 3 x the policy's 10 s
	fs := w.detect(t, d)
	if len(fs) != 1 || fs[0].Target != "dataplane/IPv4/team/late:http" || fs[0].Severity != finding.Critical {
		t.Fatalf("frozen kube-proxy, iptables mode: %s %+v", driftTargets(fs), fs)
	}
	ev := fs[0].Evidence
	src, _ := ev["proxyModeSource"].(string)
	if ev["proxyMode"] != "iptables" || !strings.HasPrefix(src, "node: ") || !strings.Contains(src, "KUBE-SVC/KUBE-SVL chains in iptables-legacy-save") ||
		ev["syncPeriodSource"] != "policy (kube-proxy did not answer /proxyMode)" || ev["kubeProxyError"] == nil ||
		!strings.Contains(fs[0].Message, "kube-proxy does not answer") || !strings.Contains(fs[0].Message, "10.244.0.9:8080") {
		t.Fatalf("evidence %+v message %q", ev, fs[0].Message)
	}
	_, err := k.Detect(context.Background())
	if r, ok := finding.IsSkip(err); !ok || !strings.Contains(r, "does not answer") {
		t.Fatalf("KubeProxyNotHearingAPI with a frozen kube-proxy: %v", err)
	}
}

// The same in nftables mode: the mode from its `kube-proxy` table.
func TestDataplaneDriftFrozenKubeProxyNFTables(t *testing.T) {
	w := newDriftWorld(t)
	w.freeze(t)
	w.n.IPTables = iptables.NewFake() // nothing in iptables
	fk := nftables.NewFake()
	if err := fk.SetRuleset(readFile(t, "../internal/nftables/testdata/kube-proxy-v1.34.4-ruleset.json")); err != nil {
		t.Fatal(err)
	}
	w.n.NFTables = fk
	d, _ := newDriftDetectors(t, w)
	w.addLate(t, 100*time.Second)
	fs := w.detect(t, d)
	var late *finding.Finding
	for i := range fs {
		if fs[i].Target == "dataplane/IPv4/team/late:http" {
			late = &fs[i]
		}
	}
	if late == nil || late.Evidence["proxyMode"] != "nftables" || late.Evidence["source"] != "nftables" ||
		!strings.Contains(late.Evidence["proxyModeSource"].(string), "table ip kube-proxy") {
		t.Fatalf("frozen kube-proxy, nftables mode: %s %+v", driftTargets(fs), fs)
	}
}

// Marks of two modes (a mode switch's leftovers) with a frozen kube-proxy:
// no guess, a skip naming both.
func TestDataplaneDriftFrozenKubeProxyAmbiguous(t *testing.T) {
	w := newDriftWorld(t)
	w.freeze(t)
	fk := nftables.NewFake()
	if err := fk.SetRuleset(readFile(t, "../internal/nftables/testdata/kube-proxy-v1.34.4-ruleset.json")); err != nil {
		t.Fatal(err)
	}
	w.n.NFTables = fk
	d, _ := newDriftDetectors(t, w)
	w.addLate(t, 100*time.Second)
	_, err := d.Detect(context.Background())
	if r, ok := finding.IsSkip(err); !ok || !strings.Contains(r, "several modes") || !strings.Contains(r, "iptables (") || !strings.Contains(r, "nftables (table ip kube-proxy") {
		t.Fatalf("ambiguous marks: %v", err)
	}
}

func TestDecideNodeMode(t *testing.T) {
	ask := timedOut("u")
	for _, tc := range []struct {
		name  string
		marks []modeMark
		want  kubeproxy.Mode
		skip  string
	}{
		{"none", nil, "", "no mark of any mode"},
		{"ipvs", []modeMark{{kubeproxy.ModeIPVS, "kube-ipvs0"}}, kubeproxy.ModeIPVS, ""},
		{"nft both families", []modeMark{{kubeproxy.ModeNFTables, "table ip kube-proxy"}, {kubeproxy.ModeNFTables, "table ip6 kube-proxy"}}, kubeproxy.ModeNFTables, ""},
		{"iptables both backends", []modeMark{{kubeproxy.ModeIPTables, "a"}, {kubeproxy.ModeIPTables, "b"}}, kubeproxy.ModeIPTables, ""},
		{"ipvs and iptables", []modeMark{{kubeproxy.ModeIPVS, "kube-ipvs0"}, {kubeproxy.ModeIPTables, "3 chains"}}, "", "several modes"},
	} {
		m, src, err := decideNodeMode(tc.marks, nil, ask)
		if tc.skip != "" {
			if r, ok := finding.IsSkip(err); !ok || !strings.Contains(r, tc.skip) || !strings.Contains(r, "did not tell its mode") {
				t.Errorf("%s: %v", tc.name, err)
			}
			continue
		}
		if err != nil || m != tc.want || !strings.HasPrefix(src, "node: ") {
			t.Errorf("%s: %q %q %v", tc.name, m, src, err)
		}
	}
}

func newFrozenDetector(t *testing.T, w *driftWorld, minSilence time.Duration) Detector {
	t.Helper()
	p := &KubeProxyFrozenParams{}
	p.SetDefaults()
	p.MinSilence.Duration = minSilence
	if errs := p.Validate(); len(errs) > 0 {
		t.Fatal(errs)
	}
	typ, _ := Lookup("KubeProxyFrozen")
	d, err := typ.New(p, w.n)
	if err != nil {
		t.Fatal(err)
	}
	return d
}

func kubeProxyProc(pid int32, created time.Time, state string) procs.FakeProcess {
	return procs.FakeProcess{Process: procs.Process{Pid: pid, PPid: 1, Comm: "kube-proxy", Cmdline: []string{"/usr/local/bin/kube-proxy", "--config=/var/lib/kube-proxy/config.conf"},
		CreateTimeMs: created.UnixMilli(), State: state, CapEff: procs.CapNetAdmin}}
}

// KubeProxyFrozen: silence is counted per process; reported after
// minSilence with the drift it left; an answer, a refused connection, a
// new process, a zombie or a tracer start over or hold back.
func TestKubeProxyFrozen(t *testing.T) {
	w := newDriftWorld(t)
	fp := procs.NewFake(1)
	w.n.Procs = fp
	started := w.clock.Now().Add(-time.Hour)
	fp.Add(kubeProxyProc(4242, started, "T"))
	d := newFrozenDetector(t, w, 2*time.Minute)
	detect := func() ([]finding.Finding, string) {
		t.Helper()
		sharedObservation.Lock()
		sharedObservation.m = map[observationKey]*observationSlot{}
		sharedObservation.Unlock()
		fs, err := d.Detect(context.Background())
		if r, ok := finding.IsSkip(err); ok {
			return nil, r
		}
		if err != nil {
			t.Fatal(err)
		}
		return fs, ""
	}
	// Answering: nothing, judged.
	if fs, skip := detect(); len(fs) != 0 || skip != "" || !strings.Contains(d.(Judged).Judged(), "answered") {
		t.Fatalf("answering kube-proxy: %+v %q", fs, skip)
	}
	w.freeze(t)
	w.addLate(t, 100*time.Second)
	if fs, skip := detect(); len(fs) != 0 || !strings.Contains(skip, "judged frozen after 2m0s") {
		t.Fatalf("first silent probe: %+v %q", fs, skip)
	}
	w.clock.Step(time.Minute)
	if fs, skip := detect(); len(fs) != 0 || skip == "" {
		t.Fatalf("1m of silence: %+v %q", fs, skip)
	}
	w.clock.Step(61 * time.Second)
	fs, skip := detect()
	if len(fs) != 1 || fs[0].Target != "kube-proxy/frozen" || fs[0].Severity != finding.Critical ||
		!strings.Contains(fs[0].Message, "pid 4242, state T (stopped (SIGSTOP))") || !strings.Contains(fs[0].Message, "team/late:http (IPv4)") ||
		fs[0].Evidence["driftedServicePorts"] != 1 || fs[0].Evidence["silentSeconds"] != 121.0 {
		t.Fatalf("after 2m of silence: %+v %q", fs, skip)
	}
	t.Logf("%s", fs[0].Message)

	// A new kube-proxy process (restarted, frozen again): starts over.
	fp.Remove(4242)
	fp.Add(kubeProxyProc(5151, w.clock.Now(), "D"))
	if fs, skip := detect(); len(fs) != 0 || !strings.Contains(skip, "pid 5151, state D") {
		t.Fatalf("new process: %+v %q", fs, skip)
	}
	// A tracer holds it: not judged, and the memory starts over.
	fp.Add(kubeProxyProc(5151, w.clock.Now(), "t"))
	if _, skip := detect(); !strings.Contains(skip, "tracer") {
		t.Fatalf("traced: %q", skip)
	}
	// Zombie: exited, not frozen.
	fp.Add(kubeProxyProc(5151, w.clock.Now(), "Z"))
	if _, skip := detect(); !strings.Contains(skip, "exited") {
		t.Fatalf("zombie: %q", skip)
	}
	// Refused (nothing listens): not silence, never frozen.
	fp.Add(kubeProxyProc(5151, w.clock.Now(), "S"))
	refused := &kubeproxy.Error{Kind: kubeproxy.KindUnreachable, URL: "u", Err: syscall.ECONNREFUSED}
	w.kp.SetMetricsError(refused)
	w.kp.SetHealthzError(refused)
	for i := 0; i < 3; i++ {
		if fs, skip := detect(); len(fs) != 0 || skip != "" {
			t.Fatalf("refused: %+v %q", fs, skip)
		}
		w.clock.Step(2 * time.Minute)
	}
	// No kube-proxy process: cannot tell.
	w.kp.SetMetricsError(timedOut("m"))
	w.kp.SetHealthzError(timedOut("h"))
	fp.Remove(5151)
	if _, skip := detect(); !strings.Contains(skip, "process cannot be told") {
		t.Fatalf("no process: %q", skip)
	}
}

// One endpoint answering (healthz) is not frozen, however long.
func TestKubeProxyFrozenOneEndpointAnswers(t *testing.T) {
	w := newDriftWorld(t)
	fp := procs.NewFake(1)
	w.n.Procs = fp
	fp.Add(kubeProxyProc(4242, w.clock.Now().Add(-time.Hour), "S"))
	w.freeze(t)
	w.kp.SetHealthz(200, `{"lastUpdated": "2026-11-21 12:59:00 +0000 UTC","currentTime": "2026-11-21 13:00:00 +0000 UTC"}`)
	d := newFrozenDetector(t, w, 10*time.Second)
	for i := 0; i < 3; i++ {
		fs, err := d.Detect(context.Background())
		if err != nil || len(fs) != 0 {
			t.Fatalf("healthz answers: %+v %v", fs, err)
		}
		w.clock.Step(time.Minute)
	}
}

func TestKubeProxyFrozenParams(t *testing.T) {
	p := &KubeProxyFrozenParams{}
	p.SetDefaults()
	if errs := p.Validate(); len(errs) != 0 {
		t.Fatal(errs)
	}
	p.MinSilence.Duration = time.Second
	p.MaxServicePorts = 0
	if errs := p.Validate(); len(errs) != 2 {
		t.Fatalf("%v", errs)
	}
}

// hangingKubeProxy is a real listener that accepts connections, reads each
// request line and never answers: a stopped kube-proxy's sockets as the
// kernel keeps them. It records the paths asked.
func hangingKubeProxy(t *testing.T) (addr string, asked func() []string) {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var paths []string
	var conns []net.Conn
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
			go func() {
				line, _ := bufio.NewReader(c).ReadString('\n')
				if f := strings.Fields(line); len(f) > 1 {
					mu.Lock()
					paths = append(paths, f[1])
					mu.Unlock()
				}
			}()
		}
	}()
	t.Cleanup(func() {
		l.Close()
		mu.Lock()
		defer mu.Unlock()
		for _, c := range conns {
			c.Close()
		}
	})
	return l.Addr().String(), func() []string {
		mu.Lock()
		defer mu.Unlock()
		return append([]string(nil), paths...)
	}
}

// With the real client against a kube-proxy that accepts and never
// answers, DataplaneDrift asks /proxyMode once (bounded), then neither
// /configz nor /metrics (same server), and names the drift from the
// node's marks; KubeProxyNotHearingAPI, sharing the observation, asks
// nothing more. On main it skipped after waiting for /proxyMode.
func TestDataplaneDriftRealClientFrozen(t *testing.T) {
	addr, asked := hangingKubeProxy(t)
	w := newDriftWorld(t)
	w.freeze(t)
	kc, err := kubeproxy.New(kubeproxy.Options{MetricsURL: "http://" + addr + "/metrics", HealthzURL: "http://" + addr + "/healthz",
		ProxyModeURL: "http://" + addr + "/proxyMode", SyncPeriod: 10 * time.Second, Timeout: 500 * time.Millisecond, CacheTTL: -1})
	if err != nil {
		t.Fatal(err)
	}
	w.n.KubeProxy = kc
	d, k := newDriftDetectors(t, w)
	w.addLate(t, 100*time.Second)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	start := time.Now()
	fs, err := d.Detect(ctx)
	took := time.Since(start)
	if err != nil || len(fs) != 1 || fs[0].Target != "dataplane/IPv4/team/late:http" {
		t.Fatalf("frozen real kube-proxy: %v %s", err, driftTargets(fs))
	}
	if _, err := k.Detect(ctx); err == nil {
		t.Fatal("KubeProxyNotHearingAPI judged a kube-proxy that does not answer")
	}
	if got := asked(); len(got) != 1 || got[0] != "/proxyMode" {
		t.Fatalf("asked %v, want /proxyMode once", got)
	}
	t.Logf("DataplaneDrift with a hanging kube-proxy: %v (one /proxyMode request, client timeout 500ms)", took.Round(time.Millisecond))
}

// Issue 41: a process that binds kube-proxy's ports first (an impostor
// listening on 127.0.0.1:10249/10256 and answering nothing) leaves the real
// kube-proxy running, sleeping and using CPU: not frozen, however long the
// silence (on main it was judged frozen after minSilence and its pod
// deleted). A kube-proxy using no CPU but not stopped cannot be tied to the
// silent listener without ptrace: not judged either. Stopped (T) with no
// CPU: frozen, with the CPU seconds and the identity in the evidence.
func TestKubeProxyFrozenNeedsNoProgressAndStopped(t *testing.T) {
	w := newDriftWorld(t)
	fp := procs.NewFake(1)
	w.n.Procs = fp
	kp := kubeProxyProc(4242, w.clock.Now().Add(-time.Hour), "S")
	kp.CPUPerRead = 20 // syncing rules, answering nobody (its ports are taken)
	fp.Add(kp)
	d := newFrozenDetector(t, w, 2*time.Minute)
	w.freeze(t)
	detect := func() ([]finding.Finding, string) {
		t.Helper()
		sharedObservation.Lock()
		sharedObservation.m = map[observationKey]*observationSlot{}
		sharedObservation.Unlock()
		fs, err := d.Detect(context.Background())
		if r, ok := finding.IsSkip(err); ok {
			return nil, r
		}
		if err != nil {
			t.Fatal(err)
		}
		return fs, ""
	}
	for i := 0; i < 5; i++ {
		fs, skip := detect()
		if len(fs) != 0 {
			t.Fatalf("a kube-proxy at work judged frozen after %d min: %+v", i, fs[0].Message)
		}
		if i > 0 && !strings.Contains(skip, "is making progress: 0.20 s of CPU in 1m0s: not frozen") {
			t.Fatalf("cycle %d: %q", i, skip)
		}
		w.clock.Step(time.Minute)
	}
	// Idle and sleeping: no CPU, but whose listener is silent is unknown.
	kp.CPUPerRead, kp.CPUTicks = 0, fp.MustGet(4242).CPUTicks+100
	fp.Add(kp)
	for i := 0; i < 4; i++ {
		fs, skip := detect()
		if len(fs) != 0 {
			t.Fatalf("a sleeping kube-proxy judged frozen: %+v", fs[0].Message)
		}
		if i == 3 && !strings.Contains(skip, "it is not stopped (state T) and the socket listening on port 10249 is not kube-proxy's: another process holds it") {
			t.Fatalf("sleeping, no CPU for 3m, an impostor's listener: %q", skip)
		}
		w.clock.Step(time.Minute)
	}
	// Without CAP_SYS_PTRACE its descriptors cannot be read: not judged.
	kp.CPUTicks, kp.NoPtrace = fp.MustGet(4242).CPUTicks, true
	fp.Add(kp)
	if fs, skip := detect(); len(fs) != 0 || !strings.Contains(skip, "without CAP_SYS_PTRACE the listener's socket cannot be tied to kube-proxy's process") {
		t.Fatalf("no ptrace: %+v %q", fs, skip)
	}
	// With it (second opinion), both silent listeners are kube-proxy's
	// own: a deadlocked kube-proxy, frozen though sleeping.
	kp.NoPtrace, kp.Listens = false, []uint16{10249, 10256}
	fp.Add(kp)
	if fs, skip := detect(); len(fs) != 1 || !strings.Contains(fs[0].Message, "state S, its silent listeners its own (its descriptors), no CPU used in 4m0s") {
		t.Fatalf("its own silent listeners: %+v %q", fs, skip)
	}
	kp.Listens = nil
	// SIGSTOPped: frozen.
	kp.State = "T"
	fp.Add(kp)
	fs, skip := detect()
	if len(fs) != 1 || !strings.Contains(fs[0].Message, "stopped (state T), no CPU used in 4m0s; identity: host-cgroup") ||
		fs[0].Evidence["cpuSecondsWhileSilent"] != 0.0 || fs[0].Evidence["identity"] != "host-cgroup" {
		t.Fatalf("stopped: %+v %q", fs, skip)
	}
}
