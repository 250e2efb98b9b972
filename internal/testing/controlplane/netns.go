package controlplane

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// netnsSeq makes namespace names unique within one test binary; the PID
// makes them unique across binaries running at the same time.
var netnsSeq atomic.Int64

// NetNS is a network namespace the test created: lo up, and a veth pair
// (both ends inside the namespace) giving veth0 the address Address and a
// default route, which kube-apiserver needs to pick an advertise address.
// Nothing is added to the host's namespace.
type NetNS struct {
	// Name is the `ip netns` name (rmdcp-<pid>-<n>).
	Name string
	// Address is veth0's IPv4 address (10.200.0.1), also the Node's
	// InternalIP and the apiserver's advertise address.
	Address string
	// Address6 is veth0's IPv6 address (Address6ULA) once EnableIPv6 ran,
	// else "".
	Address6 string
}

// Address6ULA is the IPv6 address EnableIPv6 gives veth0 (a unique local
// address, inside the namespace only).
const Address6ULA = "fd00:200::1"

// NewNetNS creates a network namespace and deletes it in t.Cleanup. Cleanups
// registered after this one (processes started in it) run before it.
func NewNetNS(t testing.TB) *NetNS {
	t.Helper()
	requireRoot(t)
	ns := &NetNS{
		Name:    fmt.Sprintf("rmdcp-%d-%d", os.Getpid(), netnsSeq.Add(1)),
		Address: "10.200.0.1",
	}
	if out, err := exec.Command("ip", "netns", "add", ns.Name).CombinedOutput(); err != nil {
		t.Fatalf("ip netns add %s: %v: %s", ns.Name, err, out)
	}
	t.Cleanup(func() {
		if out, err := exec.Command("ip", "netns", "del", ns.Name).CombinedOutput(); err != nil {
			t.Errorf("ip netns del %s: %v: %s", ns.Name, err, out)
		}
	})
	for _, args := range [][]string{
		{"link", "set", "lo", "up"},
		{"link", "add", "veth0", "type", "veth", "peer", "name", "veth1"},
		{"addr", "add", ns.Address + "/24", "dev", "veth0"},
		{"link", "set", "veth0", "up"},
		{"link", "set", "veth1", "up"},
		{"route", "add", "default", "via", "10.200.0.254", "dev", "veth0", "onlink"},
	} {
		full := append([]string{"-n", ns.Name}, args...)
		if out, err := exec.Command("ip", full...).CombinedOutput(); err != nil {
			t.Fatalf("ip %s: %v: %s", strings.Join(full, " "), err, out)
		}
	}
	return ns
}

// EnableIPv6 gives veth0 the IPv6 address Address6ULA/64 (without
// duplicate address detection) and an IPv6 default route through veth0,
// which IPv6 ClusterIPs need to be routed (and then DNAT'ed) at all, and
// waits (at most 10 s) until the address is local in the routing table.
// It sets Address6. Nothing changes outside the namespace.
//
// The wait matters: the kernel accepts a bind to the new address at once
// but inserts its local route from a work queue, later on a busy machine
// (seen: > 1 s); a connect in between goes out veth0 through the /64
// prefix route, neighbour discovery fails and it ends in EHOSTUNREACH
// after 3 s.
func (ns *NetNS) EnableIPv6(t testing.TB) {
	t.Helper()
	ip := func(args ...string) (string, error) {
		full := append([]string{"-n", ns.Name}, args...)
		out, err := exec.Command("ip", full...).CombinedOutput()
		if err != nil {
			return string(out), fmt.Errorf("ip %s: %w: %s", strings.Join(full, " "), err, out)
		}
		return string(out), nil
	}
	for _, args := range [][]string{
		{"-6", "addr", "add", Address6ULA + "/64", "dev", "veth0", "nodad"},
		{"-6", "route", "add", "default", "dev", "veth0"},
	} {
		if _, err := ip(args...); err != nil {
			t.Fatal(err)
		}
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		out, err := ip("-6", "route", "get", Address6ULA)
		if err == nil && strings.HasPrefix(out, "local ") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s is not local in namespace %s after 10 s: %v %s", Address6ULA, ns.Name, err, out)
		}
		time.Sleep(20 * time.Millisecond)
	}
	ns.Address6 = Address6ULA
}

// Command returns a command that runs name inside the namespace through
// `ip netns exec`, which execs it: the command's PID is the program's PID.
func (ns *NetNS) Command(name string, args ...string) *exec.Cmd {
	return exec.Command("ip", append([]string{"netns", "exec", ns.Name, name}, args...)...)
}

// CommandContext is Command bound to ctx.
func (ns *NetNS) CommandContext(ctx context.Context, name string, args ...string) *exec.Cmd {
	return exec.CommandContext(ctx, "ip", append([]string{"netns", "exec", ns.Name, name}, args...)...)
}

// DialContext dials an address inside the namespace (for example
// 127.0.0.1:10249) from the test process.
//
// How: the dial runs on a goroutine locked to its OS thread, which setns(2)s
// into the namespace, creates and connects the socket, and switches back
// before unlocking. A socket belongs to the namespace it was created in, so
// the returned connection keeps working from any goroutine. If switching back
// fails, the thread is left locked and dies with its goroutine instead of
// running other goroutines in the wrong namespace.
func (ns *NetNS) DialContext(ctx context.Context, network, addr string) (net.Conn, error) {
	var c net.Conn
	err := ns.in(func() error {
		var d net.Dialer
		var err error
		c, err = d.DialContext(ctx, network, addr)
		return err
	})
	return c, err
}

// in runs fn on a goroutine locked to its OS thread while that thread is in
// the namespace (see DialContext). Sockets fn creates stay in the namespace.
func (ns *NetNS) in(fn func() error) error {
	ch := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		orig, err := os.Open(fmt.Sprintf("/proc/%d/task/%d/ns/net", os.Getpid(), unix.Gettid()))
		if err != nil {
			runtime.UnlockOSThread()
			ch <- fmt.Errorf("open own netns: %w", err)
			return
		}
		defer orig.Close()
		target, err := os.Open("/run/netns/" + ns.Name)
		if err != nil {
			runtime.UnlockOSThread()
			ch <- fmt.Errorf("open netns %s: %w", ns.Name, err)
			return
		}
		defer target.Close()
		if err := unix.Setns(int(target.Fd()), unix.CLONE_NEWNET); err != nil {
			runtime.UnlockOSThread()
			ch <- fmt.Errorf("setns %s: %w", ns.Name, err)
			return
		}
		ferr := fn()
		if err := unix.Setns(int(orig.Fd()), unix.CLONE_NEWNET); err != nil {
			// Stay locked: the runtime ends this thread when the goroutine
			// returns.
			ch <- ferr
			return
		}
		runtime.UnlockOSThread()
		ch <- ferr
	}()
	return <-ch
}

// HTTPClient returns an HTTP client whose connections are made inside the
// namespace, so "http://127.0.0.1:10249/metrics" reaches a server
// listening on the namespace's loopback. Keep-alives are off so that each
// request is a fresh connection (as the daemon's scrapes are).
func (ns *NetNS) HTTPClient(timeout time.Duration) *http.Client {
	return &http.Client{
		Timeout: timeout,
		Transport: &http.Transport{
			DialContext:       ns.DialContext,
			DisableKeepAlives: true,
			Proxy:             nil,
		},
	}
}

func requireRoot(t testing.TB) {
	t.Helper()
	if os.Geteuid() != 0 {
		skipOrFail(t, "needs root: creates a network namespace and runs kube-apiserver, etcd and kube-proxy in it (CI runs as root)")
	}
}

// skipOrFail skips, unless REMEDIATE_E2E_REQUIRED is set (CI sets it), in
// which case a missing prerequisite fails the test instead of hiding it.
func skipOrFail(t testing.TB, msg string) {
	t.Helper()
	if os.Getenv("REMEDIATE_E2E_REQUIRED") != "" {
		t.Fatalf("REMEDIATE_E2E_REQUIRED is set but: %s", msg)
	}
	t.Skip(msg)
}

// Listen opens a listening socket inside the namespace (it stays there
// whichever thread later accepts on it).
func (ns *NetNS) Listen(network, addr string) (net.Listener, error) {
	var l net.Listener
	err := ns.in(func() error {
		var err error
		l, err = net.Listen(network, addr)
		return err
	})
	return l, err
}
