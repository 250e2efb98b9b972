// Package controlplane starts a real Kubernetes control plane (etcd and
// kube-apiserver) and, on request, the real kube-proxy in iptables mode
// (default) or nftables mode (KubeProxyOptions.Mode), inside a network
// namespace the test creates, for end-to-end tests.
//
// The binaries are built from pinned sources (Kubernetes v1.34.4, etcd
// v3.6.4) by `make controlplane-bins` into <repo>/_output/bin (or the
// folder in $REMEDIATE_CONTROLPLANE_BIN). Tests using this package skip with
// the reason when not root or when the binaries are missing; with
// REMEDIATE_E2E_REQUIRED=1 (CI) they fail instead.
//
// Everything runs inside one network namespace and listens on its loopback
// only: etcd on 127.0.0.1:2379, kube-apiserver on https://127.0.0.1:6443,
// kube-proxy metrics on 127.0.0.1:10249 and healthz on 127.0.0.1:10256.
// The test process reaches them through NetNS.DialContext (a dial made from
// an OS thread switched into the namespace); the Client and RestConfig the
// harness returns are already wired to it, and NetNS.HTTPClient gives a
// plain HTTP client that is. Processes are stopped by PID and the namespace
// is deleted in t.Cleanup, also when the test fails; the tail of each
// process's log is printed on failure.
//
// The cluster is IPv4 single-stack by default; Options.ServiceCIDR with an
// IPv6 range (ServiceCIDR6) makes it IPv6 single-stack (the control
// connections stay on 127.0.0.1).
//
// Start gives a test a control plane of its own. Shared gives it a view of
// one etcd + kube-apiserver shared by the package's tests (started on first
// use, stopped by SharedMain from TestMain), with a network namespace of
// its own; such tests run one at a time and keep their objects in a
// namespace of their own (ControlPlane.Namespace). See Shared.
package controlplane

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
)

const (
	// AdminToken is the bearer token of the admin user (group
	// system:masters).
	AdminToken = "admintoken"
	// KubeProxyToken is the bearer token of the user system:kube-proxy,
	// which the bootstrap RBAC policy binds to system:node-proxier.
	KubeProxyToken = "kubeproxytoken"
	// APIServerURL is where kube-apiserver listens, inside the namespace.
	APIServerURL = "https://127.0.0.1:6443"
	// ServiceCIDR is the apiserver's default --service-cluster-ip-range.
	ServiceCIDR = "10.96.0.0/16"
	// ServiceCIDR6 is an IPv6 service range for Options.ServiceCIDR (a
	// ULA /112, kind's IPv6 default); the `kubernetes`
	// Service's ClusterIP is then fd00:10:96::1.
	ServiceCIDR6 = "fd00:10:96::/112"
)

// Options configures Start. The zero value is fine.
type Options struct {
	// BinDir holds kube-apiserver, etcd and kube-proxy. Default:
	// $REMEDIATE_CONTROLPLANE_BIN, else <repo>/_output/bin.
	BinDir string
	// ReadyTimeout bounds the wait for the apiserver's /readyz (default
	// 120 s; it usually takes 5-60 s on a loaded 2-core machine).
	ReadyTimeout time.Duration
	// ExtraAPIServerArgs are appended to kube-apiserver's flags.
	ExtraAPIServerArgs []string
	// ServiceCIDR is the apiserver's --service-cluster-ip-range (default
	// ServiceCIDR). An IPv6 range (ServiceCIDR6) makes the cluster IPv6
	// single-stack: the namespace's veth0 also gets NetNS.Address6 and an
	// IPv6 default route (NetNS.EnableIPv6), the apiserver advertises
	// Address6 (so the `kubernetes` Service's ClusterIP and its endpoint
	// are IPv6), and the Nodes StartKubeProxy creates carry Address6 as
	// their InternalIP (kube-proxy's primary family is then IPv6). The
	// apiserver still listens on 127.0.0.1 unless ExtraAPIServerArgs
	// says otherwise ("--bind-address", "::" for its endpoint to answer).
	ServiceCIDR string
}

// ControlPlane is a running etcd + kube-apiserver in a test-owned namespace.
type ControlPlane struct {
	// NetNS is the namespace everything runs in.
	NetNS *NetNS
	// Dir is the test's temporary folder: data, certificates, logs,
	// kubeconfigs.
	Dir string
	// BinDir is where the binaries were found.
	BinDir string
	// Client is an admin client (system:masters) to the apiserver.
	Client kubernetes.Interface
	// RestConfig is the admin client's configuration; its Dial reaches the
	// namespace. Copy it (rest.CopyConfig) before changing it.
	RestConfig *rest.Config
	// AdminKubeconfig is a kubeconfig file for the admin user, usable by
	// programs run inside the namespace (NetNS.Command).
	AdminKubeconfig string
	// ServiceCIDR is the apiserver's --service-cluster-ip-range.
	ServiceCIDR string
	// NodeAddress is the apiserver's advertise address (the `kubernetes`
	// Service's endpoint) and the InternalIP of the Nodes the harness
	// creates: NetNS.Address, or NetNS.Address6 with an IPv6 ServiceCIDR.
	NodeAddress string

	etcd, apiServer *Process
	apiServerArgs   []string
	apiServerStarts int
	readyTimeout    time.Duration
	t               testing.TB
	// shared: a view of the shared control plane (Shared); its processes
	// are not this test's to stop.
	shared bool
}

// booting is held by a Start from starting etcd until its kube-apiserver
// is ready: tests running in parallel, each with a control plane of its
// own, boot them one at a time. A boot is the CPU-heavy part (tens of
// CPU-seconds on a 2-core machine; ready, an idle control plane costs
// little), and two at once each take twice as long, towards their ready
// timeout.
var booting sync.Mutex

// Start creates a namespace, starts etcd and kube-apiserver in it, waits
// until /readyz answers ok, and returns the control plane. Everything is
// torn down in t.Cleanup. Starts in parallel tests boot one at a time
// (the wait for another's boot is not counted in ReadyTimeout).
func Start(t testing.TB, opts Options) *ControlPlane {
	t.Helper()
	requireRoot(t)
	binDir := findBinDir(t, opts.BinDir, "etcd", "kube-apiserver")
	checkIP(t)
	serviceCIDR := opts.ServiceCIDR
	if serviceCIDR == "" {
		serviceCIDR = ServiceCIDR
	}
	v6, err := isIPv6CIDR(serviceCIDR)
	if err != nil {
		t.Fatalf("controlplane.Options.ServiceCIDR: %v", err)
	}
	dir := t.TempDir()
	ns := NewNetNS(t)
	cp := &ControlPlane{NetNS: ns, Dir: dir, BinDir: binDir, t: t,
		readyTimeout: opts.ReadyTimeout, ServiceCIDR: serviceCIDR, NodeAddress: ns.Address}
	if v6 {
		ns.EnableIPv6(t)
		cp.NodeAddress = ns.Address6
	}
	if cp.readyTimeout == 0 {
		cp.readyTimeout = 120 * time.Second
	}

	booting.Lock()
	defer booting.Unlock()
	cp.etcd = startProcess(t, "etcd", dir, ns.Command(filepath.Join(binDir, "etcd"),
		"--data-dir", filepath.Join(dir, "etcd"),
		"--listen-client-urls", "http://127.0.0.1:2379",
		"--advertise-client-urls", "http://127.0.0.1:2379",
		"--listen-peer-urls", "http://127.0.0.1:2380",
		"--initial-advertise-peer-urls", "http://127.0.0.1:2380",
		"--initial-cluster", "default=http://127.0.0.1:2380",
		"--unsafe-no-fsync",
		"--log-level", "warn",
	))

	mustWrite(t, filepath.Join(dir, "tokens.csv"),
		AdminToken+",admin,admin,system:masters\n"+
			KubeProxyToken+",system:kube-proxy,kube-proxy,\n")
	writeServiceAccountKey(t, filepath.Join(dir, "sa.key"), filepath.Join(dir, "sa.pub"))
	cp.apiServerArgs = append([]string{
		"--etcd-servers", "http://127.0.0.1:2379",
		"--secure-port", "6443",
		"--bind-address", "127.0.0.1",
		"--advertise-address", cp.NodeAddress,
		"--cert-dir", filepath.Join(dir, "certs"),
		"--token-auth-file", filepath.Join(dir, "tokens.csv"),
		"--authorization-mode", "RBAC",
		"--service-account-key-file", filepath.Join(dir, "sa.pub"),
		"--service-account-signing-key-file", filepath.Join(dir, "sa.key"),
		"--service-account-issuer", "https://kubernetes.default.svc",
		"--service-cluster-ip-range", serviceCIDR,
	}, opts.ExtraAPIServerArgs...)

	cp.RestConfig = &rest.Config{
		Host:            APIServerURL,
		BearerToken:     AdminToken,
		TLSClientConfig: rest.TLSClientConfig{Insecure: true},
		Dial:            ns.DialContext,
		Timeout:         30 * time.Second,
		QPS:             100,
		Burst:           200,
	}
	client, err := kubernetes.NewForConfig(cp.RestConfig)
	if err != nil {
		t.Fatalf("client: %v", err)
	}
	cp.Client = client
	cp.AdminKubeconfig = filepath.Join(dir, "admin.kubeconfig")
	mustWrite(t, cp.AdminKubeconfig, Kubeconfig(AdminToken))

	cp.StartAPIServer()
	return cp
}

// isIPv6CIDR reports whether cidr is an IPv6 prefix (an IPv4 one is
// false; anything else an error).
func isIPv6CIDR(cidr string) (bool, error) {
	p, err := netip.ParsePrefix(cidr)
	if err != nil {
		return false, fmt.Errorf("service CIDR %q: %w", cidr, err)
	}
	return p.Addr().Is6() && !p.Addr().Is4In6(), nil
}

// StopAPIServer stops kube-apiserver (by PID; SIGTERM, then SIGKILL after
// 3 s) and waits for it to exit. etcd keeps running; StartAPIServer brings it back
// with the same flags and data.
func (cp *ControlPlane) StopAPIServer() {
	cp.t.Helper()
	cp.refuseShared("StopAPIServer")
	if cp.apiServer != nil {
		cp.apiServer.Stop(cp.t)
	}
}

// StartAPIServer (re)starts kube-apiserver and waits until /readyz is ok.
func (cp *ControlPlane) StartAPIServer() {
	cp.t.Helper()
	cp.refuseShared("StartAPIServer")
	if cp.apiServer != nil && !cp.apiServer.Exited() {
		cp.t.Fatalf("kube-apiserver (pid %d) is already running", cp.apiServer.Pid())
	}
	cp.apiServerStarts++
	name := "kube-apiserver"
	if cp.apiServerStarts > 1 {
		name = fmt.Sprintf("kube-apiserver-%d", cp.apiServerStarts)
	}
	cp.apiServer = startProcess(cp.t, name, cp.Dir,
		cp.NetNS.Command(filepath.Join(cp.BinDir, "kube-apiserver"), cp.apiServerArgs...))
	// Its graceful shutdown waits for long-running requests (kube-proxy's
	// watches) well past 15 s; tests gain nothing from waiting that long.
	cp.apiServer.Grace = 3 * time.Second
	cp.WaitReady(cp.readyTimeout)
}

// refuseShared fails the test when cp is a view of the shared control
// plane: other tests depend on its processes.
func (cp *ControlPlane) refuseShared(what string) {
	cp.t.Helper()
	if cp.shared {
		cp.t.Fatalf("%s: the control plane is shared by the package's tests (controlplane.Shared); "+
			"a test that stops or restarts the apiserver needs its own (controlplane.Start)", what)
	}
}

// checkIP skips (or fails, see skipOrFail) without the ip command.
func checkIP(t testing.TB) {
	t.Helper()
	if _, err := exec.LookPath("ip"); err != nil {
		skipOrFail(t, "needs the ip command (Debian package iproute2)")
	}
}

// APIServer is the running (or last) kube-apiserver process.
func (cp *ControlPlane) APIServer() *Process { return cp.apiServer }

// Etcd is the etcd process.
func (cp *ControlPlane) Etcd() *Process { return cp.etcd }

// WaitReady polls the apiserver's /readyz until it answers "ok" or timeout
// passes (then the test fails with the last answer).
func (cp *ControlPlane) WaitReady(timeout time.Duration) {
	cp.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	var last string
	for {
		body, err := cp.Client.Discovery().RESTClient().Get().AbsPath("/readyz").DoRaw(ctx)
		if err == nil && strings.TrimSpace(string(body)) == "ok" {
			return
		}
		last = fmt.Sprintf("%v %s", err, body)
		if cp.apiServer.Exited() {
			cp.t.Fatalf("kube-apiserver exited before becoming ready; log tail:\n%s", tail(cp.apiServer.LogPath, 30))
		}
		select {
		case <-ctx.Done():
			cp.t.Fatalf("kube-apiserver not ready after %v: %s; log tail:\n%s", timeout, last, tail(cp.apiServer.LogPath, 30))
		case <-time.After(500 * time.Millisecond):
		}
	}
}

// Kubeconfig returns a kubeconfig for the apiserver with the given bearer
// token, for programs run inside the namespace.
func Kubeconfig(token string) string {
	return fmt.Sprintf(`apiVersion: v1
kind: Config
clusters:
- name: local
  cluster:
    server: %s
    insecure-skip-tls-verify: true
users:
- name: user
  user:
    token: %s
contexts:
- name: local
  context: {cluster: local, user: user}
current-context: local
`, APIServerURL, token)
}

// findBinDir returns the folder holding the named binaries or skips.
func findBinDir(t testing.TB, dir string, names ...string) string {
	t.Helper()
	if dir == "" {
		dir = os.Getenv("REMEDIATE_CONTROLPLANE_BIN")
	}
	if dir == "" {
		if root, ok := repoRoot(); ok {
			dir = filepath.Join(root, "_output", "bin")
		}
	}
	for _, n := range names {
		if _, err := os.Stat(filepath.Join(dir, n)); err != nil {
			skipOrFail(t, fmt.Sprintf("%s not found in %q: build the pinned binaries with `make controlplane-bins` "+
				"(or tools/controlplane/build.sh), or point REMEDIATE_CONTROLPLANE_BIN at a folder holding them", n, dir))
		}
	}
	return dir
}

// repoRoot walks up from the working directory (a package folder under go
// test) to the folder holding this module's go.mod.
func repoRoot() (string, bool) {
	d, err := os.Getwd()
	if err != nil {
		return "", false
	}
	for {
		b, err := os.ReadFile(filepath.Join(d, "go.mod"))
		if err == nil && bytes.HasPrefix(bytes.TrimSpace(b), []byte("module github.com/remediate-dev/remediate\n")) {
			return d, true
		}
		if err == nil && bytes.Contains(b, []byte("\nmodule github.com/remediate-dev/remediate\n")) {
			return d, true
		}
		parent := filepath.Dir(d)
		if parent == d {
			return "", false
		}
		d = parent
	}
}

func writeServiceAccountKey(t testing.TB, keyPath, pubPath string) {
	t.Helper()
	key, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatalf("generate service account key: %v", err)
	}
	pub, err := x509.MarshalPKIXPublicKey(&key.PublicKey)
	if err != nil {
		t.Fatalf("marshal public key: %v", err)
	}
	mustWrite(t, keyPath, string(pem.EncodeToMemory(&pem.Block{Type: "RSA PRIVATE KEY", Bytes: x509.MarshalPKCS1PrivateKey(key)})))
	mustWrite(t, pubPath, string(pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: pub})))
}

func mustWrite(t testing.TB, path, content string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		t.Fatalf("write %s: %v", path, err)
	}
}
