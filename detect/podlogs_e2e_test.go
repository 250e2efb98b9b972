package detect

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"
	"k8s.io/utils/clock"

	"github.com/remediate-dev/remediate/internal/causes"
	"github.com/remediate-dev/remediate/internal/cluster"
	"github.com/remediate-dev/remediate/internal/cluster/clustertest"
	"github.com/remediate-dev/remediate/internal/finding"
	"github.com/remediate-dev/remediate/internal/kubeproxy"
	"github.com/remediate-dev/remediate/internal/node"
	"github.com/remediate-dev/remediate/internal/podlogs"
	"github.com/remediate-dev/remediate/internal/testing/controlplane"
)

// criLog copies what a process wrote to its log file since the last call
// into a CRI log file, each line stamped with the time it is copied (a
// container runtime stamps a line when it receives it) as
// "<RFC3339Nano> stderr F <line>".
type criLog struct {
	src, dst string
	off      int64
}

func (c *criLog) sync(t *testing.T) {
	t.Helper()
	f, err := os.Open(c.src)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.Seek(c.off, io.SeekStart); err != nil {
		t.Fatal(err)
	}
	b, err := io.ReadAll(f)
	if err != nil {
		t.Fatal(err)
	}
	i := strings.LastIndexByte(string(b), '\n')
	if i < 0 {
		return
	}
	c.off += int64(i + 1)
	out, err := os.OpenFile(c.dst, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	defer out.Close()
	now := time.Now().UTC().Format(time.RFC3339Nano)
	for _, l := range strings.Split(string(b[:i]), "\n") {
		fmt.Fprintf(out, "%s stderr F %s\n", now, l)
	}
}

// TestE2EKubeProxyLogCauses: the real kube-proxy v1.34.4 (iptables-legacy
// mode, its own xtables lock file) is stalled by another process holding
// the lock (flock, as in TestE2EKubeProxyLockStall) while an EndpointSlice
// changes. Its iptables-restore fails, and kube-proxy logs iptables' own
// lock message. Its stderr is written, as the kubelet does, under a
// test-owned pod log directory for the kube-proxy DaemonSet pod of the pod
// view. The stall's finding (KubeProxyRestoreFailures or
// KubeProxySyncStale, whichever kube-proxy's failing sync makes) has
// log-xtables-lock as its top likely cause, quoting that real line, and
// XtablesLockMessages reports the rate (more than one a minute).
func TestE2EKubeProxyLogCauses(t *testing.T) {
	const (
		syncPeriod = 10 * time.Second
		interval   = 2 * time.Second
	)
	cp := controlplane.Shared(t)
	ns := cp.Namespace("podlogs-e2e")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	createWebService(ctx, t, cp, ns)
	kp := cp.StartKubeProxy(controlplane.KubeProxyOptions{SyncPeriod: syncPeriod})

	logRoot := t.TempDir()
	pod := cluster.Pod{Namespace: "kube-system", Name: "kube-proxy-e2e", UID: "3f1e2d4c-0000-4000-8000-podlogse2e01",
		Labels: map[string]string{"k8s-app": "kube-proxy"}, ControllerKind: "DaemonSet", ControllerName: "kube-proxy",
		Containers: []cluster.ContainerStatus{{Name: "kube-proxy", Ready: true}}}
	dir := filepath.Join(logRoot, pod.Namespace+"_"+pod.Name+"_"+pod.UID, "kube-proxy")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	cri := &criLog{src: kp.LogPath, dst: filepath.Join(dir, "0.log")}
	pods := clustertest.NewPods(time.Now())
	pods.Set(pod)

	client := kp.Client(kubeproxy.Options{SyncPeriod: syncPeriod, Timeout: 2 * time.Second, CacheTTL: time.Second})
	n := &node.Node{Name: kp.NodeName, ProcRoot: "/proc", Clock: clock.RealClock{}, Log: zap.NewNop(), KubeProxy: client,
		Pods: pods, PodLogs: podlogs.Dir{Root: logRoot},
		Unavailable: map[string]string{node.SubsystemHostRoot: "not needed"}}
	// kube-proxy's failed syncs are either restore failures (a partial
	// sync's iptables-restore timed out on the lock) or, for a full sync,
	// a failure to create its chains before any restore (iptables -N
	// timed out on the lock): its sync stalls either way. Both findings
	// rank the log's causes.
	symptoms := map[string]Detector{}
	for _, name := range []string{"KubeProxyRestoreFailures", "KubeProxySyncStale"} {
		symptoms[name] = newDetector(t, name, n, func(p any) {
			if p, ok := p.(*KubeProxyRestoreFailuresParams); ok {
				p.Window.Duration = 2 * syncPeriod
			}
		})
	}
	lockMsgs := newDetector(t, "XtablesLockMessages", n, nil)

	cri.sync(t)
	if fs, err := lockMsgs.Detect(ctx); err != nil || len(fs) != 0 {
		t.Fatalf("healthy kube-proxy: XtablesLockMessages %+v %v", fs, err)
	}
	holder := controlplane.HoldLock(t, kp.XtablesLock)
	defer holder.Release(t)
	start := time.Now()
	addEndpoint(ctx, t, cp, ns, "10.244.0.9")
	var restoreF, lockF *finding.Finding
	for restoreF == nil || lockF == nil {
		if time.Since(start) > 3*time.Minute {
			t.Fatalf("after %v: symptom finding %+v, lock-messages finding %+v", time.Since(start).Round(time.Second), restoreF, lockF)
		}
		time.Sleep(interval)
		cri.sync(t)
		for name, d := range symptoms {
			fs, err := d.Detect(ctx)
			if err != nil {
				t.Fatalf("%s: %v", name, err)
			}
			for i := range fs {
				top, _ := fs[i].Evidence[causes.EvidenceTop].(string)
				t.Logf("+%v %s %s: top cause %q", time.Since(start).Round(time.Second), name, fs[i].Target, top)
				if strings.Contains(top, "xtables lock") {
					restoreF = &fs[i]
				}
			}
		}
		if lfs, err := lockMsgs.Detect(ctx); err != nil {
			t.Fatalf("XtablesLockMessages: %v", err)
		} else if len(lfs) > 0 {
			lockF = &lfs[0]
		}
	}
	t.Logf("after %v: %s: %s\n  top cause: %s\n  %s", time.Since(start).Round(time.Second), restoreF.Detector, restoreF.Message, restoreF.Evidence[causes.EvidenceTop], lockF.Message)

	// The quote is a line the real kube-proxy wrote, as Quote renders it.
	raw, err := os.ReadFile(kp.LogPath)
	if err != nil {
		t.Fatal(err)
	}
	quote, _ := lockF.Evidence["quote"].(string)
	found := false
	for _, l := range strings.Split(string(raw), "\n") {
		if podlogs.Quote(l) == quote && strings.Contains(l, "holding the xtables lock") {
			found = true
		}
	}
	if !found {
		t.Errorf("quote %q is not a line of kube-proxy's log", quote)
	}
	top := restoreF.Evidence[causes.EvidenceTop].(string)
	if !strings.Contains(top, quote) || !strings.Contains(top, "kube-proxy pod kube-system/kube-proxy-e2e container kube-proxy") {
		t.Errorf("top cause %q does not quote %q from kube-proxy's pod", top, quote)
	}
	likely := restoreF.Evidence[causes.EvidenceLikely].([]causes.Cause)
	if likely[0].Kind != causes.LogXtablesLock {
		t.Errorf("likely causes %+v: want log-xtables-lock first", likely)
	}
	if lockF.Target != "kube-proxy" || lockF.Evidence["perMinute"].(float64) <= 1 {
		t.Errorf("lock messages finding %+v", lockF)
	}
}

// TestE2EKubeProxyMissingExtensionCause replays kubernetes/kubernetes#142068
// with the real kube-proxy v1.34.4 (iptables-legacy mode): its iptables
// cannot load the nfacct match (XTABLES_LIBDIR is a copy of the host's
// extension directory without libxt_nfacct.so, as an image built without
// it), so every restore of its rules fails with iptables' own "Couldn't
// load match `nfacct'" while the kernel has xt_nfacct. The restore
// failures' finding names that as its top likely cause, quoting the real
// line, and says the kernel has the match: the image lacks the extension.
func TestE2EKubeProxyMissingExtensionCause(t *testing.T) {
	const syncPeriod = 10 * time.Second
	ext, _ := filepath.Glob("/usr/lib/*/xtables/libxt_nfacct.so")
	if len(ext) != 1 {
		t.Skipf("the host's iptables has no single nfacct extension to leave out: %v", ext)
	}
	libDir := t.TempDir()
	entries, err := os.ReadDir(filepath.Dir(ext[0]))
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if e.Name() == "libxt_nfacct.so" {
			continue
		}
		if err := os.Symlink(filepath.Join(filepath.Dir(ext[0]), e.Name()), filepath.Join(libDir, e.Name())); err != nil {
			t.Fatal(err)
		}
	}
	cp := controlplane.Shared(t)
	ns := cp.Namespace("podlogs-nfacct")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	createWebService(ctx, t, cp, ns)
	kp := cp.StartKubeProxy(controlplane.KubeProxyOptions{SyncPeriod: syncPeriod})
	// The healthy kube-proxy programs nfacct rules on this kernel: the
	// replay needs them.
	save, err := cp.NetNS.Command("iptables-legacy-save", "-t", "filter").Output()
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(save), "-m nfacct") {
		t.Skip("kube-proxy programs no nfacct rule here (no nfnetlink_acct in this kernel)")
	}

	logRoot := t.TempDir()
	pod := cluster.Pod{Namespace: "kube-system", Name: "kube-proxy-nfacct", UID: "3f1e2d4c-0000-4000-8000-podlogse2e02",
		Labels: map[string]string{"k8s-app": "kube-proxy"}, ControllerKind: "DaemonSet", ControllerName: "kube-proxy",
		Containers: []cluster.ContainerStatus{{Name: "kube-proxy", Ready: true}}}
	dir := filepath.Join(logRoot, pod.Namespace+"_"+pod.Name+"_"+pod.UID, "kube-proxy")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	pods := clustertest.NewPods(time.Now())
	pods.Set(pod)
	client := kp.Client(kubeproxy.Options{SyncPeriod: syncPeriod, Timeout: 2 * time.Second, CacheTTL: time.Second})
	n := &node.Node{Name: kp.NodeName, ProcRoot: "/proc", Clock: clock.RealClock{}, Log: zap.NewNop(), KubeProxy: client,
		Pods: pods, PodLogs: podlogs.Dir{Root: logRoot},
		Unavailable: map[string]string{node.SubsystemHostRoot: "not needed"}}
	d := newDetector(t, "KubeProxyRestoreFailures", n, func(p any) {
		if p, ok := p.(*KubeProxyRestoreFailuresParams); ok {
			p.Window.Duration = 4 * syncPeriod
		}
	})

	kp.RestartWithEnv("XTABLES_LIBDIR=" + libDir)
	// The log from the restarted process on: the new kube-proxy's lines.
	cri := &criLog{src: kp.LogPath, dst: filepath.Join(dir, "0.log")}
	if fi, err := os.Stat(kp.LogPath); err == nil {
		cri.off = fi.Size()
	}
	start := time.Now()
	// The restarted kube-proxy's first restore fails; kube-proxy v1.34.4
	// logs "Sync failed" retryingTime="10s" but (observed here) restores
	// again only on the next change: the detector's first run is its
	// baseline, then an endpoint is added and each later change fails.
	for {
		raw, err := os.ReadFile(kp.LogPath)
		if err != nil {
			t.Fatal(err)
		}
		if strings.Count(string(raw), "Couldn't load match `nfacct'") >= 1 {
			break
		}
		if time.Since(start) > 2*time.Minute {
			t.Fatalf("the restarted kube-proxy logged no nfacct failure in %v", time.Since(start).Round(time.Second))
		}
		time.Sleep(time.Second)
	}
	cri.sync(t)
	if _, err := d.Detect(ctx); err != nil {
		t.Fatal(err)
	}
	addEndpoint(ctx, t, cp, ns, "10.244.0.9")
	var f *finding.Finding
	for f == nil {
		if time.Since(start) > 3*time.Minute {
			t.Fatalf("no restore-failures finding naming nfacct after %v", time.Since(start).Round(time.Second))
		}
		time.Sleep(2 * time.Second)
		cri.sync(t)
		fs, err := d.Detect(ctx)
		if err != nil {
			t.Logf("+%v: %v", time.Since(start).Round(time.Second), err)
			continue
		}
		for i := range fs {
			top, _ := fs[i].Evidence[causes.EvidenceTop].(string)
			t.Logf("+%v %s: top cause %q", time.Since(start).Round(time.Second), fs[i].Target, top)
			if strings.Contains(top, "nfacct") {
				f = &fs[i]
			}
		}
	}
	likely := f.Evidence[causes.EvidenceLikely].([]causes.Cause)
	top := f.Evidence[causes.EvidenceTop].(string)
	t.Logf("after %v: %s\n  top cause: %s", time.Since(start).Round(time.Second), f.Message, top)
	if likely[0].Kind != causes.LogMissingExtension || !strings.Contains(top, `cannot load match "nfacct"`) ||
		!strings.Contains(top, "kube-proxy pod kube-system/kube-proxy-nfacct container kube-proxy") {
		t.Errorf("likely causes %+v: want log-missing-extension (match nfacct, kube-proxy's pod) first", likely)
	}
	// The kernel has the match (it is in /proc/net/ip_tables_matches, or
	// built in): the finding says the image lacks the extension.
	if !strings.Contains(top, "the kernel has it") {
		t.Errorf("top cause %q: want the kernel's xt_nfacct named present", top)
	}
	// The quote is a line the real kube-proxy wrote.
	raw, err := os.ReadFile(kp.LogPath)
	if err != nil {
		t.Fatal(err)
	}
	quoted := false
	for _, l := range strings.Split(string(raw), "\n") {
		if strings.Contains(l, "Couldn't load match `nfacct'") && strings.Contains(top, podlogs.Quote(l)) {
			quoted = true
		}
	}
	if !quoted {
		t.Errorf("top cause %q quotes no line of kube-proxy's log naming nfacct", top)
	}
}
