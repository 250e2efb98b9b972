//go:build linux

package action_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"

	"github.com/remediate-dev/remediate/internal/testing/controlplane"
	"github.com/remediate-dev/remediate/internal/testing/vm"
	"github.com/remediate-dev/remediate/remediate/journal"
)

// The real kube-proxy v1.34.4 in IPVS mode, inside the VM (Debian's kernel
// with ip_vs), watching the real kube-apiserver on the host.
//
// TestIPVSKubeProxyInVM is the host side: it starts etcd and kube-apiserver
// in a test-made network namespace, then boots the VM (tools/vm/run.sh)
// inside that namespace with QEMU user networking isolated from everything
// but one forward, 192.168.100.100:6443 in the guest to the apiserver on the
// namespace's loopback. The guest gets kube-proxy, the remediate binary and
// kubeconfigs in /hostfiles and runs TestVMKubeProxyIPVS.
//
// `make test-vm` runs it (REMEDIATE_VM_KUBEPROXY=1) after the IPVS lane,
// outside `go test ./...` so the VM does not compete with the parallel
// package runs; plain `go test` skips it.

const (
	envVMKubeProxy = "REMEDIATE_VM_KUBEPROXY"
	vmAPIServer    = "https://192.168.100.100:6443"
	vmNodeName     = "vmnode"
	vmNodeIP       = "192.168.100.15"
	vmWebVIP       = "10.96.77.77"
	// kube-proxy's ipvs.excludeCIDRs in the guest: a virtual server there
	// is someone else's (kubernetes/kubernetes#134147).
	vmExcludeCIDR = "10.96.200.0/24"
	// kube-proxy's syncPeriod in the guest: long, so that between API
	// events it does not sync and run its own IPVS cleanup (which would
	// race the daemon for the stale virtual server outside excludeCIDRs)
	// while it still answers /configz. Its syncs on events are immediate
	// (minSyncPeriod 1s).
	vmKubeProxySyncPeriod = "10m"
)

func TestIPVSKubeProxyInVM(t *testing.T) {
	if os.Getenv(envVMKubeProxy) != "1" {
		t.Skipf("boots a VM: run by `make test-vm` (%s=1)", envVMKubeProxy)
	}
	cp := controlplane.Start(t, controlplane.Options{})
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	files := t.TempDir()
	// kube-proxy without its symbol tables: the initramfs is held in the
	// guest's memory.
	kp := filepath.Join(cp.BinDir, "kube-proxy")
	if out, err := exec.Command("strip", "-o", filepath.Join(files, "kube-proxy"), kp).CombinedOutput(); err != nil {
		t.Logf("strip kube-proxy: %v %s; copying it whole", err, out)
		if out, err := exec.Command("cp", kp, filepath.Join(files, "kube-proxy")).CombinedOutput(); err != nil {
			t.Fatalf("cp: %v %s", err, out)
		}
	}
	build := exec.Command("go", "build", "-ldflags=-s -w", "-o", filepath.Join(files, "remediate"), "./cmd/remediate")
	build.Dir = root
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build ./cmd/remediate: %v\n%s", err, out)
	}
	for name, token := range map[string]string{"admin": controlplane.AdminToken, "kube-proxy": controlplane.KubeProxyToken} {
		kc := strings.ReplaceAll(controlplane.Kubeconfig(token), controlplane.APIServerURL, vmAPIServer)
		if !strings.Contains(kc, vmAPIServer) {
			t.Fatalf("kubeconfig does not name %s:\n%s", vmAPIServer, kc)
		}
		if err := os.WriteFile(filepath.Join(files, name+".kubeconfig"), []byte(kc), 0o600); err != nil {
			t.Fatal(err)
		}
	}

	// The kernel download needs the network: outside the namespace.
	prep := exec.Command(filepath.Join(root, "tools/vm/run.sh"))
	prep.Dir = root
	prep.Env = append(os.Environ(), "VM_PREPARE_ONLY=1")
	if out, err := prep.CombinedOutput(); err != nil || !strings.Contains(string(out), "cached in") {
		t.Fatalf("preparing the VM kernel: %v\n%s", err, out)
	}
	cmd := cp.NetNS.Command(filepath.Join(root, "tools/vm/run.sh"), "./remediate/action")
	cmd.Dir = root
	cmd.Env = append(os.Environ(),
		"VM_NET=user", "VM_FORWARD_PORTS=6443", "VM_FILES="+files,
		"VM_RUN=^TestVMKubeProxyIPVS$", "VM_SKIP=",
		// kube-proxy's IPVS mode: ipset and iptables (legacy here) with
		// the modules its rules use.
		"VM_EXTRA_PROGRAMS=ipset iptables-legacy iptables-legacy-save iptables-legacy-restore ip6tables-legacy ip6tables-legacy-save ip6tables-legacy-restore",
		"VM_EXTRA_MODULES=ip_tables iptable_nat iptable_filter iptable_mangle ip6_tables ip6table_nat ip6table_filter ip6table_mangle "+
			"nf_nat xt_nat xt_MASQUERADE xt_mark xt_comment xt_conntrack xt_addrtype xt_tcpudp xt_statistic xt_set xt_multiport ipt_REJECT ip6t_REJECT "+
			"ip_set ip_set_hash_ip ip_set_hash_ipport ip_set_hash_ipportip ip_set_hash_ipportnet ip_set_hash_net ip_set_bitmap_port",
	)
	var out bytes.Buffer
	cmd.Stdout = io.MultiWriter(os.Stderr, &out)
	cmd.Stderr = cmd.Stdout
	err = cmd.Run()
	if err != nil {
		t.Fatalf("the VM run failed: %v (its output is above)", err)
	}
	if !strings.Contains(out.String(), "--- PASS: TestVMKubeProxyIPVS") {
		t.Fatal("TestVMKubeProxyIPVS did not pass inside the VM")
	}
}

// TestVMKubeProxyIPVS (guest side): the real kube-proxy in IPVS mode
// programs a Service with two backends; kube-proxy then freezes (SIGSTOP:
// alive, its /healthz and metrics silent) and one backend's pod goes away,
// so kube-proxy leaves its real server behind. The real remediate binary
// with the examples' rule (shortened windows) reports it in audit mode
// (`--once --dry-run`: nothing changes) and, as a daemon in enforce mode,
// deletes exactly that real server; clients reach the live backend; once
// kube-proxy thaws, its next sync agrees with the kernel as left.
func TestVMKubeProxyIPVS(t *testing.T) {
	vm.Require(t)
	files := os.Getenv("REMEDIATE_VM_FILES")
	if files == "" {
		t.Fatal("REMEDIATE_VM_FILES is not set: run through TestIPVSKubeProxyInVM")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 6*time.Minute)
	defer cancel()
	cs, err := kubernetes.NewForConfig(&rest.Config{Host: vmAPIServer, BearerToken: controlplane.AdminToken,
		TLSClientConfig: rest.TLSClientConfig{Insecure: true}, Timeout: 20 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, 60*time.Second, "the host's apiserver through the forward", func() (bool, string) {
		body, err := cs.Discovery().RESTClient().Get().AbsPath("/readyz").DoRaw(ctx)
		return err == nil && strings.TrimSpace(string(body)) == "ok", fmt.Sprintf("%v %s", err, body)
	})

	lab := vm.NewLab(t)
	b1, b2, client := lab.AddHost("b1"), lab.AddHost("b2"), lab.AddHost("client")
	vm.Serve(t, b1, 8080)
	s2 := vm.Serve(t, b2, 8080)

	const ns = "ipvs-e2e"
	mustCreate := func(what string, err error) {
		t.Helper()
		if err != nil {
			t.Fatalf("create %s: %v", what, err)
		}
	}
	_, err = cs.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: vmNodeName},
		Status: corev1.NodeStatus{Addresses: []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: vmNodeIP}}}}, metav1.CreateOptions{})
	mustCreate("node", err)
	_, err = cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{})
	mustCreate("namespace", err)
	_, err = cs.CoreV1().Services(ns).Create(ctx, &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: ns},
		Spec: corev1.ServiceSpec{ClusterIP: vmWebVIP, Ports: []corev1.ServicePort{
			{Name: "http", Protocol: corev1.ProtocolTCP, Port: 80}}},
	}, metav1.CreateOptions{})
	mustCreate("service", err)
	ep := func(h *vm.Host) discoveryv1.Endpoint {
		return discoveryv1.Endpoint{Addresses: []string{h.V4.String()}, Conditions: discoveryv1.EndpointConditions{
			Ready: ptr.To(true), Serving: ptr.To(true), Terminating: ptr.To(false)}}
	}
	slice, err := cs.DiscoveryV1().EndpointSlices(ns).Create(ctx, &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Name: "web-1", Namespace: ns, Labels: map[string]string{discoveryv1.LabelServiceName: "web"}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       []discoveryv1.EndpointPort{{Name: ptr.To("http"), Protocol: ptr.To(corev1.ProtocolTCP), Port: ptr.To(int32(8080))}},
		Endpoints:   []discoveryv1.Endpoint{ep(b1), ep(b2)},
	}, metav1.CreateOptions{})
	mustCreate("endpointslice", err)

	kp := startGuestKubeProxy(t, files)
	vip := netip.AddrPortFrom(netip.MustParseAddr(vmWebVIP), 80)
	rs := func(h *vm.Host) string { return netip.AddrPortFrom(h.V4, 8080).String() }
	waitFor(t, 120*time.Second, "kube-proxy's virtual server with both backends", func() (bool, string) {
		got := realServers(t, vip)
		return strings.Join(got, ",") == rs(b1)+","+rs(b2), fmt.Sprintf("real servers %v; kube-proxy log:\n%s", got, kp.tail())
	})
	waitFor(t, 60*time.Second, "kube-proxy's first complete sync (iptables and IPVS)", func() (bool, string) {
		ts, err := kubeProxyLastSync()
		return err == nil && !ts.IsZero(), fmt.Sprintf("%v; kube-proxy log:\n%s", err, kp.tail())
	})
	seen := map[string]bool{}
	for i := 0; i < 4; i++ {
		name, c := vm.TCPConnect(t, client, vip)
		_ = c.Close()
		seen[name] = true
	}
	if !seen["b1"] || !seen["b2"] {
		t.Fatalf("connections through kube-proxy's virtual server reached %v, want b1 and b2", seen)
	}
	t.Logf("kube-proxy programmed %s -> %s, %s; clients reach both", vip, rs(b1), rs(b2))

	// kube-proxy freezes, then b2's pod goes away: its real server stays.
	kp.signal(t, syscall.SIGSTOP)
	s2.Stop()
	slice.Endpoints = []discoveryv1.Endpoint{ep(b1)}
	if _, err := cs.DiscoveryV1().EndpointSlices(ns).Update(ctx, slice, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	time.Sleep(2 * time.Second)
	if got := realServers(t, vip); len(got) != 2 {
		t.Fatalf("with kube-proxy stopped the real servers changed: %v", got)
	}
	target := "ipvs-rs/TCP/" + vip.String() + "/" + rs(b2)

	bin := filepath.Join(files, "remediate")
	kubeconfig := filepath.Join(files, "admin.kubeconfig")
	dir := t.TempDir()
	policyFile := filepath.Join(dir, "policy.yaml")
	if err := os.WriteFile(policyFile, []byte(vmIPVSPolicy), 0o644); err != nil {
		t.Fatal(err)
	}
	common := []string{"--policy", policyFile, "--kubeconfig", kubeconfig, "--node-name", vmNodeName}

	// Audit: one look reports the leftover and changes nothing.
	auditDir := filepath.Join(dir, "audit")
	once := exec.CommandContext(ctx, bin, append(common, "--once", "--dry-run", "-o", "json", "--state-dir", auditDir)...)
	var stderr bytes.Buffer
	once.Stderr = &stderr
	outJSON, err := once.Output()
	if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 2 {
		t.Fatalf("--once --dry-run: %v (want exit 2: findings)\n%s\n%s", err, outJSON, stderr.String())
	}
	var rep struct {
		Findings []struct {
			Detector, Target string
		} `json:"findings"`
		Decisions []struct {
			Target, Outcome string
		} `json:"decisions"`
	}
	if err := json.Unmarshal(outJSON, &rep); err != nil {
		t.Fatalf("--once JSON: %v\n%s", err, outJSON)
	}
	var found bool
	for _, f := range rep.Findings {
		if f.Detector == "IPVSStaleRealServer" && f.Target == target {
			found = true
		} else if f.Detector == "IPVSStaleRealServer" {
			t.Errorf("unexpected finding on %s", f.Target)
		}
	}
	if !found {
		t.Fatalf("--once did not report %s:\n%s\n%s", target, outJSON, stderr.String())
	}
	if got := realServers(t, vip); len(got) != 2 {
		t.Fatalf("audit mode changed the kernel: %v", got)
	}
	t.Logf("--once --dry-run: %s reported, decisions %+v, IPVS unchanged", target, rep.Decisions)

	// Enforce: the daemon deletes exactly the leftover.
	enforceDir := filepath.Join(dir, "enforce")
	d := exec.Command(bin, append(common, "--state-dir", enforceDir, "--metrics-addr", "127.0.0.1:9808")...)
	dlog, err := os.Create(filepath.Join(dir, "daemon.log"))
	if err != nil {
		t.Fatal(err)
	}
	defer dlog.Close()
	d.Stdout, d.Stderr = dlog, dlog
	start := time.Now()
	if err := d.Start(); err != nil {
		t.Fatal(err)
	}
	stopped := false
	stopDaemon := func() {
		if stopped {
			return
		}
		stopped = true
		_ = d.Process.Signal(syscall.SIGTERM)
		done := make(chan struct{})
		go func() { _ = d.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(15 * time.Second):
			_ = d.Process.Kill()
			<-done
			t.Errorf("the daemon (pid %d) did not exit within 15 s of SIGTERM", d.Process.Pid)
		}
	}
	defer stopDaemon()
	waitFor(t, 90*time.Second, "the daemon to delete the leftover real server", func() (bool, string) {
		got := realServers(t, vip)
		log, _ := os.ReadFile(dlog.Name())
		return strings.Join(got, ",") == rs(b1), fmt.Sprintf("real servers %v; daemon log tail:\n%s", got, lastLines(string(log), 25))
	})
	t.Logf("enforce: the daemon deleted %s %.1fs after start", target, time.Since(start).Seconds())
	for i := 0; i < 3; i++ {
		name, c := vm.TCPConnect(t, client, vip)
		_ = c.Close()
		if name != "b1" {
			t.Fatalf("after the delete a connection reached %q, want b1", name)
		}
	}
	stopDaemon()
	recs, err := journal.ReadAll(enforceDir)
	if err != nil {
		t.Fatal(err)
	}
	var kinds []string
	for _, r := range recs {
		if r.Target == target {
			kinds = append(kinds, r.Kind)
		} else {
			t.Errorf("journal record for another target: %+v", r)
		}
	}
	if len(kinds) < 2 || kinds[0] != journal.KindIntent || kinds[1] != journal.KindOutcome {
		t.Fatalf("journal for %s: %v, want intent then outcome", target, kinds)
	}
	t.Logf("journal: %v", kinds)

	// kube-proxy thaws. Its first sync may still run on the view it froze
	// with (the Service's watch event waits in its socket) and put the
	// old real server back for a moment; once it has read the event, its
	// syncs agree with what the daemon left.
	thawed := time.Now()
	kp.signal(t, syscall.SIGCONT)
	var readded bool
	waitFor(t, 60*time.Second, "kube-proxy to sync after it thawed and agree with the kernel as left", func() (bool, string) {
		ts, err := kubeProxyLastSync()
		got := realServers(t, vip)
		if len(got) > 1 {
			readded = true
		}
		return err == nil && ts.After(thawed) && strings.Join(got, ",") == rs(b1),
			fmt.Sprintf("last sync %v (thawed %v), err %v, real servers %v", ts, thawed, err, got)
	})
	time.Sleep(2 * time.Second) // one more of its syncs (minSyncPeriod 1s)
	if got := realServers(t, vip); strings.Join(got, ",") != rs(b1) {
		t.Fatalf("kube-proxy's later sync left real servers %v, want only %s", got, rs(b1))
	}
	t.Logf("kube-proxy thawed and agrees (it re-added the old real server for a moment first: %v)", readded)

	vmExcludeCIDRsPhase(t, ctx, bin, common, dir)
	vmModeLeftoversPhase(t, ctx, bin, common, dir, client, vip)
}

// vmExcludeCIDRsPhase (issue 37.4a): with the real kube-proxy running and
// answering /configz (ipvs.excludeCIDRs [vmExcludeCIDR]), two virtual
// servers no Service wants: one inside excludeCIDRs is neither reported
// (--once) nor deleted (the daemon in enforce mode, several cycles), the
// one outside is both.
func vmExcludeCIDRsPhase(t *testing.T, ctx context.Context, bin string, common []string, dir string) {
	inside := netip.MustParseAddrPort("10.96.200.7:80")
	outside := netip.MustParseAddrPort("10.96.201.7:80")
	for _, vs := range []netip.AddrPort{inside, outside} {
		if out, err := exec.Command("ipvsadm", "-A", "-t", vs.String(), "-s", "rr").CombinedOutput(); err != nil {
			t.Fatalf("ipvsadm -A -t %s: %v %s", vs, err, out)
		}
		vs := vs
		t.Cleanup(func() { _ = exec.Command("ipvsadm", "-D", "-t", vs.String()).Run() })
	}
	body, err := httpGet("http://127.0.0.1:10249/configz")
	if err != nil || !strings.Contains(body, vmExcludeCIDR) {
		t.Fatalf("kube-proxy's /configz does not list %s: %v\n%s", vmExcludeCIDR, err, body)
	}
	t.Logf("kube-proxy's /configz: %s", lastLines(body, 3))
	policyFile := filepath.Join(dir, "policy-vs.yaml")
	if err := os.WriteFile(policyFile, []byte(vmIPVSVirtualServerPolicy), 0o644); err != nil {
		t.Fatal(err)
	}
	args := append([]string{}, common...)
	args[1] = policyFile // common is --policy <file> ...
	outJSON := vmOnce(t, ctx, bin, args, filepath.Join(dir, "audit-vs"), 2)
	var rep struct {
		Findings []struct {
			Detector, Target string
			Evidence         map[string]any
		} `json:"findings"`
	}
	if err := json.Unmarshal(outJSON, &rep); err != nil {
		t.Fatalf("--once JSON: %v\n%s", err, outJSON)
	}
	var got []string
	for _, f := range rep.Findings {
		if f.Detector == "IPVSStaleVirtualServer" {
			got = append(got, f.Target)
			if fmt.Sprint(f.Evidence["excludeCIDRs"]) != "["+vmExcludeCIDR+"]" {
				t.Errorf("%s: excludeCIDRs evidence %v, want [%s]", f.Target, f.Evidence["excludeCIDRs"], vmExcludeCIDR)
			}
		}
	}
	if want := "ipvs-vs/TCP/" + outside.String(); strings.Join(got, ",") != want {
		t.Fatalf("--once reported %v, want only %s (not %s, inside kube-proxy's excludeCIDRs)\n%s", got, want, inside, outJSON)
	}
	t.Logf("--once: %v reported, %s (inside excludeCIDRs) not", got, inside)

	d := exec.Command(bin, append(args, "--state-dir", filepath.Join(dir, "enforce-vs"), "--metrics-addr", "127.0.0.1:9809")...)
	dlog, err := os.Create(filepath.Join(dir, "daemon-vs.log"))
	if err != nil {
		t.Fatal(err)
	}
	defer dlog.Close()
	d.Stdout, d.Stderr = dlog, dlog
	if err := d.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		_ = d.Process.Signal(syscall.SIGTERM)
		done := make(chan struct{})
		go func() { _ = d.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(15 * time.Second):
			_ = d.Process.Kill()
			<-done
		}
	}()
	start := time.Now()
	waitFor(t, 90*time.Second, "the daemon to delete the stale virtual server outside excludeCIDRs", func() (bool, string) {
		log, _ := os.ReadFile(dlog.Name())
		return !vsExists(outside), fmt.Sprintf("daemon log tail:\n%s", lastLines(string(log), 25))
	})
	t.Logf("enforce: the daemon deleted %s %.1fs after start", outside, time.Since(start).Seconds())
	// Several more cycles (interval 3s): the excluded one stays.
	time.Sleep(12 * time.Second)
	if !vsExists(inside) {
		log, _ := os.ReadFile(dlog.Name())
		t.Fatalf("%s, inside kube-proxy's excludeCIDRs, was deleted; daemon log tail:\n%s", inside, lastLines(string(log), 25))
	}
	ts, err := kubeProxyLastSync()
	t.Logf("%s inside excludeCIDRs still there after %.0fs of enforce cycles (kube-proxy's last sync %v, %v)", inside, time.Since(start).Seconds(), ts, err)
}

// vmModeLeftoversPhase (issue 37.4b): the real kube-proxy's IPVS-mode
// chains are no leftovers; iptables mode's no-endpoints REJECT for the
// Service's ClusterIP, hooked from INPUT and OUTPUT as iptables mode (before
// 1.19 also from INPUT) wrote it, and a KUBE-SVC chain are: critical. The
// REJECT refuses the client's connections to the VIP IPVS serves
// (kubernetes/kubernetes#102314) until they are removed.
func vmModeLeftoversPhase(t *testing.T, ctx context.Context, bin string, common []string, dir string, client *vm.Host, vip netip.AddrPort) {
	policyFile := filepath.Join(dir, "policy-leftovers.yaml")
	if err := os.WriteFile(policyFile, []byte(vmModeLeftoversPolicy), 0o644); err != nil {
		t.Fatal(err)
	}
	args := append([]string{}, common...)
	args[1] = policyFile
	leftovers := func(name string, wantExit int) []string {
		outJSON := vmOnce(t, ctx, bin, args, filepath.Join(dir, name), wantExit)
		var rep struct {
			Findings []struct {
				Detector, Target, Severity string
			} `json:"findings"`
		}
		if err := json.Unmarshal(outJSON, &rep); err != nil {
			t.Fatalf("--once JSON: %v\n%s", err, outJSON)
		}
		var got []string
		for _, f := range rep.Findings {
			got = append(got, f.Detector+" "+f.Target+" "+f.Severity)
		}
		return got
	}
	save, _ := exec.Command("iptables-legacy-save").CombinedOutput()
	t.Logf("kube-proxy's IPVS-mode rules:\n%s", save)
	if got := leftovers("leftovers-clean", 0); len(got) != 0 {
		t.Fatalf("the real kube-proxy's IPVS-mode rules reported as leftovers: %v", got)
	}
	ipt := func(args ...string) {
		t.Helper()
		if out, err := exec.Command("iptables-legacy", args...).CombinedOutput(); err != nil {
			t.Fatalf("iptables-legacy %v: %v %s", args, err, out)
		}
	}
	ipt("-t", "filter", "-N", "KUBE-SERVICES")
	ipt("-t", "filter", "-A", "KUBE-SERVICES", "-d", vip.Addr().String()+"/32", "-p", "tcp", "-m", "comment", "--comment", "ipvs-e2e/web:http has no endpoints",
		"-m", "tcp", "--dport", strconv.Itoa(int(vip.Port())), "-j", "REJECT", "--reject-with", "icmp-port-unreachable")
	ipt("-t", "filter", "-I", "INPUT", "-m", "conntrack", "--ctstate", "NEW", "-m", "comment", "--comment", "kubernetes service portals", "-j", "KUBE-SERVICES")
	ipt("-t", "filter", "-I", "OUTPUT", "-m", "conntrack", "--ctstate", "NEW", "-m", "comment", "--comment", "kubernetes service portals", "-j", "KUBE-SERVICES")
	ipt("-t", "nat", "-N", "KUBE-SVC-VMLEFTOVER0000000")
	ipt("-t", "nat", "-A", "KUBE-SVC-VMLEFTOVER0000000", "-j", "RETURN")
	removed := false
	remove := func() {
		if removed {
			return
		}
		removed = true
		for _, c := range []string{"INPUT", "OUTPUT"} {
			_ = exec.Command("iptables-legacy", "-t", "filter", "-D", c, "-m", "conntrack", "--ctstate", "NEW", "-m", "comment", "--comment", "kubernetes service portals", "-j", "KUBE-SERVICES").Run()
		}
		_ = exec.Command("iptables-legacy", "-t", "filter", "-F", "KUBE-SERVICES").Run()
		_ = exec.Command("iptables-legacy", "-t", "filter", "-X", "KUBE-SERVICES").Run()
		_ = exec.Command("iptables-legacy", "-t", "nat", "-F", "KUBE-SVC-VMLEFTOVER0000000").Run()
		_ = exec.Command("iptables-legacy", "-t", "nat", "-X", "KUBE-SVC-VMLEFTOVER0000000").Run()
	}
	defer remove()
	refused := vm.InNS(client.NS, func() error {
		c, err := net.DialTimeout("tcp", vip.String(), 5*time.Second)
		if err == nil {
			_ = c.Close()
		}
		return err
	})
	if refused == nil {
		t.Fatalf("the client still reaches %s through the leftover REJECT", vip)
	}
	t.Logf("with the leftover REJECT hooked, the client's connect to %s (IPVS serves it) fails: %v", vip, refused)
	got := leftovers("leftovers", 2)
	if want := "KubeProxyModeLeftovers iptables/IPv4/legacy/iptables-mode-leftovers critical"; strings.Join(got, ",") != want {
		t.Fatalf("leftovers reported %v, want [%s]", got, want)
	}
	t.Logf("--once: %v", got)
	remove()
	name, c := vm.TCPConnect(t, client, vip)
	_ = c.Close()
	if got := leftovers("leftovers-removed", 0); len(got) != 0 {
		t.Fatalf("after removing the leftovers: %v", got)
	}
	t.Logf("leftovers removed: the client reaches %s (%s) again and nothing is reported", vip, name)
}

// vmOnce runs `remediate --once --dry-run -o json` and wants exit code
// wantExit (0 nothing found, 2 findings).
func vmOnce(t *testing.T, ctx context.Context, bin string, args []string, stateDir string, wantExit int) []byte {
	t.Helper()
	once := exec.CommandContext(ctx, bin, append(args, "--once", "--dry-run", "-o", "json", "--state-dir", stateDir)...)
	var stderr bytes.Buffer
	once.Stderr = &stderr
	out, err := once.Output()
	code := 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatalf("--once: %v", err)
	}
	if code != wantExit {
		t.Fatalf("--once --dry-run exit %d, want %d\n%s\n%s", code, wantExit, out, stderr.String())
	}
	return out
}

func httpGet(u string) (string, error) {
	c := http.Client{Timeout: 3 * time.Second}
	resp, err := c.Get(u)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	return string(b), err
}

func vsExists(vs netip.AddrPort) bool {
	return exec.Command("ipvsadm", "-Ln", "-t", vs.String()).Run() == nil
}

const vmIPVSVirtualServerPolicy = `apiVersion: remediate.dev/v1alpha1
kind: RemediationPolicy
mode: enforce
interval: 3s
jitter: 0
detectorTimeout: 2s
cluster:
  budgetSlots: 1
  budgetTTL: 2m
rules:
- name: ipvs-stale-virtual-server
  detector: {type: IPVSStaleVirtualServer}
  for: 4s
  action: {type: DeleteIPVSVirtualServer, maxPerCycle: 1, cycleWindow: 2s}
  cooldown: 30m
  rateLimit: {max: 3, per: 1h}
  maxAttempts: 1
  verifyAfter: 2s
`

const vmModeLeftoversPolicy = `apiVersion: remediate.dev/v1alpha1
kind: RemediationPolicy
mode: audit
interval: 10s
jitter: 0
detectorTimeout: 8s
rules:
- name: kube-proxy-mode-leftovers
  detector: {type: KubeProxyModeLeftovers, backends: [legacy]}
`

const vmIPVSPolicy = `apiVersion: remediate.dev/v1alpha1
kind: RemediationPolicy
mode: enforce
interval: 3s
jitter: 0
detectorTimeout: 2s
cluster:
  budgetSlots: 1
  budgetTTL: 2m
rules:
# examples/enforce.yaml's rule, its windows shortened for the test
- name: ipvs-stale-real-server
  detector: {type: IPVSStaleRealServer}
  for: 4s
  action: {type: DeleteIPVSRealServer, maxPerCycle: 1, cycleWindow: 2s}
  cooldown: 30m
  rateLimit: {max: 3, per: 1h}
  maxAttempts: 1
  verifyAfter: 2s
`

// guestKubeProxy is the real kube-proxy in IPVS mode in the guest's root
// namespace, stopped by its PID when the test ends.
type guestKubeProxy struct {
	cmd *exec.Cmd
	log string
}

func startGuestKubeProxy(t *testing.T, files string) *guestKubeProxy {
	t.Helper()
	dir := t.TempDir()
	// kube-proxy execs iptables, iptables-save, iptables-restore (and the
	// ip6tables ones) from PATH: the legacy backend.
	bin := filepath.Join(dir, "bin")
	if err := os.MkdirAll(bin, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, fam := range []string{"iptables", "ip6tables"} {
		for _, suffix := range []string{"", "-save", "-restore"} {
			target, err := exec.LookPath(fam + "-legacy" + suffix)
			if err != nil {
				t.Fatal(err)
			}
			if err := os.Symlink(target, filepath.Join(bin, fam+suffix)); err != nil {
				t.Fatal(err)
			}
		}
	}
	cfg := filepath.Join(dir, "kube-proxy.yaml")
	if err := os.WriteFile(cfg, []byte(fmt.Sprintf(`apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
mode: ipvs
hostnameOverride: %s
clusterCIDR: 10.0.0.0/16
clientConnection:
  kubeconfig: %s
metricsBindAddress: 127.0.0.1:10249
healthzBindAddress: 127.0.0.1:10256
conntrack:
  maxPerCore: 0
ipvs:
  syncPeriod: %s
  minSyncPeriod: 1s
  excludeCIDRs: [%s]
`, vmNodeName, filepath.Join(files, "kube-proxy.kubeconfig"), vmKubeProxySyncPeriod, vmExcludeCIDR)), 0o644); err != nil {
		t.Fatal(err)
	}
	k := &guestKubeProxy{log: filepath.Join(dir, "kube-proxy.log")}
	lf, err := os.Create(k.log)
	if err != nil {
		t.Fatal(err)
	}
	k.cmd = exec.Command(filepath.Join(files, "kube-proxy"), "--config", cfg, "--v=2")
	k.cmd.Env = append(os.Environ(), "PATH="+bin+":"+os.Getenv("PATH"))
	k.cmd.Stdout, k.cmd.Stderr = lf, lf
	if err := k.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = k.cmd.Process.Signal(syscall.SIGCONT)
		_ = k.cmd.Process.Signal(syscall.SIGTERM)
		done := make(chan struct{})
		go func() { _ = k.cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			_ = k.cmd.Process.Kill()
			<-done
		}
		_ = lf.Close()
		if t.Failed() {
			t.Logf("kube-proxy log tail:\n%s", k.tail())
		}
	})
	return k
}

func (k *guestKubeProxy) signal(t *testing.T, s syscall.Signal) {
	t.Helper()
	if err := k.cmd.Process.Signal(s); err != nil {
		t.Fatalf("signal %v to kube-proxy (pid %d): %v", s, k.cmd.Process.Pid, err)
	}
}

func (k *guestKubeProxy) tail() string {
	b, _ := os.ReadFile(k.log)
	return lastLines(string(b), 20)
}

// kubeProxyLastSync reads kubeproxy_sync_proxy_rules_last_timestamp_seconds
// from the guest kube-proxy's metrics.
func kubeProxyLastSync() (time.Time, error) {
	c := http.Client{Timeout: 3 * time.Second}
	resp, err := c.Get("http://127.0.0.1:10249/metrics")
	if err != nil {
		return time.Time{}, err
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, "kubeproxy_sync_proxy_rules_last_timestamp_seconds") {
			continue
		}
		f := strings.Fields(line)
		v, err := strconv.ParseFloat(f[len(f)-1], 64)
		if err != nil {
			return time.Time{}, err
		}
		sec := int64(v)
		return time.Unix(sec, int64((v-float64(sec))*1e9)), nil
	}
	return time.Time{}, fmt.Errorf("no kubeproxy_sync_proxy_rules_last_timestamp_seconds in kube-proxy's metrics")
}

// realServers lists the real servers of a TCP virtual server (ipvsadm -Ln,
// sorted), or nil when the virtual server does not exist.
func realServers(t *testing.T, vip netip.AddrPort) []string {
	t.Helper()
	out, err := exec.Command("ipvsadm", "-Ln", "-t", vip.String()).CombinedOutput()
	if err != nil {
		return nil
	}
	var rs []string
	for _, line := range strings.Split(string(out), "\n") {
		f := strings.Fields(line)
		if len(f) >= 2 && f[0] == "->" && f[1] != "RemoteAddress:Port" {
			rs = append(rs, f[1])
		}
	}
	sort.Strings(rs)
	return rs
}

func waitFor(t *testing.T, timeout time.Duration, what string, cond func() (bool, string)) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		ok, last := cond()
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s: %s", timeout, what, last)
		}
		time.Sleep(500 * time.Millisecond)
	}
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
