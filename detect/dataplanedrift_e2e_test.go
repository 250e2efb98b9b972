package detect

import (
	"context"
	"fmt"
	"io"
	"net"
	"os/exec"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/zap"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/clock"
	"k8s.io/utils/ptr"

	"github.com/remediate-dev/remediate/internal/finding"
	"github.com/remediate-dev/remediate/internal/iptables"
	"github.com/remediate-dev/remediate/internal/kube"
	"github.com/remediate-dev/remediate/internal/kubeproxy"
	"github.com/remediate-dev/remediate/internal/nftables"
	"github.com/remediate-dev/remediate/internal/node"
	"github.com/remediate-dev/remediate/internal/testing/controlplane"
)

// apiProxy forwards kube-proxy's API connections inside the namespace and
// can go silently dead: from Kill on, bytes read are dropped, nothing is
// forwarded, no connection is closed or reset, and new connections are
// accepted and left hanging. That is a watch connection dead behind a
// broken middlebox, the failure kube-proxy does not notice.
type apiProxy struct {
	l    net.Listener
	dial func(ctx context.Context, network, addr string) (net.Conn, error)
	done chan struct{}

	mu    sync.Mutex
	dead  bool
	conns []net.Conn
}

func startAPIProxy(t *testing.T, cp *controlplane.ControlPlane, addr string) *apiProxy {
	t.Helper()
	l, err := cp.NetNS.Listen("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	p := &apiProxy{l: l, dial: cp.NetNS.DialContext, done: make(chan struct{})}
	go p.serve()
	t.Cleanup(p.close)
	return p
}

func (p *apiProxy) isDead() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.dead
}

// Kill stops forwarding without closing anything.
func (p *apiProxy) Kill() {
	p.mu.Lock()
	p.dead = true
	p.mu.Unlock()
}

func (p *apiProxy) close() {
	close(p.done)
	p.l.Close()
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range p.conns {
		c.Close()
	}
}

func (p *apiProxy) serve() {
	for {
		c, err := p.l.Accept()
		if err != nil {
			return
		}
		p.mu.Lock()
		p.conns = append(p.conns, c)
		dead := p.dead
		p.mu.Unlock()
		if dead {
			continue // held open, never read
		}
		go func() {
			up, err := p.dial(context.Background(), "tcp", controlplane.APIServerURL[len("https://"):])
			if err != nil {
				c.Close()
				return
			}
			p.mu.Lock()
			p.conns = append(p.conns, up)
			p.mu.Unlock()
			go p.pipe(up, c)
			go p.pipe(c, up)
		}()
	}
}

func (p *apiProxy) pipe(dst io.Writer, src io.Reader) {
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if p.isDead() {
			<-p.done // hold both ends open, forward nothing
			return
		}
		if n > 0 {
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

// TestE2EDataplaneDrift runs DataplaneDrift and KubeProxyNotHearingAPI
// against the real kube-proxy v1.34.4 in iptables mode (iptables-legacy in
// a test-made namespace) on the real apiserver (the package's shared one;
// the test's Services in a namespace of its own), with kube-proxy's API
// connection going through apiProxy. One control plane for every phase:
//
//   - healthy: no finding;
//   - churn: Services created, scaled and deleted for a minute, then
//     watched past the grace: no finding;
//   - an endpoint's DNAT rule deleted behind kube-proxy's back (its objects
//     are older than the grace): reported as that backend missing;
//   - kube-proxy's API connection silently dead: a Service created
//     afterwards is reported by name by both detectors within grace + 2
//     intervals, and by fresh detector instances (as --once builds them).
func TestE2EDataplaneDrift(t *testing.T) {
	const (
		syncPeriod = 10 * time.Second
		interval   = 2 * time.Second
		grace      = 3 * syncPeriod
	)
	cp := controlplane.Shared(t)
	testNS := cp.Namespace("drift-e2e")
	ctx, cancel := context.WithTimeout(context.Background(), 12*time.Minute)
	defer cancel()
	proxy := startAPIProxy(t, cp, "127.0.0.1:16443")
	kp := cp.StartKubeProxy(controlplane.KubeProxyOptions{SyncPeriod: syncPeriod, APIServerURL: "https://127.0.0.1:16443"})

	view, err := kube.NewView(cp.Client, nil, clock.RealClock{}, zap.NewNop())
	if err != nil {
		t.Fatal(err)
	}
	view.Start(ctx)
	if !view.WaitForSync(ctx) {
		t.Fatal("view not synced")
	}
	kpc := kp.Client(kubeproxy.Options{
		SyncPeriod: 30 * time.Second, // the policy's, wrong on purpose: /configz says 10 s
		Timeout:    2 * time.Second, CacheTTL: 500 * time.Millisecond,
	})
	ipt := iptables.NewShared(iptables.New(iptables.Config{Prefix: []string{"ip", "netns", "exec", cp.NetNS.Name}}), time.Second)
	n := &node.Node{Name: kp.NodeName, Clock: clock.RealClock{}, Log: zap.NewNop(), KubeProxy: kpc, Cluster: view, IPTables: ipt}
	params := func(p any) {
		pp := p.(*DataplaneDriftParams)
		pp.Families, pp.Backend = []string{"IPv4"}, "legacy"
	}
	newDets := func() []Detector {
		return []Detector{newDetector(t, "DataplaneDrift", n, params), newDetector(t, "KubeProxyNotHearingAPI", n, params)}
	}
	dets := newDets()
	cycle := func(dets []Detector) map[string]finding.Finding {
		out := map[string]finding.Finding{}
		for _, d := range dets {
			dctx, dcancel := context.WithTimeout(ctx, 10*time.Second)
			fs, err := d.Detect(dctx)
			dcancel()
			if err != nil {
				t.Fatalf("%T: %v", d, err)
			}
			for _, f := range fs {
				if f.Target == "kube-proxy/syncPeriod" {
					continue // the policy's 30 s is wrong on purpose; checked below
				}
				out[f.Detector+" "+f.Target] = f
			}
		}
		return out
	}
	keys := func(m map[string]finding.Finding) string {
		var k []string
		for key, f := range m {
			k = append(k, key+": "+f.Message)
		}
		sort.Strings(k)
		return strings.Join(k, "\n")
	}
	save := func() string {
		out, err := cp.NetNS.Command("iptables-legacy-save", "-t", "nat").CombinedOutput()
		if err != nil {
			t.Fatalf("iptables-legacy-save: %v: %s", err, out)
		}
		return string(out)
	}
	waitProgrammed := func(what string, present bool) {
		t.Helper()
		deadline := time.Now().Add(30 * time.Second)
		for strings.Contains(save(), what) != present {
			if time.Now().After(deadline) {
				t.Fatalf("%q present=%v not reached in 30s", what, !present)
			}
			time.Sleep(200 * time.Millisecond)
		}
	}
	// The syncPeriod comes from kube-proxy's /configz, and the policy's
	// differing value is a warning naming both.
	fs, err := newDetector(t, "DataplaneDrift", n, params).Detect(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(fs) != 1 || fs[0].Target != "kube-proxy/syncPeriod" || !strings.Contains(fs[0].Message, "10s") || !strings.Contains(fs[0].Message, "30s") {
		t.Fatalf("syncPeriod mismatch: %+v", fs)
	}
	if kpc.SyncPeriod() != syncPeriod {
		t.Fatalf("discovered syncPeriod %v", kpc.SyncPeriod())
	}

	createService(ctx, t, cp, testNS, "stable", 3)
	waitProgrammed(testNS+"/stable:http cluster IP", true)

	t.Run("healthy", func(t *testing.T) {
		for i := 0; i < 5; i++ {
			if fs := cycle(dets); len(fs) != 0 {
				t.Fatalf("healthy: %s", keys(fs))
			}
			time.Sleep(interval)
		}
	})

	t.Run("churn", func(t *testing.T) {
		start := time.Now()
		live := map[string]bool{}
		i := 0
		tick := time.NewTicker(interval)
		defer tick.Stop()
		for time.Since(start) < 60*time.Second {
			// Each tick: create two, scale one, delete one.
			for j := 0; j < 2; j++ {
				name := fmt.Sprintf("churn-%d", i)
				i++
				createService(ctx, t, cp, testNS, name, 1+i%3)
				live[name] = true
			}
			for name := range live {
				scaleService(ctx, t, cp, testNS, name, time.Now().Nanosecond()%4)
				break
			}
			if len(live) > 8 {
				for name := range live {
					deleteService(ctx, t, cp, testNS, name)
					delete(live, name)
					break
				}
			}
			if fs := cycle(dets); len(fs) != 0 {
				t.Fatalf("churn +%v: %s", time.Since(start).Round(time.Second), keys(fs))
			}
			<-tick.C
		}
		t.Logf("churn: %d Services created, %d left", i, len(live))
		// Past the grace after the last change: still nothing.
		settle := time.Now()
		for time.Since(settle) < grace+2*interval {
			if fs := cycle(dets); len(fs) != 0 {
				t.Fatalf("after churn +%v: %s", time.Since(settle).Round(time.Second), keys(fs))
			}
			<-tick.C
		}
		for name := range live {
			deleteService(ctx, t, cp, testNS, name)
		}
	})

	t.Run("rule removed behind kube-proxy", func(t *testing.T) {
		// The DNAT rule of one endpoint of "stable", deleted by hand.
		var sep, rule string
		for _, line := range strings.Split(save(), "\n") {
			if strings.HasPrefix(line, "-A KUBE-SEP-") && strings.Contains(line, testNS+"/stable:http") && strings.Contains(line, "DNAT") {
				sep, rule = strings.Fields(line)[1], line
				break
			}
		}
		if sep == "" {
			t.Fatal("no DNAT rule for stable")
		}
		args := append([]string{"-t", "nat", "-D"}, splitRule(strings.TrimPrefix(rule, "-A "))...)
		if out, err := cp.NetNS.Command("iptables-legacy", args...).CombinedOutput(); err != nil {
			t.Fatalf("iptables-legacy %v: %v: %s", args, err, out)
		}
		backend := rule[strings.Index(rule, "--to-destination ")+len("--to-destination "):]
		backend = strings.Fields(backend)[0]
		removed := time.Now()
		for {
			fs := cycle(dets)
			f, ok := fs["DataplaneDrift dataplane/IPv4/"+testNS+"/stable:http"]
			if ok {
				if !strings.Contains(f.Message, "missing-backends") || !strings.Contains(f.Message, backend) {
					t.Fatalf("finding does not name the backend %s: %s", backend, f.Message)
				}
				t.Logf("reported %v after the removal: %s", time.Since(removed).Round(time.Millisecond), f.Message)
				break
			}
			if time.Since(removed) > 2*interval+5*time.Second {
				t.Fatalf("removed DNAT rule of %s not reported: %s", backend, keys(fs))
			}
			time.Sleep(interval)
		}
		// Clean up: a changed slice makes kube-proxy rewrite the chains.
		scaleService(ctx, t, cp, testNS, "stable", 2)
		waitProgrammed(backend, false)
	})

	// deaf makes kube-proxy's API connection silently dead, creates a
	// Service and expects both findings naming it within grace + 2
	// intervals, by the running detectors and by fresh ones (--once).
	deaf := func(t *testing.T, proxy *apiProxy, n *node.Node, name string, programmed func() string) {
		dets := []Detector{newDetector(t, "DataplaneDrift", n, params), newDetector(t, "KubeProxyNotHearingAPI", n, params)}
		proxy.Kill()
		time.Sleep(2 * time.Second)
		created := time.Now()
		createService(ctx, t, cp, testNS, name, 2)
		target := "dataplane/IPv4/" + testNS + "/" + name + ":http"
		var drift, deafAfter time.Duration
		for drift == 0 || deafAfter == 0 {
			fs := cycle(dets)
			if f, ok := fs["DataplaneDrift "+target]; ok && drift == 0 {
				drift = time.Since(created)
				t.Logf("drift after %v: %s", drift.Round(time.Millisecond), f.Message)
			}
			if f, ok := fs["KubeProxyNotHearingAPI kube-proxy/api-updates"]; ok && deafAfter == 0 {
				if !strings.Contains(f.Message, testNS+"/"+name+":http") {
					t.Fatalf("deaf finding does not name the Service: %s", f.Message)
				}
				deafAfter = time.Since(created)
				t.Logf("deaf after %v: %s (evidence %v)", deafAfter.Round(time.Millisecond), f.Message, f.Evidence)
			}
			if time.Since(created) > grace+2*interval+3*time.Second {
				t.Fatalf("after %v: %s", time.Since(created).Round(time.Second), keys(fs))
			}
			time.Sleep(interval)
		}
		if strings.Contains(programmed(), testNS+"/"+name) {
			t.Fatal("kube-proxy programmed the Service: it was not deaf")
		}
		for _, d := range []time.Duration{drift, deafAfter} {
			if d < grace-time.Second {
				t.Errorf("reported %v after creation, inside the grace %v", d, grace)
			}
		}
		// As --once: detectors built now, no memory, report it at once.
		fs := cycle([]Detector{newDetector(t, "DataplaneDrift", n, params), newDetector(t, "KubeProxyNotHearingAPI", n, params)})
		if _, ok := fs["DataplaneDrift "+target]; !ok {
			t.Errorf("fresh detectors (--once): %s", keys(fs))
		}
		if _, ok := fs["KubeProxyNotHearingAPI kube-proxy/api-updates"]; !ok {
			t.Errorf("fresh detectors (--once): %s", keys(fs))
		}
	}

	t.Run("kube-proxy deaf", func(t *testing.T) {
		deaf(t, proxy, n, "after-deaf", save)
	})

	// nftables mode: the iptables kube-proxy stopped, one in nftables mode
	// (another Node name, its own API proxy) on the same control plane.
	t.Run("nftables mode", func(t *testing.T) {
		if _, err := exec.LookPath("nft"); err != nil {
			t.Skip("needs nft (Debian package nftables)")
		}
		kp.Stop(t)
		proxy2 := startAPIProxy(t, cp, "127.0.0.1:16444")
		kp2 := cp.StartKubeProxy(controlplane.KubeProxyOptions{NodeName: "node2", Mode: "nftables", SyncPeriod: syncPeriod, APIServerURL: "https://127.0.0.1:16444"})
		kpc2 := kp2.Client(kubeproxy.Options{SyncPeriod: syncPeriod, Timeout: 2 * time.Second, CacheTTL: 500 * time.Millisecond})
		nft := nftables.New(nftables.Config{Prefix: []string{"ip", "netns", "exec", cp.NetNS.Name}, CacheTTL: 500 * time.Millisecond})
		n2 := &node.Node{Name: kp2.NodeName, Clock: clock.RealClock{}, Log: zap.NewNop(), KubeProxy: kpc2, Cluster: view, NFTables: nft}
		list := func() string {
			out, err := cp.NetNS.Command("nft", "list", "table", "ip", "kube-proxy").CombinedOutput()
			if err != nil {
				t.Fatalf("nft list: %v: %s", err, out)
			}
			return string(out)
		}
		createService(ctx, t, cp, testNS, "nft-stable", 2)
		deadline := time.Now().Add(30 * time.Second)
		for !strings.Contains(list(), testNS+"/nft-stable/tcp/http") {
			if time.Now().After(deadline) {
				t.Fatal("nft-stable not programmed")
			}
			time.Sleep(200 * time.Millisecond)
		}
		dets2 := []Detector{newDetector(t, "DataplaneDrift", n2, params), newDetector(t, "KubeProxyNotHearingAPI", n2, params)}
		for i := 0; i < 3; i++ {
			if fs := cycle(dets2); len(fs) != 0 {
				t.Fatalf("healthy nftables mode: %s", keys(fs))
			}
			time.Sleep(interval)
		}
		deaf(t, proxy2, n2, "after-deaf-nft", list)
	})
}

// splitRule splits an iptables-save rule line into arguments, honouring
// double quotes.
func splitRule(s string) []string {
	var out []string
	var cur strings.Builder
	in := false
	for _, r := range s {
		switch {
		case r == '"':
			in = !in
		case r == ' ' && !in:
			if cur.Len() > 0 {
				out = append(out, cur.String())
				cur.Reset()
			}
		default:
			cur.WriteRune(r)
		}
	}
	if cur.Len() > 0 {
		out = append(out, cur.String())
	}
	return out
}

var svcSeq struct {
	sync.Mutex
	n int
}

// createService creates a Service with ports http/80 and dns/53 and an
// EndpointSlice with ready endpoints (no controller-manager runs).
func createService(ctx context.Context, t *testing.T, cp *controlplane.ControlPlane, ns, name string, endpoints int) {
	t.Helper()
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec: corev1.ServiceSpec{Ports: []corev1.ServicePort{
			{Name: "http", Port: 80, Protocol: corev1.ProtocolTCP},
			{Name: "dns", Port: 53, Protocol: corev1.ProtocolUDP},
		}},
	}
	if _, err := cp.Client.CoreV1().Services(ns).Create(ctx, svc, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create service %s: %v", name, err)
	}
	es := &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Name: name + "-1", Namespace: ns, Labels: map[string]string{discoveryv1.LabelServiceName: name}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports: []discoveryv1.EndpointPort{
			{Name: ptr.To("http"), Port: ptr.To[int32](8080), Protocol: ptr.To(corev1.ProtocolTCP)},
			{Name: ptr.To("dns"), Port: ptr.To[int32](53), Protocol: ptr.To(corev1.ProtocolUDP)},
		},
		Endpoints: endpointsFor(endpoints),
	}
	if _, err := cp.Client.DiscoveryV1().EndpointSlices(ns).Create(ctx, es, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create endpointslice %s: %v", name, err)
	}
}

func endpointsFor(n int) []discoveryv1.Endpoint {
	out := []discoveryv1.Endpoint{}
	for i := 0; i < n; i++ {
		svcSeq.Lock()
		svcSeq.n++
		k := svcSeq.n
		svcSeq.Unlock()
		out = append(out, discoveryv1.Endpoint{Addresses: []string{fmt.Sprintf("10.244.%d.%d", k/250, k%250+1)},
			Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true)}})
	}
	return out
}

func scaleService(ctx context.Context, t *testing.T, cp *controlplane.ControlPlane, ns, name string, endpoints int) {
	t.Helper()
	es, err := cp.Client.DiscoveryV1().EndpointSlices(ns).Get(ctx, name+"-1", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	es.Endpoints = endpointsFor(endpoints)
	if _, err := cp.Client.DiscoveryV1().EndpointSlices(ns).Update(ctx, es, metav1.UpdateOptions{}); err != nil {
		t.Fatalf("scale %s: %v", name, err)
	}
}

func deleteService(ctx context.Context, t *testing.T, cp *controlplane.ControlPlane, ns, name string) {
	t.Helper()
	if err := cp.Client.DiscoveryV1().EndpointSlices(ns).Delete(ctx, name+"-1", metav1.DeleteOptions{}); err != nil {
		t.Fatalf("delete slice %s: %v", name, err)
	}
	if err := cp.Client.CoreV1().Services(ns).Delete(ctx, name, metav1.DeleteOptions{}); err != nil {
		t.Fatalf("delete service %s: %v", name, err)
	}
}
