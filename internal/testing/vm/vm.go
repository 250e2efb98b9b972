//go:build linux

// Package vm is the guest side of the real-kernel test lane: tests
// named TestVM* call Require, which skips them everywhere except inside the
// throwaway QEMU VM that tools/vm/run.sh boots (REMEDIATE_IN_VM=1), where a
// Debian kernel with ip_vs runs. Inside the VM the guest's root network
// namespace plays the node (kube-proxy's IPVS director, as a hostNetwork
// daemon sees it) and Lab builds clients and backends in namespaces of their
// own, joined to it by veth pairs, with the service addresses on a dummy
// kube-ipvs0 interface as kube-proxy does.
//
// The cgroup helpers (cgroup.go) let a test use cgroup v2 with the cpu
// controller, which the hosts do not have (their cpu controller is v1).
//
// Nothing here may run on a developer's or CI host: it changes the root
// namespace's IPVS table, sysctls, interfaces and cgroups, which is
// harmless only in a VM that is powered off afterwards.
package vm

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/vishvananda/netns"
)

// EnvInVM is set to "1" by tools/vm/run.sh for the test binaries it runs in
// the guest.
const EnvInVM = "REMEDIATE_IN_VM"

// InVM reports whether this process runs inside the test VM.
func InVM() bool { return os.Getenv(EnvInVM) == "1" }

// Require skips t unless it runs inside the test VM; inside it, it fails
// when the kernel has no IPVS (the VM exists to have it). It resets the
// root namespace's IPVS table and the IPVS sysctls the tests change, now
// and when t ends.
func Require(t testing.TB) {
	t.Helper()
	if !InVM() {
		t.Skip("runs only inside the IPVS test VM (make test-vm; " + EnvInVM + "=1)")
	}
	if _, err := os.Stat("/proc/net/ip_vs"); err != nil {
		t.Fatalf("inside the VM but no IPVS: %v", err)
	}
	reset := func() {
		Sh(t, "ipvsadm", "-C")
		Sh(t, "ipvsadm", "--set", "900", "120", "300")
		for k, v := range map[string]string{"expire_nodest_conn": "0", "expire_quiescent_template": "0", "conntrack": "0"} {
			WriteSysctl(t, "net/ipv4/vs/"+k, v)
		}
	}
	reset()
	t.Cleanup(reset)
}

// Sh runs a command in the root namespace and fails t on error; it returns
// the combined output.
func Sh(t testing.TB, args ...string) string {
	t.Helper()
	out, err := exec.Command(args[0], args[1:]...).CombinedOutput()
	if err != nil {
		t.Fatalf("%s: %v: %s", strings.Join(args, " "), err, out)
	}
	return string(out)
}

// ShIn runs a command in the named namespace ("" = root).
func ShIn(t testing.TB, ns string, args ...string) string {
	t.Helper()
	if ns == "" {
		return Sh(t, args...)
	}
	return Sh(t, append([]string{"ip", "netns", "exec", ns}, args...)...)
}

// WriteSysctl writes /proc/sys/<name>.
func WriteSysctl(t testing.TB, name, value string) {
	t.Helper()
	if err := os.WriteFile("/proc/sys/"+name, []byte(value), 0o644); err != nil {
		t.Fatalf("sysctl %s=%s: %v", name, value, err)
	}
}

// ReadSysctl reads /proc/sys/<name>, trimmed.
func ReadSysctl(t testing.TB, name string) string {
	t.Helper()
	b, err := os.ReadFile("/proc/sys/" + name)
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(b))
}

// Host is a namespace joined to the root namespace by a veth pair, with
// one IPv4 and one IPv6 address, routed through the root namespace.
type Host struct {
	NS     string
	Name   string // short name, e.g. "b1"; backends answer with it
	V4, V6 netip.Addr
}

// Lab is the test topology: the root namespace is the IPVS director
// ("the node"), the service addresses live on kube-ipvs0, and each Host
// is a client or a backend pod.
type Lab struct {
	t       testing.TB
	cleanup func(func())
	n       int
	Hosts   map[string]*Host
}

var (
	sharedMu  sync.Mutex
	sharedLab *Lab
)

// Shared VIPs on the shared lab's kube-ipvs0.
var (
	VIPDNS  = netip.MustParseAddr("10.96.0.10")
	VIPAPI  = netip.MustParseAddr("10.96.0.1")
	VIPDNS6 = netip.MustParseAddr("fd00:96::10")
)

// SharedLab returns the test binary's lab: kube-ipvs0 with VIPDNS, VIPAPI
// and VIPDNS6, and the hosts "client" (10.0.1.2), "b1" (10.0.2.2) and "b2"
// (10.0.3.2). Namespaces cost seconds each under TCG, so it is built once
// per test binary and never deleted (the VM is powered off after the
// tests); tests must leave its interfaces as they found them.
func SharedLab(t testing.TB) *Lab {
	t.Helper()
	sharedMu.Lock()
	defer sharedMu.Unlock()
	if sharedLab == nil {
		l := newLab(t, func(func()) {}, VIPDNS, VIPAPI, VIPDNS6)
		for _, h := range []string{"client", "b1", "b2"} {
			l.AddHost(h)
		}
		l.t = nil // AddHost after creation would report to a finished test
		sharedLab = l
	}
	return sharedLab
}

// NewLab creates kube-ipvs0 with vips (IPv4 /32, IPv6 /128) and turns on
// forwarding; everything is deleted when t ends.
func NewLab(t testing.TB, vips ...netip.Addr) *Lab {
	t.Helper()
	return newLab(t, t.Cleanup, vips...)
}

func newLab(t testing.TB, cleanup func(func()), vips ...netip.Addr) *Lab {
	t.Helper()
	l := &Lab{t: t, cleanup: cleanup, Hosts: map[string]*Host{}}
	_ = exec.Command("ip", "link", "del", "kube-ipvs0").Run()
	Sh(t, "ip", "link", "add", "kube-ipvs0", "type", "dummy")
	cleanup(func() { _ = exec.Command("ip", "link", "del", "kube-ipvs0").Run() })
	for _, v := range vips {
		bits := 32
		if v.Is6() {
			bits = 128
		}
		Sh(t, "ip", "addr", "add", netip.PrefixFrom(v, bits).String(), "dev", "kube-ipvs0")
	}
	Sh(t, "ip", "link", "set", "kube-ipvs0", "up")
	WriteSysctl(t, "net/ipv4/ip_forward", "1")
	WriteSysctl(t, "net/ipv6/conf/all/forwarding", "1")
	return l
}

// AddHost creates namespace "vm-<name>" with 10.0.<i>.2/24 and fd00:<i>::2/64,
// the root side being .1 / ::1, default routes through the root namespace.
func (l *Lab) AddHost(name string) *Host {
	t := l.t
	t.Helper()
	l.n++
	i := l.n
	ns := "vm-" + name
	_ = exec.Command("ip", "netns", "del", ns).Run()
	Sh(t, "ip", "netns", "add", ns)
	l.cleanup(func() { _ = exec.Command("ip", "netns", "del", ns).Run() })
	host, peer := "veth-"+name, "eth0"
	Sh(t, "ip", "link", "add", host, "type", "veth", "peer", "name", peer, "netns", ns)
	h := &Host{NS: ns, Name: name,
		V4: netip.MustParseAddr(fmt.Sprintf("10.0.%d.2", i)),
		V6: netip.MustParseAddr(fmt.Sprintf("fd00:%d::2", i))}
	Sh(t, "ip", "addr", "add", fmt.Sprintf("10.0.%d.1/24", i), "dev", host)
	Sh(t, "ip", "-6", "addr", "add", fmt.Sprintf("fd00:%d::1/64", i), "dev", host, "nodad")
	Sh(t, "ip", "link", "set", host, "up")
	ShIn(t, ns, "ip", "link", "set", "lo", "up")
	ShIn(t, ns, "ip", "addr", "add", h.V4.String()+"/24", "dev", peer)
	ShIn(t, ns, "ip", "-6", "addr", "add", h.V6.String()+"/64", "dev", peer, "nodad")
	ShIn(t, ns, "ip", "link", "set", peer, "up")
	ShIn(t, ns, "ip", "route", "add", "default", "via", fmt.Sprintf("10.0.%d.1", i))
	ShIn(t, ns, "ip", "-6", "route", "add", "default", "via", fmt.Sprintf("fd00:%d::1", i))
	l.Hosts[name] = h
	return h
}

// InNS runs fn on an OS thread switched into the namespace; sockets fn
// opens stay in that namespace after the thread switches back.
func InNS(ns string, fn func() error) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		// The thread is not unlocked if switching back fails: it then
		// dies with the goroutine instead of serving others.
		orig, err := netns.Get()
		if err != nil {
			errc <- err
			return
		}
		defer orig.Close()
		target, err := netns.GetFromName(ns)
		if err != nil {
			errc <- fmt.Errorf("namespace %s: %w", ns, err)
			return
		}
		defer target.Close()
		if err := netns.Set(target); err != nil {
			errc <- fmt.Errorf("entering %s: %w", ns, err)
			return
		}
		ferr := fn()
		if err := netns.Set(orig); err != nil {
			errc <- fmt.Errorf("leaving %s: %w", ns, err)
			return
		}
		runtime.UnlockOSThread()
		errc <- ferr
	}()
	return <-errc
}

// Server is a backend that answers on UDP (each datagram with its name)
// and TCP (each connection with its name, held open until the client
// closes) on every address of its namespace.
type Server struct {
	h    *Host
	port int
	udp  net.PacketConn
	tcp  net.Listener
	mu   sync.Mutex
	hits int
}

// Serve starts a Server in h on port, stopped when t ends or by Stop.
func Serve(t testing.TB, h *Host, port int) *Server {
	t.Helper()
	s := &Server{h: h, port: port}
	err := InNS(h.NS, func() error {
		var err error
		if s.udp, err = net.ListenPacket("udp", fmt.Sprintf(":%d", port)); err != nil {
			return err
		}
		s.tcp, err = net.Listen("tcp", fmt.Sprintf(":%d", port))
		return err
	})
	if err != nil {
		t.Fatalf("serving in %s: %v", h.NS, err)
	}
	go func() {
		buf := make([]byte, 1500)
		for {
			n, from, err := s.udp.ReadFrom(buf)
			if err != nil {
				return
			}
			_ = n
			s.mu.Lock()
			s.hits++
			s.mu.Unlock()
			_, _ = s.udp.WriteTo([]byte(h.Name), from)
		}
	}()
	go func() {
		for {
			c, err := s.tcp.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				_, _ = c.Write([]byte(h.Name))
				_, _ = c.Read(make([]byte, 1)) // until the client closes
			}()
		}
	}()
	t.Cleanup(s.Stop)
	return s
}

// Stop closes the server's sockets: the backend "dies" (its address stays).
func (s *Server) Stop() {
	_ = s.udp.Close()
	_ = s.tcp.Close()
}

// UDPHits is how many datagrams the server received.
func (s *Server) UDPHits() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.hits
}

var nextPort atomic.Int32

// ClientPort returns a client source port not used before by this test
// binary: IPVS keeps a connection entry per client address and port for
// minutes, even after its virtual server is deleted, and a reused port
// would be pinned by an earlier test's entry.
func ClientPort() int { return 40000 + int(nextPort.Add(1)) }

// UDPClient is a UDP socket in a client namespace bound to a fixed source
// port, so IPVS sees one flow across queries (as a resolver that reuses
// its socket does).
type UDPClient struct {
	c  *net.UDPConn
	to netip.AddrPort
}

// NewUDPClient opens a UDP socket in h's namespace, bound to srcPort,
// talking to vip; closed when t ends.
func NewUDPClient(t testing.TB, h *Host, srcPort int, vip netip.AddrPort) *UDPClient {
	t.Helper()
	local := h.V4
	if vip.Addr().Is6() {
		local = h.V6
	}
	var c *net.UDPConn
	err := InNS(h.NS, func() error {
		var err error
		c, err = net.ListenUDP("udp", net.UDPAddrFromAddrPort(netip.AddrPortFrom(local, uint16(srcPort))))
		return err
	})
	if err != nil {
		t.Fatalf("UDP client in %s: %v", h.NS, err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return &UDPClient{c: c, to: vip}
}

// Query sends one datagram and returns the name of the backend that
// answered, or "" when nothing answered within wait.
func (u *UDPClient) Query(wait time.Duration) (string, error) {
	if _, err := u.c.WriteToUDPAddrPort([]byte("q"), u.to); err != nil {
		return "", err
	}
	buf := make([]byte, 64)
	deadline := time.Now().Add(wait)
	for {
		_ = u.c.SetReadDeadline(deadline)
		n, from, err := u.c.ReadFromUDPAddrPort(buf)
		if err != nil {
			if ne, ok := err.(net.Error); ok && ne.Timeout() {
				return "", nil
			}
			return "", err
		}
		if from.Addr().Unmap() == u.to.Addr().Unmap() && from.Port() == u.to.Port() {
			return string(buf[:n]), nil
		}
	}
}

// LocalPort is the client's source port.
func (u *UDPClient) LocalPort() int { return u.c.LocalAddr().(*net.UDPAddr).Port }

// TCPConnect opens a TCP connection from h to vip and returns the backend's
// name and the open connection (closed when t ends).
func TCPConnect(t testing.TB, h *Host, vip netip.AddrPort) (string, net.Conn) {
	t.Helper()
	var c net.Conn
	err := InNS(h.NS, func() error {
		var err error
		d := net.Dialer{Timeout: 5 * time.Second}
		c, err = d.DialContext(context.Background(), "tcp", vip.String())
		return err
	})
	if err != nil {
		t.Fatalf("TCP connect from %s to %s: %v", h.NS, vip, err)
	}
	t.Cleanup(func() { _ = c.Close() })
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	buf := make([]byte, 64)
	n, err := c.Read(buf)
	if err != nil {
		t.Fatalf("TCP read from %s: %v", vip, err)
	}
	return string(bytes.TrimSpace(buf[:n])), c
}

// IPVSService adds a virtual server with ipvsadm (kube-proxy's way: NAT,
// scheduler rr unless given) and real servers with weight 1.
func IPVSService(t testing.TB, proto string, vip netip.AddrPort, rss ...netip.AddrPort) {
	t.Helper()
	flag := "-t"
	if proto == "UDP" {
		flag = "-u"
	}
	Sh(t, "ipvsadm", "-A", flag, vip.String(), "-s", "rr")
	for _, r := range rss {
		Sh(t, "ipvsadm", "-a", flag, vip.String(), "-r", r.String(), "-m", "-w", "1")
	}
}
