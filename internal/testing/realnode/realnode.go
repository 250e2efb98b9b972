// Package realnode brings up one real Kubernetes node on this machine for
// the real-node test lane (make test-node): etcd, kube-apiserver,
// kube-controller-manager, kube-scheduler, containerd (Debian's, with runc
// and the CNI bridge plugin) and the kubelet (Kubernetes v1.34.4, built by
// `make node-bins`), all inside one network namespace the harness makes,
// with images imported into containerd from docker-archive tarballs (no
// registry), and kube-proxy running as a DaemonSet pod. Stop tears it all
// down by PID and leaves nothing behind: processes, mounts, network
// namespaces, cgroups, the kubelet's global sysctls (restored), and the
// host folders the kubelet and containerd write (/var/lib/kubelet,
// /var/log/pods, /var/log/containers, /var/lib/cni, /run/containerd).
//
// The recipe, its versions and its pitfalls are those of
// ../shared/notes/real-node.md: processes run under `nsenter --net` (not
// `ip netns exec`, which remounts /sys and hides the cgroup mounts),
// containerd clamps oom_score_adj (this machine's root lacks
// CAP_SYS_RESOURCE), the apiserver prefers the node's InternalIP to reach
// the kubelet, the node registers with a static token (no bootstrap).
//
// Only one node can run on a machine at a time (the kubelet's folders and
// cgroups are global): Start takes an exclusive lock (/run/remediate-realnode.lock)
// and refuses to start over another node's leftovers.
package realnode

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/remediate-dev/remediate/internal/testing/controlplane"
)

const (
	// NodeName is the Node's name.
	NodeName = "rn1"
	// NodeIP is the node's address inside its namespace (the apiserver's
	// advertise address, the kubelet's node IP).
	NodeIP = "10.232.0.1"
	// PodCIDR is the CNI bridge's range.
	PodCIDR = "10.244.0.0/24"
	// ServiceCIDR is the apiserver's Service range.
	ServiceCIDR = "10.96.0.0/16"
	// PauseImage is the sandbox image (containerd's sandbox_image).
	PauseImage = "docker.io/local/pause:3.10"
	// BusyboxImage is Debian's busybox-static with its applets.
	BusyboxImage = "docker.io/local/busybox:1"
	// KubeProxyImage is kube-proxy on the image's Debian rootfs.
	KubeProxyImage = "docker.io/local/kube-proxy:v1.34.4"
	// AdminToken is the admin's bearer token (system:masters).
	AdminToken = "admintoken"
	lockPath   = "/run/remediate-realnode.lock"
	apiURL     = "https://" + NodeIP + ":6443"
)

// Config says where the pieces are.
type Config struct {
	// BinDir holds etcd, kube-apiserver (linked with a release version,
	// for helm's kubeVersion check), kube-proxy, kubelet,
	// kube-controller-manager and kube-scheduler.
	BinDir string
	// MkImage is tools/image/mkimage, built.
	MkImage string
	// Rootfs is the image's Debian rootfs tar (tools/image/rootfs.sh).
	Rootfs string
	// Images are more docker-archive tarballs to import (the project's
	// image from `make image`).
	Images []string
	// Dir is the node's working folder (certificates, configs, logs,
	// containerd's root); it must not exist, Stop removes it.
	Dir string
	// Logf reports progress.
	Logf func(format string, args ...any)
}

// Node is a running node.
type Node struct {
	cfg Config
	// Dir is Config.Dir.
	Dir string
	// NetNS is the namespace everything runs in.
	NetNS *controlplane.NetNS
	// Client is an admin client; RestConfig its config (Dial reaches the
	// namespace).
	Client     kubernetes.Interface
	RestConfig *rest.Config
	// AdminKubeconfig is an admin kubeconfig for programs run in the
	// namespace (Command), kubectl and helm.
	AdminKubeconfig string
	// CNIBinDir is the node's copy of the CNI plugins (a scenario may
	// remove one without touching the host's), CNIConfDir its conf dir.
	CNIBinDir, CNIConfDir string
	// CNIIPAMDir is host-local's store, the conflist's dataDir.
	CNIIPAMDir string
	// ContainerdSock is containerd's socket.
	ContainerdSock string
	// XtablesLock is the node's xtables lock file (kube-proxy's pod mounts
	// it at /run/xtables.lock; the host's is left to other tests), and
	// StateDir a folder for the chart's state hostPath.
	XtablesLock, StateDir string
	// StaticPodDir is the kubelet's staticPodPath: a manifest written
	// there runs as a static pod (its mirror pod in the API).
	StaticPodDir string

	procs   []*proc
	sysctls map[string]string
	lock    *os.File
	// created: host paths that did not exist before Start (removed by Stop).
	created []string
	stopped bool
	started time.Time
}

// The kubelet sets these global sysctls; Stop restores them.
var kubeletSysctls = []string{"vm/overcommit_memory", "kernel/panic", "kernel/panic_on_oops"}

// Host folders the kubelet writes whatever its flags say; Start refuses to
// run when one exists (another kubelet, or a node's leftovers) and Stop
// removes them.
var hostPaths = []string{"/var/lib/kubelet", "/var/log/pods", "/var/log/containers"}

// Host folders libcni and containerd's shims write: shared with a system
// containerd (Debian's package starts one under systemd), so Stop removes
// them only when Start found them absent.
var sharedHostPaths = []string{"/var/lib/cni", "/run/containerd"}

// Start brings the node up to Ready with kube-proxy's pod Ready. On error
// everything started so far is stopped.
func Start(ctx context.Context, cfg Config) (n *Node, err error) {
	if os.Getuid() != 0 {
		return nil, errors.New("needs root")
	}
	if cfg.Logf == nil {
		cfg.Logf = func(string, ...any) {}
	}
	for _, b := range []string{"etcd", "kube-apiserver", "kube-proxy", "kubelet", "kube-controller-manager", "kube-scheduler"} {
		if _, err := os.Stat(filepath.Join(cfg.BinDir, b)); err != nil {
			return nil, fmt.Errorf("%s not in %s: run `make controlplane-bins node-bins`: %w", b, cfg.BinDir, err)
		}
	}
	for _, b := range []string{"containerd", "containerd-shim-runc-v2", "runc", "ctr", "nsenter", "ip", "/usr/lib/cni/bridge"} {
		if strings.HasPrefix(b, "/") {
			if _, err := os.Stat(b); err != nil {
				return nil, fmt.Errorf("%s missing (Debian containernetworking-plugins; make hostdeps)", b)
			}
		} else if _, err := exec.LookPath(b); err != nil {
			return nil, fmt.Errorf("%s missing (tools/hostdeps/packages.txt; make hostdeps): %w", b, err)
		}
	}
	n = &Node{cfg: cfg, Dir: cfg.Dir, sysctls: map[string]string{}, started: time.Now()}
	lock, err := os.OpenFile(lockPath, os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return nil, err
	}
	if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		lock.Close()
		return nil, fmt.Errorf("another real node runs on this machine (%s is locked): %w", lockPath, err)
	}
	n.lock = lock
	defer func() {
		if err != nil {
			if serr := n.Stop(); serr != nil {
				cfg.Logf("stop after failed start: %v", serr)
			}
			n = nil
		}
	}()
	for _, p := range hostPaths {
		if _, err := os.Stat(p); err == nil {
			return n, fmt.Errorf("%s exists: another kubelet/containerd ran here, or a node's leftovers; refusing to start over it", p)
		}
		n.created = append(n.created, p)
	}
	for _, p := range sharedHostPaths {
		if _, err := os.Stat(p); os.IsNotExist(err) {
			n.created = append(n.created, p)
		}
	}
	if _, err := os.Stat(cfg.Dir); err == nil {
		return n, fmt.Errorf("%s exists", cfg.Dir)
	}
	n.created = append(n.created, cfg.Dir)
	n.XtablesLock, n.StateDir, n.StaticPodDir = n.path("xtables.lock"), n.path("state"), n.path("manifests")
	for _, d := range []string{"pki", "etcd", "ctd", "cni/net.d", "cni/bin", "cni/ipam", "kubelet-pki", "logs", "images", "state", "manifests"} {
		if err := os.MkdirAll(filepath.Join(cfg.Dir, d), 0o755); err != nil {
			return n, err
		}
	}
	for _, s := range kubeletSysctls {
		b, err := os.ReadFile("/proc/sys/" + s)
		if err != nil {
			return n, err
		}
		n.sysctls[s] = strings.TrimSpace(string(b))
	}

	start := time.Now()
	step := func(what string) { cfg.Logf("realnode: %s (+%.0fs)", what, time.Since(start).Seconds()) }
	if err := n.netns(); err != nil {
		return n, err
	}
	if err := n.startControlPlane(ctx); err != nil {
		return n, err
	}
	step("apiserver ready")
	if err := n.startContainerd(ctx); err != nil {
		return n, err
	}
	if err := n.importImages(ctx); err != nil {
		return n, err
	}
	step("containerd up, images imported")
	if err := n.startKubelet(ctx); err != nil {
		return n, err
	}
	step("node Ready")
	if err := n.deployKubeProxy(ctx); err != nil {
		return n, err
	}
	step("kube-proxy pod Ready")
	return n, nil
}

func (n *Node) netns() error {
	name := fmt.Sprintf("rmdrn-%d", os.Getpid())
	if out, err := exec.Command("ip", "netns", "add", name).CombinedOutput(); err != nil {
		return fmt.Errorf("ip netns add %s: %w: %s", name, err, out)
	}
	n.NetNS = &controlplane.NetNS{Name: name, Address: NodeIP}
	for _, args := range [][]string{
		{"link", "set", "lo", "up"},
		{"link", "add", "veth0", "type", "veth", "peer", "name", "veth1"},
		{"addr", "add", NodeIP + "/24", "dev", "veth0"},
		{"link", "set", "veth0", "up"},
		{"link", "set", "veth1", "up"},
		{"route", "add", "default", "via", "10.232.0.254", "dev", "veth0", "onlink"},
	} {
		full := append([]string{"-n", name}, args...)
		if out, err := exec.Command("ip", full...).CombinedOutput(); err != nil {
			return fmt.Errorf("ip %s: %w: %s", strings.Join(full, " "), err, out)
		}
	}
	return nil
}

// Command returns cmd to run inside the node's network namespace (nsenter
// --net: same mount namespace, so cgroups and the pods' mounts stay visible).
func (n *Node) Command(ctx context.Context, name string, args ...string) *exec.Cmd {
	return exec.CommandContext(ctx, "nsenter", append([]string{"--net=/run/netns/" + n.NetNS.Name, name}, args...)...)
}

func (n *Node) path(p ...string) string { return filepath.Join(append([]string{n.Dir}, p...)...) }

func (n *Node) kubeconfig(file, token string) error {
	return os.WriteFile(n.path(file), []byte(fmt.Sprintf(`apiVersion: v1
kind: Config
clusters:
- name: rn
  cluster: {server: %s, certificate-authority: %s}
users:
- name: u
  user: {token: %s}
contexts:
- name: rn
  context: {cluster: rn, user: u}
current-context: rn
`, apiURL, n.path("pki", "ca.crt"), token)), 0o600)
}

func (n *Node) startControlPlane(ctx context.Context) error {
	if err := pki(n.path("pki"), NodeIP, "10.96.0.1"); err != nil {
		return fmt.Errorf("pki: %w", err)
	}
	tokens := AdminToken + ",admin,admin,system:masters\n" +
		"kubelettoken,system:node:" + NodeName + ",kubelet-" + NodeName + ",system:nodes\n" +
		"kcmtoken,system:kube-controller-manager,kcm,\n" +
		"schedtoken,system:kube-scheduler,sched,\n" +
		// kube-proxy run as a static pod (no ServiceAccount token there):
		// the user the bootstrap ClusterRoleBinding system:node-proxier binds.
		kubeProxyToken + ",system:kube-proxy,kube-proxy,\n"
	if err := os.WriteFile(n.path("pki", "tokens.csv"), []byte(tokens), 0o600); err != nil {
		return err
	}
	for f, tok := range map[string]string{"admin.kubeconfig": AdminToken, "kubelet.kubeconfig": "kubelettoken",
		"kcm.kubeconfig": "kcmtoken", "sched.kubeconfig": "schedtoken"} {
		if err := n.kubeconfig(f, tok); err != nil {
			return err
		}
	}
	n.AdminKubeconfig = n.path("admin.kubeconfig")
	bin := func(b string) string { return filepath.Join(n.cfg.BinDir, b) }
	if err := n.start("etcd", bin("etcd"), "--data-dir", n.path("etcd"),
		"--listen-client-urls", "http://127.0.0.1:2379", "--advertise-client-urls", "http://127.0.0.1:2379",
		"--listen-peer-urls", "http://127.0.0.1:2380", "--initial-advertise-peer-urls", "http://127.0.0.1:2380",
		"--initial-cluster", "default=http://127.0.0.1:2380", "--unsafe-no-fsync", "--log-level", "warn"); err != nil {
		return err
	}
	pk := func(f string) string { return n.path("pki", f) }
	if err := n.start("kube-apiserver", bin("kube-apiserver"),
		"--etcd-servers", "http://127.0.0.1:2379", "--secure-port", "6443", "--bind-address", "0.0.0.0",
		"--advertise-address", NodeIP, "--tls-cert-file", pk("apiserver.crt"), "--tls-private-key-file", pk("apiserver.key"),
		"--client-ca-file", pk("ca.crt"), "--token-auth-file", pk("tokens.csv"), "--authorization-mode", "Node,RBAC",
		"--kubelet-client-certificate", pk("kubelet-client.crt"), "--kubelet-client-key", pk("kubelet-client.key"),
		"--kubelet-preferred-address-types", "InternalIP,Hostname", "--allow-privileged=true",
		"--service-account-key-file", pk("sa.pub"), "--service-account-signing-key-file", pk("sa.key"),
		"--service-account-issuer", "https://kubernetes.default.svc", "--service-cluster-ip-range", ServiceCIDR); err != nil {
		return err
	}
	ca, err := os.ReadFile(pk("ca.crt"))
	if err != nil {
		return err
	}
	n.RestConfig = &rest.Config{Host: apiURL, BearerToken: AdminToken, TLSClientConfig: rest.TLSClientConfig{CAData: ca},
		Dial: n.NetNS.DialContext, Timeout: 30 * time.Second, QPS: 100, Burst: 200}
	if n.Client, err = kubernetes.NewForConfig(n.RestConfig); err != nil {
		return err
	}
	if err := n.poll(ctx, "kube-apiserver /readyz", 3*time.Minute, func(ctx context.Context) (bool, string) {
		b, err := n.Client.Discovery().RESTClient().Get().AbsPath("/readyz").DoRaw(ctx)
		return err == nil && strings.TrimSpace(string(b)) == "ok", fmt.Sprintf("%v %s", err, b)
	}, "kube-apiserver"); err != nil {
		return err
	}
	common := func(kc string) []string {
		return []string{"--kubeconfig", n.path(kc), "--authentication-kubeconfig", n.path(kc),
			"--authorization-kubeconfig", n.path(kc), "--bind-address", "127.0.0.1", "--leader-elect=false"}
	}
	if err := n.start("kube-controller-manager", bin("kube-controller-manager"), append(common("kcm.kubeconfig"),
		"--service-account-private-key-file", pk("sa.key"), "--root-ca-file", pk("ca.crt"),
		"--use-service-account-credentials", "--cluster-cidr", "10.244.0.0/16",
		"--service-cluster-ip-range", ServiceCIDR, "--controllers", "*,-nodeipam")...); err != nil {
		return err
	}
	return n.start("kube-scheduler", bin("kube-scheduler"), common("sched.kubeconfig")...)
}

func (n *Node) startContainerd(ctx context.Context) error {
	// The node's own copy of the CNI plugins: a scenario may break it.
	if out, err := exec.Command("cp", "-a", "/usr/lib/cni/.", n.path("cni", "bin")).CombinedOutput(); err != nil {
		return fmt.Errorf("copy CNI plugins: %w: %s", err, out)
	}
	n.CNIBinDir, n.CNIConfDir, n.CNIIPAMDir = n.path("cni", "bin"), n.path("cni", "net.d"), n.path("cni", "ipam")
	conflist := fmt.Sprintf(`{"cniVersion": "0.4.0", "name": "rn", "plugins": [
  {"type": "bridge", "bridge": "cni0", "isGateway": true, "ipMasq": true, "hairpinMode": true,
   "ipam": {"type": "host-local", "dataDir": %q, "ranges": [[{"subnet": %q}]], "routes": [{"dst": "0.0.0.0/0"}]}},
  {"type": "portmap", "capabilities": {"portMappings": true}},
  {"type": "loopback"}]}
`, n.path("cni", "ipam"), PodCIDR)
	if err := os.WriteFile(filepath.Join(n.CNIConfDir, "10-rn.conflist"), []byte(conflist), 0o644); err != nil {
		return err
	}
	n.ContainerdSock = n.path("ctd", "containerd.sock")
	cfg := fmt.Sprintf(`version = 2
root = %[1]q
state = %[2]q
[grpc]
  address = %[3]q
[ttrpc]
  address = %[4]q
[plugins."io.containerd.internal.v1.opt"]
  path = %[5]q
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = %[6]q
  restrict_oom_score_adj = true
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = %[7]q
    conf_dir = %[8]q
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        Root = %[9]q
        SystemdCgroup = false
`, n.path("ctd", "root"), n.path("ctd", "state"), n.ContainerdSock, n.path("ctd", "containerd.sock.ttrpc"),
		n.path("ctd", "opt"), PauseImage, n.CNIBinDir, n.CNIConfDir, n.path("ctd", "runc"))
	if err := os.WriteFile(n.path("ctd", "config.toml"), []byte(cfg), 0o644); err != nil {
		return err
	}
	if err := n.start("containerd", "containerd", "--config", n.path("ctd", "config.toml")); err != nil {
		return err
	}
	return n.poll(ctx, "containerd", time.Minute, func(ctx context.Context) (bool, string) {
		out, err := n.ctr(ctx, "version")
		return err == nil, out
	}, "containerd")
}

func (n *Node) ctr(ctx context.Context, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	out, err := exec.CommandContext(ctx, "ctr", append([]string{"--address", n.ContainerdSock, "-n", "k8s.io"}, args...)...).CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("ctr %s: %w: %s", strings.Join(args, " "), err, out)
	}
	return string(out), nil
}

// ImportImage imports a docker-archive tarball into the node's containerd.
func (n *Node) ImportImage(ctx context.Context, tarball string) error {
	_, err := n.ctr(ctx, "images", "import", tarball)
	return err
}

func (n *Node) importImages(ctx context.Context) error {
	img := n.path("images")
	// pause: a static Go program of this repository.
	build := exec.CommandContext(ctx, "go", "build", "-trimpath", "-o", filepath.Join(img, "pause"), "./pause")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	build.Dir = packageDir()
	if out, err := build.CombinedOutput(); err != nil {
		return fmt.Errorf("build pause: %w: %s", err, out)
	}
	// busybox: Debian's busybox-static with a link per applet.
	bb := n.path("images", "busybox-root")
	if err := busyboxRoot(bb); err != nil {
		return err
	}
	packs := [][]string{
		{"-file", filepath.Join(img, "pause") + ":/pause:0755", "-entrypoint", "/pause", "-name", PauseImage, "-out", filepath.Join(img, "pause.tar")},
		{"-base", n.path("images", "busybox.tar"), "-name", BusyboxImage, "-entrypoint", "/bin/sh", "-out", filepath.Join(img, "bb.tar")},
		{"-base", n.cfg.Rootfs, "-file", filepath.Join(n.cfg.BinDir, "kube-proxy") + ":/usr/local/bin/kube-proxy:0755",
			"-entrypoint", "/usr/local/bin/kube-proxy", "-name", KubeProxyImage, "-out", filepath.Join(img, "kube-proxy.tar")},
	}
	if out, err := exec.CommandContext(ctx, "tar", "-C", bb, "--numeric-owner", "-cf", n.path("images", "busybox.tar"), ".").CombinedOutput(); err != nil {
		return fmt.Errorf("tar busybox: %w: %s", err, out)
	}
	tars := []string{}
	for _, p := range packs {
		if out, err := exec.CommandContext(ctx, n.cfg.MkImage, p...).CombinedOutput(); err != nil {
			return fmt.Errorf("mkimage %s: %w: %s", strings.Join(p, " "), err, out)
		}
		tars = append(tars, p[len(p)-1])
	}
	for _, t := range append(tars, n.cfg.Images...) {
		if err := n.ImportImage(ctx, t); err != nil {
			return err
		}
	}
	return nil
}

// busyboxRoot makes a root filesystem of /bin/busybox and its applets.
func busyboxRoot(dir string) error {
	src := "/bin/busybox"
	if _, err := os.Stat(src); err != nil {
		return fmt.Errorf("%s missing (Debian busybox-static): %w", src, err)
	}
	for _, d := range []string{"bin", "etc", "tmp", "proc", "sys", "dev"} {
		if err := os.MkdirAll(filepath.Join(dir, d), 0o755); err != nil {
			return err
		}
	}
	b, err := os.ReadFile(src)
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "bin", "busybox"), b, 0o755); err != nil {
		return err
	}
	out, err := exec.Command(src, "--list").Output()
	if err != nil {
		return fmt.Errorf("busybox --list: %w", err)
	}
	for _, a := range strings.Fields(string(out)) {
		if a == "busybox" {
			continue
		}
		if err := os.Symlink("busybox", filepath.Join(dir, "bin", a)); err != nil && !os.IsExist(err) {
			return err
		}
	}
	return os.WriteFile(filepath.Join(dir, "etc", "passwd"), []byte("root:x:0:0:root:/:/bin/sh\n"), 0o644)
}

func (n *Node) startKubelet(ctx context.Context) error {
	cfg := fmt.Sprintf(`apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
cgroupDriver: cgroupfs
failSwapOn: false
containerRuntimeEndpoint: unix://%s
authentication: {anonymous: {enabled: false}, webhook: {enabled: true}, x509: {clientCAFile: %s}}
authorization: {mode: Webhook}
address: %s
healthzBindAddress: 127.0.0.1
clusterDNS: [10.96.0.10]
clusterDomain: cluster.local
podCIDR: %s
evictionHard: {memory.available: 100Mi, nodefs.available: "1%%", imagefs.available: "1%%", nodefs.inodesFree: "1%%"}
imageGCHighThresholdPercent: 99
imageGCLowThresholdPercent: 98
syncFrequency: 10s
staticPodPath: %s
fileCheckFrequency: 5s
`, n.ContainerdSock, n.path("pki", "ca.crt"), NodeIP, PodCIDR, n.StaticPodDir)
	if err := os.WriteFile(n.path("kubelet.yaml"), []byte(cfg), 0o644); err != nil {
		return err
	}
	if err := n.start("kubelet", filepath.Join(n.cfg.BinDir, "kubelet"), "--config", n.path("kubelet.yaml"),
		"--kubeconfig", n.path("kubelet.kubeconfig"), "--cert-dir", n.path("kubelet-pki"),
		"--hostname-override", NodeName, "--node-ip", NodeIP); err != nil {
		return err
	}
	if err := n.poll(ctx, "Node "+NodeName+" Ready", 3*time.Minute, func(ctx context.Context) (bool, string) {
		node, err := n.Client.CoreV1().Nodes().Get(ctx, NodeName, metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		for _, c := range node.Status.Conditions {
			if c.Type == corev1.NodeReady {
				return c.Status == corev1.ConditionTrue, c.Reason + ": " + c.Message
			}
		}
		return false, "no Ready condition"
	}, "kubelet"); err != nil {
		return err
	}
	return n.poll(ctx, "ServiceAccount default/default", 2*time.Minute, func(ctx context.Context) (bool, string) {
		_, err := n.Client.CoreV1().ServiceAccounts("default").Get(ctx, "default", metav1.GetOptions{})
		return err == nil, fmt.Sprint(err)
	}, "kube-controller-manager")
}

// poll waits (at most timeout, each try bounded by 10 s) until f says
// done; it gives up early when the process named proc exited.
func (n *Node) poll(ctx context.Context, what string, timeout time.Duration, f func(context.Context) (bool, string), proc string) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	last := ""
	for {
		rctx, rcancel := context.WithTimeout(ctx, 10*time.Second)
		ok, msg := f(rctx)
		rcancel()
		if ok {
			return nil
		}
		last = msg
		if p := n.find(proc); p != nil && p.exited() {
			return fmt.Errorf("%s: %s exited; log tail:\n%s", what, proc, Tail(p.log, 30))
		}
		select {
		case <-ctx.Done():
			tail := ""
			if p := n.find(proc); p != nil {
				tail = "; " + p.name + " log tail:\n" + Tail(p.log, 30)
			}
			return fmt.Errorf("%s: not after %v: %s%s", what, timeout, last, tail)
		case <-time.After(time.Second):
		}
	}
}

// Poll waits (at most timeout, each try bounded by 10 s) until f says
// done; the error carries f's last message.
func (n *Node) Poll(ctx context.Context, what string, timeout time.Duration, f func(context.Context) (bool, string)) error {
	return n.poll(ctx, what, timeout, f, "")
}

// Log is the path of a started process's log ("kubelet", "containerd", ...).
func (n *Node) Log(name string) string {
	if p := n.find(name); p != nil {
		return p.log
	}
	return ""
}

// proc is a process the node started, stopped by its PID.
type proc struct {
	name, log string
	cmd       *exec.Cmd
	done      chan struct{}
}

func (p *proc) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

func (n *Node) find(name string) *proc {
	for _, p := range n.procs {
		if p.name == name {
			return p
		}
	}
	return nil
}

func (n *Node) start(name, bin string, args ...string) error {
	logPath := n.path("logs", name+".log")
	f, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	cmd := exec.Command("nsenter", append([]string{"--net=/run/netns/" + n.NetNS.Name, bin}, args...)...)
	cmd.Stdout, cmd.Stderr = f, f
	// Its own process group: a Ctrl-C of go test does not kill it before
	// Stop runs (Stop signals the PID).
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		f.Close()
		return fmt.Errorf("start %s: %w", name, err)
	}
	p := &proc{name: name, log: logPath, cmd: cmd, done: make(chan struct{})}
	go func() { _ = cmd.Wait(); f.Close(); close(p.done) }()
	n.procs = append(n.procs, p)
	return nil
}

func (p *proc) stop(grace time.Duration) error {
	if p.exited() {
		return nil
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
		return nil
	case <-time.After(grace):
	}
	_ = p.cmd.Process.Kill()
	select {
	case <-p.done:
		return nil
	case <-time.After(15 * time.Second):
		return fmt.Errorf("%s (pid %d) still running 15 s after SIGKILL", p.name, p.cmd.Process.Pid)
	}
}

// Tail returns the last n lines of a file.
func Tail(path string, n int) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return fmt.Sprintf("(cannot read %s: %v)", path, err)
	}
	lines := bytes.Split(bytes.TrimRight(b, "\n"), []byte("\n"))
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return string(bytes.Join(lines, []byte("\n")))
}

// packageDir is this package's source folder (go test runs in it).
func packageDir() string {
	wd, _ := os.Getwd()
	for d := wd; d != "/"; d = filepath.Dir(d) {
		if p := filepath.Join(d, "internal", "testing", "realnode"); isDir(p) {
			return p
		}
	}
	return wd
}

func isDir(p string) bool { st, err := os.Stat(p); return err == nil && st.IsDir() }

// HTTPGet fetches url from inside the node's namespace.
func (n *Node) HTTPGet(ctx context.Context, url string) (string, error) {
	c := n.NetNS.HTTPClient(10 * time.Second)
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return "", err
	}
	resp, err := c.Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 8<<20))
	if resp.StatusCode != 200 {
		return string(b), fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	return string(b), err
}
