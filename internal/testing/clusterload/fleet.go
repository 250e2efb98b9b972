package clusterload

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/remediate-dev/remediate/internal/testing/controlplane"
	"github.com/remediate-dev/remediate/internal/testing/deploytest"
)

// Fleet is `make bench-fleet`'s cluster: the real etcd + kube-apiserver
// with an audit log (AuditPolicy) and listening on every address of its
// namespace, and nodes added to it (AddNode), each a network namespace of
// its own with a real kube-proxy (iptables-legacy) and the daemon in it.
//
// A node's namespace is joined to the control plane's by two veth pairs,
// one for kube-proxy (10.201.<i>.0/30) and one for the daemon
// (10.202.<i>.0/30): the apiserver sees each process's requests come from
// an address of its own (the audit events' sourceIPs), so every request
// is counted for its node and role, and the control plane's end of each
// pair counts the bytes the apiserver sent to that process (tx_bytes). The
// daemon authenticates as the DaemonSet's ServiceAccount with its node's
// name (deploytest, as a bound pod token carries it), kube-proxy as
// system:kube-proxy (one identity for every node, as kubeadm's
// kube-proxy ServiceAccount).
type Fleet struct {
	CP *controlplane.ControlPlane
	// Admin is a client with a high QPS for populating.
	Admin kubernetes.Interface
	// AuditLog is the apiserver's audit log file.
	AuditLog string
	// Tally counts AuditLog's requests per node and role.
	Tally *AuditTally
	// Nodes are the nodes added, in order.
	Nodes []*FleetNode

	tb     testing.TB
	bin    string
	policy string
	kpSync time.Duration
}

// FleetNode is one node of a Fleet.
type FleetNode struct {
	Name string
	// NS is the node's network namespace.
	NS *controlplane.NetNS
	// KubeProxy and Daemon are its processes.
	KubeProxy, Daemon *controlplane.Process
	// KubeProxyAddr and DaemonAddr are the addresses their requests come
	// from; KubeProxyLink and DaemonLink the control plane's ends of their
	// veth pairs.
	KubeProxyAddr, DaemonAddr, KubeProxyLink, DaemonLink string
	// StateDir is the daemon's --state-dir (its journal).
	StateDir string
}

// DaemonMetricsAddr is where every node's daemon serves /metrics, in its
// node's namespace.
const DaemonMetricsAddr = "127.0.0.1:19809"

// StartFleet starts the control plane with the audit log, applies the
// audit overlay (the DaemonSet's ServiceAccount and RBAC) and returns the
// fleet, without nodes. bin is the remediate binary each node runs with
// the policy file policy; kube-proxy's syncPeriod is kpSync.
func StartFleet(tb testing.TB, bin, policy string, kpSync time.Duration) *Fleet {
	tb.Helper()
	args, auditLog := AuditArgs(tb)
	cp := controlplane.Start(tb, controlplane.Options{ExtraAPIServerArgs: append([]string{"--bind-address", "0.0.0.0"}, args...)})
	ctx := context.Background()
	cfg := rest.CopyConfig(cp.RestConfig)
	cfg.QPS, cfg.Burst = 500, 1000
	f := &Fleet{CP: cp, Admin: kubernetes.NewForConfigOrDie(cfg), AuditLog: auditLog,
		Tally: NewAuditTally(map[string]Who{}), tb: tb, bin: bin, policy: policy, kpSync: kpSync}
	if _, err := cp.Client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: deploytest.Namespace}}, metav1.CreateOptions{}); err != nil {
		tb.Fatal(err)
	}
	deploytest.ApplyOverlay(tb, cp, "audit", false)
	tb.Cleanup(func() {
		if !tb.Failed() {
			return
		}
		keep := filepath.Join(os.TempDir(), fmt.Sprintf("fleet-audit-%d.log", os.Getpid()))
		if b, err := os.ReadFile(auditLog); err == nil && os.WriteFile(keep, b, 0o600) == nil {
			tb.Logf("the audit log is kept in %s", keep)
		}
	})
	return f
}

// NodeName is the i-th node's name (the names Populate's endpoints use).
func NodeName(i int) string { return fmt.Sprintf("node-%d", i) }

// AddNode creates node i: its Node object (InternalIP its kube-proxy's
// address), its namespace joined to the control plane's, kube-proxy in it
// (clusterCIDR 10.244.0.0/16) and then the daemon. It does not wait for
// them (WaitNodes).
func (f *Fleet) AddNode(i int) *FleetNode {
	tb := f.tb
	tb.Helper()
	if i < 0 || i > 250 {
		tb.Fatalf("node index %d out of 0..250", i)
	}
	n := &FleetNode{Name: NodeName(i), NS: controlplane.NewNetNS(tb),
		KubeProxyAddr: fmt.Sprintf("10.201.%d.2", i), DaemonAddr: fmt.Sprintf("10.202.%d.2", i),
		KubeProxyLink: fmt.Sprintf("fk%d", i), DaemonLink: fmt.Sprintf("fd%d", i)}
	for _, l := range []struct{ link, peer, net string }{
		{n.KubeProxyLink, "eth1", fmt.Sprintf("10.201.%d", i)},
		{n.DaemonLink, "eth2", fmt.Sprintf("10.202.%d", i)},
	} {
		for _, args := range [][]string{
			{"-n", f.CP.NetNS.Name, "link", "add", l.link, "type", "veth", "peer", "name", l.peer, "netns", n.NS.Name},
			{"-n", f.CP.NetNS.Name, "addr", "add", l.net + ".1/30", "dev", l.link},
			{"-n", f.CP.NetNS.Name, "link", "set", l.link, "up"},
			{"-n", n.NS.Name, "addr", "add", l.net + ".2/30", "dev", l.peer},
			{"-n", n.NS.Name, "link", "set", l.peer, "up"},
		} {
			if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
				tb.Fatalf("ip %s: %v: %s", strings.Join(args, " "), err, out)
			}
		}
	}
	f.Tally.BySource[n.KubeProxyAddr] = Who{Node: n.Name, Role: "kube-proxy"}
	f.Tally.BySource[n.DaemonAddr] = Who{Node: n.Name, Role: "daemon"}
	f.ensureNode(n.Name, n.KubeProxyAddr)

	dir := filepath.Join(f.CP.Dir, n.Name)
	n.StateDir = filepath.Join(dir, "state")
	pathDir := filepath.Join(dir, "bin")
	for _, d := range []string{n.StateDir, pathDir} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			tb.Fatal(err)
		}
	}
	for _, fam := range []string{"iptables", "ip6tables"} {
		for _, suffix := range []string{"", "-save", "-restore"} {
			target, err := exec.LookPath(fam + "-legacy" + suffix)
			if err != nil {
				tb.Skipf("needs %s-legacy%s (Debian package iptables)", fam, suffix)
			}
			if err := os.Symlink(target, filepath.Join(pathDir, fam+suffix)); err != nil {
				tb.Fatal(err)
			}
		}
	}
	lock := filepath.Join(dir, "xtables.lock")
	write(tb, lock, "")
	server := func(addr string) string { return "server: https://" + addr + ":6443" }
	kpKubeconfig := filepath.Join(dir, "kube-proxy.kubeconfig")
	write(tb, kpKubeconfig, strings.Replace(controlplane.Kubeconfig(controlplane.KubeProxyToken),
		"server: "+controlplane.APIServerURL, server(fmt.Sprintf("10.201.%d.1", i)), 1))
	kpConfig := filepath.Join(dir, "kube-proxy.yaml")
	write(tb, kpConfig, fmt.Sprintf(`apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
clientConnection: {kubeconfig: %s}
hostnameOverride: %s
mode: iptables
metricsBindAddress: 127.0.0.1:10249
healthzBindAddress: 127.0.0.1:10256
conntrack: {maxPerCore: 0}
iptables: {syncPeriod: %s, minSyncPeriod: 1s}
clusterCIDR: 10.244.0.0/16
`, kpKubeconfig, n.Name, f.kpSync))
	kp := n.NS.Command(filepath.Join(f.CP.BinDir, "kube-proxy"), "--config", kpConfig, "--v", "1")
	kp.Env = append(os.Environ(), "PATH="+pathDir+":"+os.Getenv("PATH"), "XTABLES_LOCKFILE="+lock)
	n.KubeProxy = controlplane.StartProcess(tb, "kube-proxy", dir, kp)
	n.KubeProxy.Grace = 5 * time.Second

	dk, err := os.ReadFile(deploytest.DaemonKubeconfig(tb, f.CP, n.Name))
	if err != nil {
		tb.Fatal(err)
	}
	daemonKubeconfig := filepath.Join(dir, "daemon.kubeconfig")
	write(tb, daemonKubeconfig, strings.Replace(string(dk), "server: "+controlplane.APIServerURL, server(fmt.Sprintf("10.202.%d.1", i)), 1))
	d := n.NS.Command(f.bin, "--policy", f.policy, "--state-dir", n.StateDir, "--node-name", n.Name,
		"--kubeconfig", daemonKubeconfig, "--metrics-addr", DaemonMetricsAddr, "--xtables-lock", lock, "--log-level", "info")
	d.Env = []string{"PATH=" + os.Getenv("PATH"), "HOME=" + n.StateDir, "POD_NAMESPACE=" + deploytest.Namespace}
	n.Daemon = controlplane.StartProcess(tb, "remediate", dir, d)
	n.Daemon.Grace = 10 * time.Second
	f.Nodes = append(f.Nodes, n)
	return n
}

func write(tb testing.TB, path, s string) {
	tb.Helper()
	if err := os.WriteFile(path, []byte(s), 0o600); err != nil {
		tb.Fatal(err)
	}
}

// ensureNode creates the Node object name, Ready, with InternalIP addr.
func (f *Fleet) ensureNode(name, addr string) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	created, err := f.Admin.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{})
	if apierrors.IsAlreadyExists(err) {
		return
	}
	if err != nil {
		f.tb.Fatalf("create node %s: %v", name, err)
	}
	created.Status.Addresses = []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: addr}}
	created.Status.Conditions = []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue,
		LastHeartbeatTime: metav1.Now(), LastTransitionTime: metav1.Now(), Reason: "Test", Message: "set by the fleet benchmark"}}
	if _, err := f.Admin.CoreV1().Nodes().UpdateStatus(ctx, created, metav1.UpdateOptions{}); err != nil {
		f.tb.Fatalf("set node %s status: %v", name, err)
	}
}

// DaemonCycles is the node's daemon's completed cycles (its
// remediate_cycle_duration_seconds_count), or -1 with why.
func (n *FleetNode) DaemonCycles() (int, string) {
	body, err := get(n.NS.HTTPClient(5*time.Second), "http://"+DaemonMetricsAddr+"/metrics")
	if err != nil {
		return -1, err.Error()
	}
	v, ok := Metric(body, "remediate_cycle_duration_seconds_count")
	if !ok {
		return -1, "no remediate_cycle_duration_seconds_count yet"
	}
	return int(v), ""
}

// KubeProxySynced reports whether the node's kube-proxy completed a sync
// with nothing queued after since.
func (n *FleetNode) KubeProxySynced(since time.Time) bool {
	body, err := get(n.NS.HTTPClient(5*time.Second), "http://127.0.0.1:10249/metrics")
	if err != nil {
		return false
	}
	last, ok1 := Metric(body, `kubeproxy_sync_proxy_rules_last_timestamp_seconds{ip_family="IPv4"}`)
	queued, ok2 := Metric(body, `kubeproxy_sync_proxy_rules_last_queued_timestamp_seconds{ip_family="IPv4"}`)
	return ok1 && ok2 && last > float64(since.Unix()) && queued <= last
}

// WaitNodes waits until every node's kube-proxy synced after since and
// its daemon completed cycles cycles, or fails after timeout with the
// laggards.
func (f *Fleet) WaitNodes(since time.Time, cycles int, timeout time.Duration) {
	f.tb.Helper()
	deadline := time.Now().Add(timeout)
	for {
		var late []string
		for _, n := range f.Nodes {
			if n.KubeProxy.Exited() || n.Daemon.Exited() {
				f.tb.Fatalf("%s: a process exited (kube-proxy %v, daemon %v); logs in %s", n.Name, n.KubeProxy.Exited(), n.Daemon.Exited(), filepath.Dir(n.StateDir))
			}
			if !n.KubeProxySynced(since) {
				late = append(late, n.Name+": kube-proxy not synced")
				continue
			}
			if c, why := n.DaemonCycles(); c < cycles {
				late = append(late, fmt.Sprintf("%s: daemon at %d cycles %s", n.Name, c, why))
			}
		}
		if len(late) == 0 {
			return
		}
		if time.Now().After(deadline) {
			f.tb.Fatalf("nodes not ready after %v: %s", timeout, strings.Join(late, "; "))
		}
		time.Sleep(2 * time.Second)
	}
}

// Sample is what Measure reads at one instant.
type Sample struct {
	At time.Time
	// Requests are the audit log's counts so far.
	Requests map[Who]map[Key]int
	// Open are the watches open per client.
	Open map[Who]int
	// TxBytes are the bytes the apiserver sent per client (the control
	// plane's end of its veth pair).
	TxBytes map[Who]uint64
	// CPUms is each process's CPU time so far (own + children), ms.
	CPUms map[Who]float64
}

// Sample reads the audit log so far, the veth counters and the
// processes' CPU.
func (f *Fleet) Sample() Sample {
	f.tb.Helper()
	// The apiserver writes the audit log in batches: a second lets the
	// last requests reach the file.
	time.Sleep(time.Second)
	if err := f.Tally.ReadFile(f.AuditLog); err != nil {
		f.tb.Fatal(err)
	}
	s := Sample{At: time.Now(), Requests: f.Tally.Snapshot(), Open: f.Tally.Open(), TxBytes: map[Who]uint64{}, CPUms: map[Who]float64{}}
	tx, err := linkTxBytes(f.CP.NetNS.Name)
	if err != nil {
		f.tb.Fatal(err)
	}
	for _, n := range f.Nodes {
		kp, d := Who{n.Name, "kube-proxy"}, Who{n.Name, "daemon"}
		s.TxBytes[kp], s.TxBytes[d] = tx[n.KubeProxyLink], tx[n.DaemonLink]
		for w, p := range map[Who]*controlplane.Process{kp: n.KubeProxy, d: n.Daemon} {
			own, kids, err := CPU(p.Pid())
			if err == nil {
				s.CPUms[w] = own + kids
			}
		}
	}
	return s
}

// linkTxBytes is every link's tx bytes in namespace ns (`ip -j -s link`).
func linkTxBytes(ns string) (map[string]uint64, error) {
	out, err := exec.Command("ip", "-n", ns, "-j", "-s", "link", "show").Output()
	if err != nil {
		return nil, fmt.Errorf("ip -n %s -j -s link show: %w", ns, err)
	}
	return ParseLinkTxBytes(out)
}

// ParseLinkTxBytes reads `ip -j -s link show`'s JSON: link name -> tx
// bytes.
func ParseLinkTxBytes(out []byte) (map[string]uint64, error) {
	var links []struct {
		IfName  string `json:"ifname"`
		Stats64 struct {
			Tx struct {
				Bytes uint64 `json:"bytes"`
			} `json:"tx"`
		} `json:"stats64"`
	}
	if err := json.Unmarshal(out, &links); err != nil {
		return nil, fmt.Errorf("ip -j -s link output: %w: %.200s", err, out)
	}
	m := make(map[string]uint64, len(links))
	for _, l := range links {
		m[l.IfName] = l.Stats64.Tx.Bytes
	}
	return m, nil
}

// Phase is one role's cost per node between two samples.
type Phase struct {
	Role    string
	Nodes   int
	Minutes float64
	// PerNode is the mean requests a minute per node by kind (watch:
	// watches started).
	PerNode map[Key]float64
	// Lists is every LIST of the role's clients in the phase, by node.
	Lists map[string]int
	// OpenWatches is the mean open watches per node at the end, and its
	// range over nodes.
	OpenWatches            float64
	OpenMin, OpenMax       int
	KiBPerMinute, CPUmsMin float64
	// LeaseWrites is the role's Lease create/update/patch a minute, all
	// nodes together.
	LeaseWrites float64
}

// Cost is the phase between a and b for role.
func (f *Fleet) Cost(a, b Sample, role string) Phase {
	min := b.At.Sub(a.At).Minutes()
	p := Phase{Role: role, Minutes: min, PerNode: map[Key]float64{}, Lists: map[string]int{}, OpenMin: 1 << 30}
	d := Delta(a.Requests, b.Requests)
	var bytes, cpu float64
	for _, n := range f.Nodes {
		w := Who{n.Name, role}
		p.Nodes++
		for k, v := range d[w] {
			p.PerNode[k] += float64(v)
			if k.Verb == "list" {
				p.Lists[n.Name] += v
			}
			if k.Resource == "leases" && (k.Verb == "create" || k.Verb == "update" || k.Verb == "patch") {
				p.LeaseWrites += float64(v)
			}
		}
		o := b.Open[w]
		p.OpenWatches += float64(o)
		p.OpenMin, p.OpenMax = minInt(p.OpenMin, o), maxInt(p.OpenMax, o)
		bytes += float64(b.TxBytes[w] - a.TxBytes[w])
		cpu += b.CPUms[w] - a.CPUms[w]
	}
	if p.Nodes == 0 || min <= 0 {
		return p
	}
	nf := float64(p.Nodes)
	for k := range p.PerNode {
		p.PerNode[k] /= nf * min
	}
	p.OpenWatches /= nf
	p.KiBPerMinute = bytes / 1024 / nf / min
	p.CPUmsMin = cpu / nf / min
	p.LeaseWrites /= min
	return p
}

// TotalPerMinute is the sum of PerNode.
func (p Phase) TotalPerMinute() float64 {
	var s float64
	for _, v := range p.PerNode {
		s += v
	}
	return s
}

// ListTotal is the role's LISTs in the phase, all nodes.
func (p Phase) ListTotal() int {
	s := 0
	for _, v := range p.Lists {
		s += v
	}
	return s
}

// String is one table row's figures.
func (p Phase) String() string {
	keys := map[Key]int{}
	for k, v := range p.PerNode {
		keys[k] = int(v*1000 + 0.5)
	}
	return fmt.Sprintf("%s x%d over %.1f min: %.2f req/min/node [%s]; LISTs %d; open watches/node %.1f (%d–%d); %.1f KiB/min/node sent; CPU %.0f ms/min/node; Lease writes %.2f/min (all nodes)",
		p.Role, p.Nodes, p.Minutes, p.TotalPerMinute(), FormatKeys(keys, 0.001), p.ListTotal(), p.OpenWatches, p.OpenMin, p.OpenMax,
		p.KiBPerMinute, p.CPUmsMin, p.LeaseWrites)
}

func minInt(a, b int) int {
	if a < b {
		return a
	}
	return b
}

func maxInt(a, b int) int {
	if a > b {
		return a
	}
	return b
}

// get is url's body (at most 16 MiB).
func get(c *http.Client, url string) (string, error) {
	resp, err := c.Get(url)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 16<<20))
	return string(body), err
}
