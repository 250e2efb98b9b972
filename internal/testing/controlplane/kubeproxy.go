package controlplane

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// KubeProxyOptions configures StartKubeProxy. The zero value is fine.
type KubeProxyOptions struct {
	// NodeName is kube-proxy's hostnameOverride and the Node object the
	// harness creates (default "node1").
	NodeName string
	// SyncPeriod is iptables.syncPeriod (default 10 s, short for tests;
	// kube-proxy's /healthz turns unhealthy after 2 x SyncPeriod).
	SyncPeriod time.Duration
	// MinSyncPeriod is iptables.minSyncPeriod (default 1 s).
	MinSyncPeriod time.Duration
	// ReadyTimeout bounds the wait for the first successful sync (default
	// 3 minutes: the wait ends as soon as it synced, typically in seconds;
	// 60 s was too short on a machine at load ~100).
	ReadyTimeout time.Duration
	// APIServerURL is the server in kube-proxy's kubeconfig (default
	// APIServerURL); point it at a proxy inside the namespace to control
	// kube-proxy's API connection.
	APIServerURL string
	// Mode is kube-proxy's proxy mode: "iptables" (default) or
	// "nftables" (needs the nft command, Debian package nftables; it then
	// owns `table ip kube-proxy` and `table ip6 kube-proxy` in the
	// namespace).
	Mode string
	// ClusterCIDR is its clusterCIDR (default none: no local-traffic
	// detection). Traffic to a ClusterIP from outside it is marked for
	// masquerade, as on a real node.
	ClusterCIDR string
}

// KubeProxy is a running kube-proxy in iptables mode (iptables-legacy, so
// that it honours the xtables lock) or nftables mode inside the control
// plane's namespace.
type KubeProxy struct {
	*Process
	// NodeName is its hostnameOverride.
	NodeName string
	// Mode is its proxy mode (iptables or nftables).
	Mode string
	// SyncPeriod is its configured iptables.syncPeriod.
	SyncPeriod time.Duration
	// MetricsURL, HealthzURL and ProxyModeURL are its endpoints on the
	// namespace's loopback; reach them with NetNS.HTTPClient.
	MetricsURL, HealthzURL, ProxyModeURL string
	// XtablesLock is the private lock file kube-proxy's iptables-legacy
	// commands use (XTABLES_LOCKFILE); hold it with HoldLock to stall it.
	XtablesLock string
	// ConfigPath is its KubeProxyConfiguration file.
	ConfigPath string
	// PathDir is the folder put first in its PATH, holding iptables,
	// iptables-save, iptables-restore (and ip6tables*) symlinks to the
	// legacy binaries. Run tools with Env to see what kube-proxy sees.
	PathDir string

	cp   *ControlPlane
	args []string
	env  []string
}

// StartKubeProxy creates the Node object (InternalIP = cp.NodeAddress, so
// IPv6 in an IPv6 cluster), writes a kubeconfig (user system:kube-proxy) and a
// KubeProxyConfiguration, starts kube-proxy in the namespace and waits until
// its first sync succeeded (WaitHealthy). It is stopped by PID in
// t.Cleanup.
func (cp *ControlPlane) StartKubeProxy(opts KubeProxyOptions) *KubeProxy {
	t := cp.t
	t.Helper()
	findBinDir(t, cp.BinDir, "kube-proxy")
	if opts.NodeName == "" {
		opts.NodeName = "node1"
	}
	if opts.SyncPeriod == 0 {
		opts.SyncPeriod = 10 * time.Second
	}
	if opts.MinSyncPeriod == 0 {
		opts.MinSyncPeriod = time.Second
	}
	if opts.ReadyTimeout == 0 {
		opts.ReadyTimeout = 3 * time.Minute
	}
	switch opts.Mode {
	case "":
		opts.Mode = "iptables"
	case "iptables":
	case "nftables":
		if _, err := exec.LookPath("nft"); err != nil {
			skipOrFail(t, "kube-proxy's nftables mode needs the nft command (Debian package nftables)")
		}
	default:
		t.Fatalf("StartKubeProxy: unsupported mode %q", opts.Mode)
	}
	dir := filepath.Join(cp.Dir, "kube-proxy-"+opts.NodeName)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	kp := &KubeProxy{
		NodeName:     opts.NodeName,
		Mode:         opts.Mode,
		SyncPeriod:   opts.SyncPeriod,
		MetricsURL:   "http://127.0.0.1:10249/metrics",
		HealthzURL:   "http://127.0.0.1:10256/healthz",
		ProxyModeURL: "http://127.0.0.1:10249/proxyMode",
		XtablesLock:  filepath.Join(dir, "xtables.lock"),
		ConfigPath:   filepath.Join(dir, "config.yaml"),
		PathDir:      filepath.Join(dir, "bin"),
		cp:           cp,
	}
	if err := os.MkdirAll(kp.PathDir, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, fam := range []string{"iptables", "ip6tables"} {
		for _, suffix := range []string{"", "-save", "-restore"} {
			target, err := exec.LookPath(fam + "-legacy" + suffix)
			if err != nil {
				skipOrFail(t, fmt.Sprintf("needs %s-legacy%s (Debian package iptables)", fam, suffix))
			}
			if err := os.Symlink(target, filepath.Join(kp.PathDir, fam+suffix)); err != nil {
				t.Fatal(err)
			}
		}
	}
	mustWrite(t, kp.XtablesLock, "")
	kubeconfig := filepath.Join(dir, "kubeconfig")
	kc := Kubeconfig(KubeProxyToken)
	if opts.APIServerURL != "" {
		kc = strings.Replace(kc, "server: "+APIServerURL, "server: "+opts.APIServerURL, 1)
	}
	mustWrite(t, kubeconfig, kc)
	mustWrite(t, kp.ConfigPath, fmt.Sprintf(`apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
clientConnection: {kubeconfig: %s}
hostnameOverride: %s
mode: %s
metricsBindAddress: 127.0.0.1:10249
healthzBindAddress: 127.0.0.1:10256
conntrack: {maxPerCore: 0}
iptables: {syncPeriod: %s, minSyncPeriod: %s}
nftables: {syncPeriod: %s, minSyncPeriod: %s}
clusterCIDR: %q
`, kubeconfig, opts.NodeName, opts.Mode, opts.SyncPeriod, opts.MinSyncPeriod, opts.SyncPeriod, opts.MinSyncPeriod, opts.ClusterCIDR))

	cp.ensureNode(opts.NodeName)

	kp.args = []string{"--config", kp.ConfigPath, "--v", "2"}
	kp.env = append(os.Environ(),
		"PATH="+kp.PathDir+":"+os.Getenv("PATH"),
		"XTABLES_LOCKFILE="+kp.XtablesLock,
	)
	kp.start()
	kp.WaitHealthy(opts.ReadyTimeout)
	return kp
}

func (kp *KubeProxy) start() {
	cmd := kp.cp.NetNS.Command(filepath.Join(kp.cp.BinDir, "kube-proxy"), kp.args...)
	cmd.Env = kp.env
	kp.Process = startProcess(kp.cp.t, "kube-proxy", filepath.Dir(kp.ConfigPath), cmd)
}

// Restart stops kube-proxy by PID and starts it again with the same
// configuration, without waiting for it to become healthy.
func (kp *KubeProxy) Restart() {
	kp.cp.t.Helper()
	kp.Stop(kp.cp.t)
	kp.start()
}

// RestartWithEnv is Restart with extra environment variables for the new
// process (and its iptables children), such as XTABLES_LIBDIR pointing at
// a directory that lacks an extension: a kube-proxy whose image lacks it.
func (kp *KubeProxy) RestartWithEnv(extra ...string) {
	kp.cp.t.Helper()
	kp.env = append(slices.Clip(kp.env), extra...)
	kp.Restart()
}

// Env is the environment kube-proxy runs with (PATH with the legacy
// symlinks first, XTABLES_LOCKFILE), for running iptables-save and friends
// in the namespace the way it does.
func (kp *KubeProxy) Env() []string { return kp.env }

// WaitHealthy polls until /healthz answers 200 and /metrics shows a
// completed sync (kubeproxy_sync_proxy_rules_last_timestamp_seconds, which
// 1.33+ exports only after the first sync; /healthz is 200 already while
// starting), or fails the test after timeout.
func (kp *KubeProxy) WaitHealthy(timeout time.Duration) {
	t := kp.cp.t
	t.Helper()
	client := kp.cp.NetNS.HTTPClient(2 * time.Second)
	get := func(u string) (int, string, error) {
		resp, err := client.Get(u)
		if err != nil {
			return 0, "", err
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(io.LimitReader(resp.Body, 4<<20))
		return resp.StatusCode, string(b), err
	}
	deadline := time.Now().Add(timeout)
	var last string
	for {
		code, body, err := get(kp.HealthzURL)
		switch {
		case err != nil:
			last = err.Error()
		case code != 200:
			last = fmt.Sprintf("healthz HTTP %d %s", code, strings.TrimSpace(body))
		default:
			code, body, err = get(kp.MetricsURL)
			if err == nil && code == 200 && strings.Contains(body, "\nkubeproxy_sync_proxy_rules_last_timestamp_seconds") {
				return
			}
			last = fmt.Sprintf("metrics: HTTP %d, err %v, no completed sync yet", code, err)
		}
		if kp.Exited() {
			t.Fatalf("kube-proxy exited; log tail:\n%s", tail(kp.LogPath, 30))
		}
		if time.Now().After(deadline) {
			t.Fatalf("kube-proxy not healthy after %v: %s; log tail:\n%s", timeout, last, tail(kp.LogPath, 30))
		}
		time.Sleep(500 * time.Millisecond)
	}
}

// ensureNode creates the Node object kube-proxy needs, with cp.NodeAddress
// as InternalIP. On a view of the shared control plane, a Node it created
// is deleted when the test ends.
func (cp *ControlPlane) ensureNode(name string) {
	cp.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}}
	created, err := cp.Client.CoreV1().Nodes().Create(ctx, node, metav1.CreateOptions{})
	if apierrors.IsAlreadyExists(err) {
		return
	}
	if err != nil {
		cp.t.Fatalf("create node %s: %v", name, err)
	}
	if cp.shared {
		// Later tests on the shared control plane must not see it. This
		// cleanup runs after kube-proxy's (registered later) stopped it.
		t := cp.t
		t.Cleanup(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			if err := cp.Client.CoreV1().Nodes().Delete(ctx, name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
				t.Errorf("delete node %s: %v", name, err)
			}
		})
	}
	created.Status.Addresses = []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: cp.NodeAddress}}
	created.Status.Conditions = []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue,
		LastHeartbeatTime: metav1.Now(), LastTransitionTime: metav1.Now(), Reason: "Test", Message: "set by the test harness"}}
	if _, err := cp.Client.CoreV1().Nodes().UpdateStatus(ctx, created, metav1.UpdateOptions{}); err != nil {
		cp.t.Fatalf("set node %s status: %v", name, err)
	}
}
