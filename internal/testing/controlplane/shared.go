package controlplane

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	corev1 "k8s.io/api/core/v1"
)

// The shared control plane: one etcd + kube-apiserver per test binary,
// started by the first Shared call and stopped by SharedMain after the
// package's tests ran. Starting one costs 5-60 s on a loaded 2-core machine;
// a package with several e2e tests pays it once.
//
// Isolation. Each Shared call returns a view of its own: a network
// namespace of the test's own (kube-proxy, its iptables/nftables state, its
// ports 10249/10256 and its lock file are the test's alone), reaching the
// shared apiserver through a forwarder listening on the view's
// 0.0.0.0:6443 (so both https://127.0.0.1:6443 and the `kubernetes`
// Service's endpoint, the namespace's address :6443, work there as they do
// with Start), its own folder and client. What the tests still share is the
// API's contents: kube-proxy and cluster views see every Service in the
// cluster. So tests using Shared
//   - run one at a time (Shared refuses a second test while another one's
//     view is in use: no t.Parallel);
//   - make their objects in a namespace of their own (ControlPlane.Namespace),
//     deleted and waited for until gone when the test ends;
//   - get the Node kube-proxy needs deleted when the test ends
//     (StartKubeProxy does it on a view).
//
// A test that stops the apiserver, needs other apiserver flags, or asserts
// on something a previous test may have left in cluster-scoped state keeps
// its own control plane (Start).
var shared struct {
	mu      sync.Mutex
	main    bool // SharedMain is running the tests
	started bool
	cp      *ControlPlane
	err     string // why starting failed; every later caller fails with it
	owner   *ownerTB
	active  map[string]bool // names of the tests holding a view
}

// Shared returns a view of the test binary's shared control plane,
// starting it on first use (etcd + kube-apiserver, as Start does with zero
// Options). The package's TestMain must run its tests through SharedMain,
// which stops it by PID afterwards:
//
//	func TestMain(m *testing.M) { os.Exit(controlplane.SharedMain(m)) }
//
// Like Start, it skips with the reason when not root or when the binaries
// are missing, and fails instead under REMEDIATE_E2E_REQUIRED=1. See the
// package's shared-control-plane notes (above) for what a test sharing it
// must do; StopAPIServer and StartAPIServer fail the test on a view.
func Shared(t testing.TB) *ControlPlane {
	t.Helper()
	requireRoot(t)
	findBinDir(t, "", "etcd", "kube-apiserver")
	checkIP(t)
	base, msg := acquireShared(t)
	if msg != "" {
		t.Fatal(msg)
	}
	t.Cleanup(func() { releaseShared(t.Name()) })
	return base.view(t)
}

// SharedMain runs the tests (m.Run) and then stops the shared control plane
// if a test started it; it returns the exit code for os.Exit.
func SharedMain(m *testing.M) int {
	shared.mu.Lock()
	shared.main = true
	shared.mu.Unlock()
	code := m.Run()
	if !stopShared() && code == 0 {
		code = 1
	}
	return code
}

// acquireShared starts the shared control plane if needed and registers t
// as a user; it returns a message when t may not use it.
func acquireShared(t testing.TB) (*ControlPlane, string) {
	shared.mu.Lock()
	defer shared.mu.Unlock()
	if !shared.main {
		return nil, "controlplane.Shared: the package's TestMain must run the tests through controlplane.SharedMain " +
			"(func TestMain(m *testing.M) { os.Exit(controlplane.SharedMain(m)) }), which stops the shared control plane"
	}
	if shared.active == nil {
		shared.active = map[string]bool{}
	}
	if msg := overlapping(shared.active, t.Name()); msg != "" {
		return nil, msg
	}
	if !shared.started {
		shared.started = true
		start := time.Now()
		shared.cp, shared.owner, shared.err = startShared()
		if shared.err == "" {
			t.Logf("shared control plane started in %v (etcd pid %d, kube-apiserver pid %d, namespace %s)",
				time.Since(start).Round(time.Millisecond), shared.cp.etcd.Pid(), shared.cp.apiServer.Pid(), shared.cp.NetNS.Name)
		}
	}
	if shared.err != "" {
		return nil, "the shared control plane did not start: " + shared.err
	}
	if shared.cp.apiServer.Exited() || shared.cp.etcd.Exited() {
		return nil, fmt.Sprintf("the shared control plane is down (kube-apiserver exited: %v, etcd exited: %v); logs:\n%s\n%s",
			shared.cp.apiServer.Exited(), shared.cp.etcd.Exited(), tail(shared.cp.apiServer.LogPath, 20), tail(shared.cp.etcd.LogPath, 10))
	}
	shared.active[t.Name()] = true
	return shared.cp, ""
}

func releaseShared(name string) {
	shared.mu.Lock()
	defer shared.mu.Unlock()
	delete(shared.active, name)
}

// overlapping returns why name may not take a view while the tests in
// active hold one: only a subtest of a holder may (it runs inside it).
func overlapping(active map[string]bool, name string) string {
	var others []string
	for a := range active {
		if !strings.HasPrefix(name, a+"/") {
			others = append(others, a)
		}
	}
	if len(others) == 0 {
		return ""
	}
	sort.Strings(others)
	return fmt.Sprintf("controlplane.Shared: %s is in use by %s; tests sharing the control plane see each other's Services "+
		"and must run one at a time (no t.Parallel)", name, strings.Join(others, ", "))
}

// startShared starts etcd and kube-apiserver owned by an ownerTB, whose
// Fatalf panics with ownerFatal; a failure is returned as text after the
// partial start was torn down.
func startShared() (cp *ControlPlane, owner *ownerTB, failure string) {
	owner = &ownerTB{}
	defer func() {
		if r := recover(); r != nil {
			f, ok := r.(ownerFatal)
			if !ok {
				panic(r)
			}
			owner.stop()
			cp, owner, failure = nil, nil, string(f)
		}
	}()
	return Start(owner, Options{}), owner, ""
}

// stopShared stops the shared control plane's processes by PID and deletes
// its namespace and folders; it reports false if any of that failed.
func stopShared() bool {
	shared.mu.Lock()
	defer shared.mu.Unlock()
	if shared.owner == nil {
		return true
	}
	ok := shared.owner.stop()
	shared.owner, shared.cp = nil, nil
	shared.err = "stopped by SharedMain"
	return ok
}

// view is the per-test ControlPlane over the shared processes.
func (base *ControlPlane) view(t testing.TB) *ControlPlane {
	t.Helper()
	dir := t.TempDir()
	ns := NewNetNS(t)
	cfg := rest.CopyConfig(base.RestConfig)
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatalf("client: %v", err)
	}
	v := &ControlPlane{NetNS: ns, Dir: dir, BinDir: base.BinDir, Client: client, RestConfig: cfg,
		AdminKubeconfig: filepath.Join(dir, "admin.kubeconfig"),
		// IPv4 single-stack (Start's default): the shared apiserver
		// advertises 10.200.0.1, which is also the view's veth0 address.
		ServiceCIDR: base.ServiceCIDR, NodeAddress: base.NodeAddress,
		etcd: base.etcd, apiServer: base.apiServer, readyTimeout: base.readyTimeout,
		t: t, shared: true}
	if v.NodeAddress != ns.Address {
		t.Fatalf("shared control plane advertises %s, the view's namespace has %s", v.NodeAddress, ns.Address)
	}
	mustWrite(t, v.AdminKubeconfig, Kubeconfig(AdminToken))
	forwardAPIServer(t, ns, base.NetNS)
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("--- last lines of the shared kube-apiserver (pid %d, %s):\n%s", base.apiServer.Pid(), base.apiServer.LogPath, tail(base.apiServer.LogPath, 25))
		}
	})
	return v
}

// forwardAPIServer listens on 0.0.0.0:6443 inside from and forwards each
// connection to 127.0.0.1:6443 inside to (the shared apiserver). The
// listener and every connection are closed in t.Cleanup, before from is
// deleted.
func forwardAPIServer(t testing.TB, from, to *NetNS) {
	t.Helper()
	l, err := from.Listen("tcp", "0.0.0.0:6443")
	if err != nil {
		t.Fatalf("listen on :6443 in %s: %v", from.Name, err)
	}
	var (
		mu     sync.Mutex
		conns  = map[net.Conn]struct{}{}
		closed bool
		wg     sync.WaitGroup
	)
	track := func(c net.Conn) bool {
		mu.Lock()
		defer mu.Unlock()
		if closed {
			c.Close()
			return false
		}
		conns[c] = struct{}{}
		return true
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			if !track(c) {
				return
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer c.Close()
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				up, err := to.DialContext(ctx, "tcp", "127.0.0.1:6443")
				cancel()
				if err != nil || !track(up) {
					return
				}
				defer up.Close()
				done := make(chan struct{}, 2)
				go func() { _, _ = io.Copy(up, c); done <- struct{}{} }()
				go func() { _, _ = io.Copy(c, up); done <- struct{}{} }()
				<-done // either side ended: end both
				c.Close()
				up.Close()
				<-done
			}()
		}
	}()
	t.Cleanup(func() {
		l.Close()
		mu.Lock()
		closed = true
		for c := range conns {
			c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
}

// nsSeq makes the names Namespace returns unique within the test binary.
var nsSeq atomic.Int64

// Namespace creates a Kubernetes namespace named <prefix>-<n> (unique
// within the test binary) and returns its name. When the test ends it
// deletes every object in it (every namespaced resource that can be listed
// and deleted; Pods with grace period 0), then the namespace, and waits up
// to 60 s until all of it is gone (else the test fails). No
// controller-manager runs, so neither the namespace controller nor the
// garbage collector would: without this, a Terminating namespace and its
// Services would stay for later tests on a shared control plane to see.
func (cp *ControlPlane) Namespace(prefix string) string {
	t := cp.t
	t.Helper()
	name := fmt.Sprintf("%s-%d", prefix, nsSeq.Add(1))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := cp.Client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create namespace %s: %v", name, err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		if err := cp.deleteNamespace(ctx, name); err != nil {
			t.Errorf("delete namespace %s: %v", name, err)
		}
	})
	return name
}

// deleteNamespace does what the namespace controller would: delete the
// contents, wait until they are gone, then the namespace (finalized by
// hand) and wait until it is gone.
func (cp *ControlPlane) deleteNamespace(ctx context.Context, name string) error {
	cfg := rest.CopyConfig(cp.RestConfig)
	cfg.WarningHandler = rest.NoWarnings{} // listing v1 Endpoints warns that it is deprecated
	dc, err := discovery.NewDiscoveryClientForConfig(cfg)
	if err != nil {
		return err
	}
	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		return err
	}
	lists, err := dc.ServerPreferredNamespacedResources()
	if err != nil && len(lists) == 0 {
		return fmt.Errorf("discovery: %w", err)
	}
	var gvrs []schema.GroupVersionResource
	for _, l := range lists {
		gv, err := schema.ParseGroupVersion(l.GroupVersion)
		if err != nil {
			continue
		}
		for _, r := range l.APIResources {
			if strings.Contains(r.Name, "/") || !hasVerbs(r.Verbs, "list", "delete") {
				continue
			}
			gvrs = append(gvrs, gv.WithResource(r.Name))
		}
	}
	zero := int64(0)
	for {
		left := 0
		var errs []error
		for _, gvr := range gvrs {
			objs, err := dyn.Resource(gvr).Namespace(name).List(ctx, metav1.ListOptions{})
			if err != nil {
				errs = append(errs, fmt.Errorf("list %s: %w", gvr.Resource, err))
				continue
			}
			for _, o := range objs.Items {
				left++
				if o.GetDeletionTimestamp() != nil {
					continue
				}
				err := dyn.Resource(gvr).Namespace(name).Delete(ctx, o.GetName(), metav1.DeleteOptions{GracePeriodSeconds: &zero})
				if err != nil && !apierrors.IsNotFound(err) {
					errs = append(errs, fmt.Errorf("delete %s %s: %w", gvr.Resource, o.GetName(), err))
				}
			}
		}
		if left == 0 && len(errs) == 0 {
			break
		}
		if ctx.Err() != nil {
			return fmt.Errorf("%d objects left: %w", left, errors.Join(append(errs, ctx.Err())...))
		}
		time.Sleep(100 * time.Millisecond)
	}
	nsc := cp.Client.CoreV1().Namespaces()
	if err := nsc.Delete(ctx, name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
		return err
	}
	for {
		ns, err := nsc.Get(ctx, name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return nil
		}
		if err != nil {
			return err
		}
		if len(ns.Spec.Finalizers) > 0 {
			ns.Spec.Finalizers = nil
			if _, err := nsc.Finalize(ctx, ns, metav1.UpdateOptions{}); err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
				return fmt.Errorf("finalize: %w", err)
			}
			continue
		}
		if ctx.Err() != nil {
			return fmt.Errorf("namespace still present (phase %s): %w", ns.Status.Phase, ctx.Err())
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func hasVerbs(have metav1.Verbs, want ...string) bool {
	for _, w := range want {
		found := false
		for _, h := range have {
			if h == w {
				found = true
			}
		}
		if !found {
			return false
		}
	}
	return true
}

// ownerFatal is the panic value of ownerTB's Fatal family.
type ownerFatal string

// ownerTB stands in for a test as the owner of the shared control plane:
// its cleanups run in stop (called by SharedMain), not when the test that
// happened to start it ends. Only the testing.TB methods the harness calls
// are implemented (the embedded nil TB is never used); Fatal and Skip panic
// with ownerFatal, which startShared recovers.
type ownerTB struct {
	testing.TB
	mu       sync.Mutex
	cleanups []func()
	dirs     []string
	failed   bool
}

func (o *ownerTB) Helper()      {}
func (o *ownerTB) Name() string { return "shared-control-plane" }
func (o *ownerTB) Cleanup(f func()) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.cleanups = append(o.cleanups, f)
}
func (o *ownerTB) TempDir() string {
	d, err := os.MkdirTemp("", "rmdcp-shared-")
	if err != nil {
		o.Fatalf("temp dir: %v", err)
	}
	o.mu.Lock()
	o.dirs = append(o.dirs, d)
	o.mu.Unlock()
	return d
}
func (o *ownerTB) Failed() bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.failed
}
func (o *ownerTB) Log(args ...any) { o.Logf("%s", fmt.Sprint(args...)) }
func (o *ownerTB) Logf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "controlplane (shared): "+format+"\n", args...)
}
func (o *ownerTB) Error(args ...any) { o.Errorf("%s", fmt.Sprint(args...)) }
func (o *ownerTB) Errorf(format string, args ...any) {
	o.mu.Lock()
	o.failed = true
	o.mu.Unlock()
	o.Logf(format, args...)
}
func (o *ownerTB) Fatal(args ...any)                 { o.Fatalf("%s", fmt.Sprint(args...)) }
func (o *ownerTB) Fatalf(format string, args ...any) { panic(ownerFatal(fmt.Sprintf(format, args...))) }
func (o *ownerTB) FailNow()                          { panic(ownerFatal("FailNow")) }
func (o *ownerTB) Skip(args ...any)                  { o.Fatalf("%s", fmt.Sprint(args...)) }
func (o *ownerTB) Skipf(format string, args ...any)  { o.Fatalf(format, args...) }
func (o *ownerTB) SkipNow()                          { o.Fatalf("SkipNow") }

// stop runs the cleanups, last registered first (processes by PID, then the
// namespace), and removes the folders; it reports whether all went well.
func (o *ownerTB) stop() bool {
	o.mu.Lock()
	cs := o.cleanups
	o.cleanups = nil
	o.mu.Unlock()
	for i := len(cs) - 1; i >= 0; i-- {
		func() {
			defer func() {
				if r := recover(); r != nil {
					if f, ok := r.(ownerFatal); ok {
						o.Errorf("%s", string(f))
						return
					}
					panic(r)
				}
			}()
			cs[i]()
		}()
	}
	for _, d := range o.dirs {
		if err := os.RemoveAll(d); err != nil {
			o.Errorf("remove %s: %v", d, err)
		}
	}
	o.dirs = nil
	return !o.Failed()
}
