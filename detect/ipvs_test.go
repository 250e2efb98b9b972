package detect

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/remediate-dev/remediate/internal/cluster"
	"github.com/remediate-dev/remediate/internal/cluster/clustertest"
	"github.com/remediate-dev/remediate/internal/finding"
	"github.com/remediate-dev/remediate/internal/ipvs"
	"github.com/remediate-dev/remediate/internal/kubeproxy"
	"github.com/remediate-dev/remediate/internal/node"
)

var ipvsT0 = time.Date(2026, 11, 21, 12, 0, 0, 0, time.UTC)

// procRoot returns a fake proc root whose net/dev lists kube-ipvs0 when
// ipvsMode is true.
func ipvsProcRoot(t testing.TB, ipvsMode bool) string {
	t.Helper()
	root := t.TempDir()
	dev := "Inter-|   Receive                                                |  Transmit\n" +
		" face |bytes    packets errs drop fifo frame compressed multicast|bytes    packets errs drop fifo colls carrier compressed\n" +
		"    lo:  123456    1234    0    0    0     0          0         0   123456    1234    0    0    0     0       0          0\n" +
		"  eth0: 9876543   98765    0    0    0     0          0         0  8765432   87654    0    0    0     0       0          0\n"
	if ipvsMode {
		dev += "kube-ipvs0:       0       0    0    0    0     0          0         0        0       0    0    0    0     0       0          0\n"
	}
	if err := os.MkdirAll(filepath.Join(root, "net"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(root, "net", "dev"), []byte(dev), 0o644); err != nil {
		t.Fatal(err)
	}
	return root
}

func tVS(proto, addr string, port uint16) ipvs.VirtualServer {
	return ipvs.VirtualServer{Address: netip.MustParseAddr(addr), Protocol: proto, Port: port}
}

func tRS(addr string, port uint16, weight, active, inactive int) ipvs.RealServer {
	return ipvs.RealServer{Address: netip.MustParseAddr(addr), Port: port, Weight: weight, ActiveConns: active, InactiveConns: inactive}
}

func tEP(addr string, port int32, proto, portName string, ready, serving, terminating bool) cluster.Endpoint {
	return cluster.Endpoint{Address: addr, Port: port, Protocol: proto, PortName: portName, Ready: ready, Serving: serving, Terminating: terminating}
}

// ipvsWorld is one fake IPVS state and one fake cluster view.
type ipvsWorld struct {
	ipvs *ipvs.Fake
	view *clustertest.Fake
	node *node.Node
}

// newIPVSWorld has what every cluster has: default/kubernetes and its
// virtual server.
func newIPVSWorld(t testing.TB) *ipvsWorld {
	w := &ipvsWorld{ipvs: ipvs.NewFake(), view: clustertest.New(ipvsT0)}
	w.node = &node.Node{Name: "node1", ProcRoot: ipvsProcRoot(t, true), IPVS: w.ipvs, Cluster: w.view}
	w.view.SetService(cluster.Service{Namespace: "default", Name: "kubernetes", ClusterIPs: []string{"10.96.0.1"},
		Ports: []cluster.ServicePort{{Name: "https", Protocol: "TCP", Port: 443}}},
		tEP("10.200.0.1", 6443, "TCP", "https", true, true, false))
	w.addVS(t, tVS("TCP", "10.96.0.1", 443), tRS("10.200.0.1", 6443, 1, 3, 0))
	return w
}

func (w *ipvsWorld) addVS(t testing.TB, v ipvs.VirtualServer, rss ...ipvs.RealServer) {
	t.Helper()
	if err := w.ipvs.AddVirtualServer(v); err != nil {
		t.Fatal(err)
	}
	for _, r := range rss {
		if err := w.ipvs.AddRealServer(v, r); err != nil {
			t.Fatal(err)
		}
	}
}

var ipvsKubeDNS = cluster.Service{
	Namespace: "kube-system", Name: "kube-dns",
	ClusterIPs: []string{"10.96.0.10"},
	Ports: []cluster.ServicePort{
		{Name: "dns", Protocol: "UDP", Port: 53},
		{Name: "dns-tcp", Protocol: "TCP", Port: 53},
	},
}

// ipvsCoreDNSRollout is the rolling update of CoreDNS from the guides: the old
// pod 10.244.0.12 is gone from the EndpointSlices, two new pods are ready,
// but IPVS still has the old pod as a UDP real server (kube-proxy missed the
// update) and DNS clients' UDP entries stay pinned to it; the TCP real
// server is at weight 0 draining its last connection.
func ipvsCoreDNSRollout(t *testing.T) *ipvsWorld {
	w := newIPVSWorld(t)
	w.view.SetService(ipvsKubeDNS,
		tEP("10.244.1.21", 53, "UDP", "dns", true, true, false),
		tEP("10.244.2.22", 53, "UDP", "dns", true, true, false),
		tEP("10.244.1.21", 53, "TCP", "dns-tcp", true, true, false),
		tEP("10.244.2.22", 53, "TCP", "dns-tcp", true, true, false),
	)
	w.addVS(t, tVS("UDP", "10.96.0.10", 53), tRS("10.244.0.12", 53, 1, 0, 2), tRS("10.244.1.21", 53, 1, 0, 5), tRS("10.244.2.22", 53, 1, 0, 4))
	w.addVS(t, tVS("TCP", "10.96.0.10", 53), tRS("10.244.0.12", 53, 0, 1, 0), tRS("10.244.1.21", 53, 1, 0, 0), tRS("10.244.2.22", 53, 1, 0, 0))
	f, err := os.Open("testdata/ip_vs_conn")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := ipvs.ParseConns(context.Background(), f, "", func(c ipvs.Conn) error { w.ipvs.AddConn(c); return nil }); err != nil {
		t.Fatal(err)
	}
	return w
}

func newIPVSDetector(t *testing.T, name string, n *node.Node, set func(p any)) Detector {
	t.Helper()
	typ, ok := Lookup(name)
	if !ok {
		t.Fatalf("%s not registered", name)
	}
	p := typ.NewParams()
	if set != nil {
		set(p)
	}
	d, err := typ.New(p, n)
	if err != nil {
		t.Fatal(err)
	}
	return d
}

func ipvsTargets(fs []finding.Finding) []string {
	out := []string{}
	for _, f := range fs {
		out = append(out, f.Target)
	}
	return out
}

func TestIPVSStaleRealServer(t *testing.T) {
	cases := []struct {
		name      string
		ipvsWorld func(t *testing.T) *ipvsWorld
		set       func(p any)
		want      []string
		wantSkip  string
		wantErr   string
		checkEvid func(t *testing.T, fs []finding.Finding)
	}{
		{
			name:      "CoreDNS rollout: terminated pod left as UDP real server, draining TCP one kept",
			ipvsWorld: ipvsCoreDNSRollout,
			want:      []string{"ipvs-rs/UDP/10.96.0.10:53/10.244.0.12:53"},
			checkEvid: func(t *testing.T, fs []finding.Finding) {
				e := fs[0].Evidence
				if e["backendIP"] != "10.244.0.12" || e["backendPort"] != 53 || e["protocol"] != "UDP" ||
					e["reason"] != ipvs.BackendNotEndpoint || e["service"] != "kube-system/kube-dns" ||
					e["vsAddress"] != "10.96.0.10" || e["vsPort"] != 53 || e["rsAddress"] != "10.244.0.12" {
					t.Errorf("evidence = %v", e)
				}
				if fs[0].Severity != finding.Warning {
					t.Errorf("severity = %s, want warning (two good real servers remain)", fs[0].Severity)
				}
			},
		},
		{
			name:      "draining TCP real server reported when asked",
			ipvsWorld: ipvsCoreDNSRollout,
			set:       func(p any) { p.(*IPVSStaleRealServerParams).IncludeDraining = true },
			want:      []string{"ipvs-rs/TCP/10.96.0.10:53/10.244.0.12:53", "ipvs-rs/UDP/10.96.0.10:53/10.244.0.12:53"},
		},
		{
			name: "terminating but serving endpoint with no ready one is what kube-proxy uses",
			ipvsWorld: func(t *testing.T) *ipvsWorld {
				w := newIPVSWorld(t)
				w.view.SetService(ipvsKubeDNS, tEP("10.244.0.12", 53, "UDP", "dns", false, true, true))
				w.addVS(t, tVS("UDP", "10.96.0.10", 53), tRS("10.244.0.12", 53, 1, 0, 0))
				return w
			},
			want: []string{},
		},
		{
			name: "terminating endpoint while ready ones exist is stale",
			ipvsWorld: func(t *testing.T) *ipvsWorld {
				w := newIPVSWorld(t)
				w.view.SetService(ipvsKubeDNS, tEP("10.244.0.12", 53, "UDP", "dns", false, true, true), tEP("10.244.1.21", 53, "UDP", "dns", true, true, false))
				w.addVS(t, tVS("UDP", "10.96.0.10", 53), tRS("10.244.0.12", 53, 1, 0, 0), tRS("10.244.1.21", 53, 1, 0, 0))
				return w
			},
			want: []string{"ipvs-rs/UDP/10.96.0.10:53/10.244.0.12:53"},
			checkEvid: func(t *testing.T, fs []finding.Finding) {
				if fs[0].Evidence["reason"] != ipvs.BackendTerminatingWhileReady {
					t.Errorf("reason = %v", fs[0].Evidence["reason"])
				}
			},
		},
		{
			name: "every real server stale is critical",
			ipvsWorld: func(t *testing.T) *ipvsWorld {
				w := newIPVSWorld(t)
				w.view.SetService(ipvsKubeDNS, tEP("10.244.0.12", 53, "UDP", "dns", false, false, false))
				w.addVS(t, tVS("UDP", "10.96.0.10", 53), tRS("10.244.0.12", 53, 1, 0, 0))
				return w
			},
			want: []string{"ipvs-rs/UDP/10.96.0.10:53/10.244.0.12:53"},
			checkEvid: func(t *testing.T, fs []finding.Finding) {
				if fs[0].Severity != finding.Critical || fs[0].Evidence["reason"] != ipvs.BackendNotServing {
					t.Errorf("finding = %+v", fs[0])
				}
			},
		},
		{
			name: "NodePort virtual server on a node address",
			ipvsWorld: func(t *testing.T) *ipvsWorld {
				w := newIPVSWorld(t)
				s := ipvsKubeDNS
				s.Ports = []cluster.ServicePort{{Name: "dns", Protocol: "UDP", Port: 53, NodePort: 30053}}
				w.view.SetService(s, tEP("10.244.1.21", 53, "UDP", "dns", true, true, false))
				w.addVS(t, tVS("UDP", "192.168.1.10", 30053), tRS("10.244.0.12", 53, 1, 0, 0), tRS("10.244.1.21", 53, 1, 0, 0))
				return w
			},
			want: []string{"ipvs-rs/UDP/192.168.1.10:30053/10.244.0.12:53"},
		},
		{
			name: "virtual servers of no Service are left to IPVSStaleVirtualServer",
			ipvsWorld: func(t *testing.T) *ipvsWorld {
				w := newIPVSWorld(t)
				w.addVS(t, tVS("TCP", "10.96.7.7", 80), tRS("10.244.0.12", 8080, 1, 0, 0))
				return w
			},
			want: []string{},
		},
		{
			name: "virtual server deleted between list and lookup (kube-proxy syncing)",
			ipvsWorld: func(t *testing.T) *ipvsWorld {
				w := ipvsCoreDNSRollout(t)
				w.ipvs.InjectError("RealServers", fmt.Errorf("list: %w", ipvs.ErrNotFound))
				return w
			},
			want: []string{},
		},
		{
			name: "IPVS error is an error, not healthy",
			ipvsWorld: func(t *testing.T) *ipvsWorld {
				w := ipvsCoreDNSRollout(t)
				w.ipvs.InjectError("RealServers", errors.New("netlink: no buffer space"))
				return w
			},
			wantErr: "no buffer space",
		},
		{
			name: "view not synced",
			ipvsWorld: func(t *testing.T) *ipvsWorld {
				w := ipvsCoreDNSRollout(t)
				w.view.SetFreshness(cluster.Freshness{})
				return w
			},
			wantSkip: "not synced",
		},
		{
			name: "view disconnected",
			ipvsWorld: func(t *testing.T) *ipvsWorld {
				w := ipvsCoreDNSRollout(t)
				w.view.SetFreshness(cluster.Freshness{Synced: true, LastError: errors.New("watch: connection refused")})
				return w
			},
			wantSkip: "cluster view disconnected, its age unknown (API server unreachable: watch: connection refused)",
		},
		{
			name: "IPVS unavailable",
			ipvsWorld: func(t *testing.T) *ipvsWorld {
				w := ipvsCoreDNSRollout(t)
				w.ipvs.SetUnavailable("no ip_vs module")
				return w
			},
			wantSkip: "IPVS unavailable: no ip_vs module",
		},
		{
			name: "kube-proxy not in IPVS mode",
			ipvsWorld: func(t *testing.T) *ipvsWorld {
				w := ipvsCoreDNSRollout(t)
				w.node.ProcRoot = ipvsProcRoot(t, false)
				return w
			},
			wantSkip: "no kube-ipvs0 interface",
		},
		{
			name: "kube-proxy says iptables mode (/proxyMode)",
			ipvsWorld: func(t *testing.T) *ipvsWorld {
				w := ipvsCoreDNSRollout(t)
				kp := kubeproxy.NewFake(nil, 30*time.Second)
				kp.SetMode(kubeproxy.ModeIPTables, nil)
				w.node.KubeProxy = kp
				return w
			},
			wantSkip: `kube-proxy runs in "iptables" mode`,
		},
		{
			name: "kube-proxy says ipvs mode: kube-ipvs0 not needed",
			ipvsWorld: func(t *testing.T) *ipvsWorld {
				w := ipvsCoreDNSRollout(t)
				w.node.ProcRoot = ipvsProcRoot(t, false)
				kp := kubeproxy.NewFake(nil, 30*time.Second)
				kp.SetMode(kubeproxy.ModeIPVS, nil)
				w.node.KubeProxy = kp
				return w
			},
			want: []string{"ipvs-rs/UDP/10.96.0.10:53/10.244.0.12:53"},
		},
		{
			name: "kube-proxy unreachable: falls back to kube-ipvs0",
			ipvsWorld: func(t *testing.T) *ipvsWorld {
				w := ipvsCoreDNSRollout(t)
				w.node.ProcRoot = ipvsProcRoot(t, false)
				kp := kubeproxy.NewFake(nil, 30*time.Second)
				kp.SetMode("", errors.New("connection refused"))
				w.node.KubeProxy = kp
				return w
			},
			wantSkip: "no kube-ipvs0 interface",
		},
		{
			name: "no IPVS adapter",
			ipvsWorld: func(t *testing.T) *ipvsWorld {
				w := ipvsCoreDNSRollout(t)
				w.node.IPVS = nil
				w.node.Unavailable = map[string]string{"ipvs": "IPVS unavailable: no ip_vs module"}
				return w
			},
			wantSkip: "IPVS unavailable: no ip_vs module",
		},
		{
			name:      "no cluster view",
			ipvsWorld: func(t *testing.T) *ipvsWorld { w := ipvsCoreDNSRollout(t); w.node.Cluster = nil; return w },
			wantSkip:  "kubernetes is not configured",
		},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			w := c.ipvsWorld(t)
			fs, err := newIPVSDetector(t, "IPVSStaleRealServer", w.node, c.set).Detect(context.Background())
			if c.wantErr != "" {
				if _, skip := finding.IsSkip(err); err == nil || skip || !strings.Contains(err.Error(), c.wantErr) {
					t.Fatalf("err = %v, want an error containing %q", err, c.wantErr)
				}
				return
			}
			ipvsCheckResult(t, fs, err, c.want, c.wantSkip)
			if c.checkEvid != nil && err == nil && len(fs) > 0 {
				c.checkEvid(t, fs)
			}
		})
	}
}

func ipvsCheckResult(t *testing.T, fs []finding.Finding, err error, want []string, wantSkip string) {
	t.Helper()
	if wantSkip != "" {
		reason, ok := finding.IsSkip(err)
		if !ok || !strings.Contains(reason, wantSkip) {
			t.Fatalf("err = %v, want a skip containing %q", err, wantSkip)
		}
		return
	}
	if err != nil {
		t.Fatal(err)
	}
	got := ipvsTargets(fs)
	if want == nil {
		want = []string{}
	}
	ipvsSortStrings(got)
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("ipvsTargets = %v, want %v", got, want)
	}
}

func ipvsSortStrings(s []string) {
	for i := 1; i < len(s); i++ {
		for j := i; j > 0 && s[j] < s[j-1]; j-- {
			s[j], s[j-1] = s[j-1], s[j]
		}
	}
}

func TestIPVSStaleVirtualServer(t *testing.T) {
	build := func(t *testing.T) *ipvsWorld {
		w := newIPVSWorld(t)
		s := ipvsKubeDNS
		s.Ports = append([]cluster.ServicePort{}, ipvsKubeDNS.Ports...)
		s.Ports[0].NodePort = 30053
		s.ExternalIPs = []string{"203.0.113.7"}
		w.view.SetService(s, tEP("10.244.1.21", 53, "UDP", "dns", true, true, false))
		w.addVS(t, tVS("UDP", "10.96.0.10", 53), tRS("10.244.1.21", 53, 1, 0, 0))
		w.addVS(t, tVS("UDP", "203.0.113.7", 53))                                 // external IP: expected
		w.addVS(t, tVS("UDP", "192.168.1.10", 30053))                             // NodePort: expected
		w.addVS(t, tVS("TCP", "10.96.5.5", 80), tRS("10.244.3.3", 8080, 1, 0, 0)) // deleted Service
		w.addVS(t, tVS("TCP", "172.16.0.1", 80))                                  // not kube-proxy's
		w.addVS(t, tVS("TCP", "192.168.1.10", 31999))                             // NodePort of a deleted Service
		w.addVS(t, ipvs.VirtualServer{FWMark: 9})                                 // firewall mark: not kube-proxy's
		return w
	}
	t.Run("default scope", func(t *testing.T) {
		w := build(t)
		fs, err := newIPVSDetector(t, "IPVSStaleVirtualServer", w.node, nil).Detect(context.Background())
		ipvsCheckResult(t, fs, err, []string{"ipvs-vs/TCP/10.96.5.5:80"}, "")
		if fs[0].Evidence["realServers"] != 1 || fs[0].Evidence["vsProtocol"] != "TCP" || fs[0].Evidence["vsPort"] != 80 {
			t.Errorf("evidence = %v", fs[0].Evidence)
		}
	})
	t.Run("with node IPs", func(t *testing.T) {
		w := build(t)
		fs, err := newIPVSDetector(t, "IPVSStaleVirtualServer", w.node, func(p any) {
			p.(*IPVSStaleVirtualServerParams).NodeIPs = []string{"192.168.1.10"}
		}).Detect(context.Background())
		ipvsCheckResult(t, fs, err, []string{"ipvs-vs/TCP/10.96.5.5:80", "ipvs-vs/TCP/192.168.1.10:31999"}, "")
	})
	// kube-proxy's ipvs.excludeCIDRs (kubernetes/kubernetes#134147): a
	// virtual server inside them is someone else's and never reported.
	withKubeProxy := func(w *ipvsWorld, cz *kubeproxy.Configz, err error) {
		kp := kubeproxy.NewFake(nil, 30*time.Second)
		kp.SetMode(kubeproxy.ModeIPVS, nil)
		kp.SetConfigz(cz, err)
		w.node.KubeProxy = kp
	}
	t.Run("inside kube-proxy's excludeCIDRs", func(t *testing.T) {
		w := build(t)
		w.addVS(t, tVS("TCP", "10.96.6.6", 80)) // outside the exclusion: reported
		withKubeProxy(w, &kubeproxy.Configz{SyncPeriod: 30 * time.Second, Mode: "ipvs", IPVSExcludeCIDRs: []string{"10.96.5.0/24", "fd00::/64"}}, nil)
		d := newIPVSDetector(t, "IPVSStaleVirtualServer", w.node, nil)
		fs, err := d.Detect(context.Background())
		ipvsCheckResult(t, fs, err, []string{"ipvs-vs/TCP/10.96.6.6:80"}, "")
		if got := fs[0].Evidence["excludeCIDRs"]; !reflect.DeepEqual(got, []string{"10.96.5.0/24", "fd00::/64"}) {
			t.Errorf("excludeCIDRs evidence = %#v", got)
		}
	})
	t.Run("excludeCIDRs unknown: reported with a note", func(t *testing.T) {
		w := build(t)
		withKubeProxy(w, nil, errors.New("connection refused"))
		fs, err := newIPVSDetector(t, "IPVSStaleVirtualServer", w.node, nil).Detect(context.Background())
		ipvsCheckResult(t, fs, err, []string{"ipvs-vs/TCP/10.96.5.5:80"}, "")
		if note, _ := fs[0].Evidence["excludeCIDRs"].(string); !strings.Contains(note, "unknown") || !strings.Contains(note, "connection refused") {
			t.Errorf("excludeCIDRs evidence = %#v", fs[0].Evidence["excludeCIDRs"])
		}
	})
	t.Run("excludeCIDRs that do not parse: reported with a note", func(t *testing.T) {
		w := build(t)
		withKubeProxy(w, &kubeproxy.Configz{SyncPeriod: 30 * time.Second, IPVSExcludeCIDRs: []string{"10.96.5.0/24", "bogus"}}, nil)
		fs, err := newIPVSDetector(t, "IPVSStaleVirtualServer", w.node, nil).Detect(context.Background())
		ipvsCheckResult(t, fs, err, []string{"ipvs-vs/TCP/10.96.5.5:80"}, "")
		if note, _ := fs[0].Evidence["excludeCIDRs"].(string); !strings.Contains(note, "not a CIDR") {
			t.Errorf("excludeCIDRs evidence = %#v", fs[0].Evidence["excludeCIDRs"])
		}
	})
	t.Run("service deleted from view makes its virtual server stale", func(t *testing.T) {
		w := build(t)
		w.view.DeleteService("kube-system", "kube-dns")
		fs, err := newIPVSDetector(t, "IPVSStaleVirtualServer", w.node, nil).Detect(context.Background())
		ipvsCheckResult(t, fs, err, []string{"ipvs-vs/TCP/10.96.5.5:80", "ipvs-vs/UDP/10.96.0.10:53"}, "")
	})
	t.Run("empty view is not trusted", func(t *testing.T) {
		w := build(t)
		w.view.DeleteService("kube-system", "kube-dns")
		w.view.DeleteService("default", "kubernetes")
		_, err := newIPVSDetector(t, "IPVSStaleVirtualServer", w.node, nil).Detect(context.Background())
		ipvsCheckResult(t, nil, err, nil, "no Services at all")
	})
	t.Run("not synced", func(t *testing.T) {
		w := build(t)
		w.view.SetFreshness(cluster.Freshness{})
		_, err := newIPVSDetector(t, "IPVSStaleVirtualServer", w.node, nil).Detect(context.Background())
		ipvsCheckResult(t, nil, err, nil, "not synced")
	})
	t.Run("invalid params", func(t *testing.T) {
		typ, _ := Lookup("IPVSStaleVirtualServer")
		p := typ.NewParams().(*IPVSStaleVirtualServerParams)
		p.ManagedCIDRs = []string{"10.96.0.0/12", "nope"}
		p.NodeIPs = []string{"x"}
		p.MaxFindings = 0
		errs := p.Validate()
		if len(errs) != 3 || errs[0].Field != "managedCIDRs[1]" || errs[1].Field != "nodeIPs[0]" || errs[2].Field != "maxFindings" {
			t.Fatalf("errs = %+v", errs)
		}
	})
}

func TestIPVSMissingVirtualServer(t *testing.T) {
	w := newIPVSWorld(t)
	w.view.SetService(ipvsKubeDNS,
		tEP("10.244.1.21", 53, "UDP", "dns", true, true, false),
		tEP("10.244.1.21", 53, "TCP", "dns-tcp", true, true, false))
	w.view.SetService(cluster.Service{Namespace: "default", Name: "empty", ClusterIPs: []string{"10.96.3.3"},
		Ports: []cluster.ServicePort{{Protocol: "TCP", Port: 80}}})
	w.view.SetService(cluster.Service{Namespace: "default", Name: "dual", ClusterIPs: []string{"10.96.4.4", "fd00::4"},
		Ports: []cluster.ServicePort{{Protocol: "TCP", Port: 443, NodePort: 30443}}},
		tEP("10.244.2.2", 8443, "TCP", "", true, true, false))
	w.addVS(t, tVS("TCP", "10.96.0.10", 53), tRS("10.244.1.21", 53, 1, 0, 0))

	fs, err := newIPVSDetector(t, "IPVSMissingVirtualServer", w.node, nil).Detect(context.Background())
	// UDP/53 of kube-dns and the IPv4 ClusterIP of "dual" are missing; the
	// Service without endpoints and the IPv6 family (no IPv6 virtual server
	// at all on this node) are not reported.
	ipvsCheckResult(t, fs, err, []string{"ipvs-vs/TCP/10.96.4.4:443", "ipvs-vs/UDP/10.96.0.10:53"}, "")
	for _, f := range fs {
		if f.Severity != finding.Critical || f.Evidence["service"] == nil {
			t.Errorf("finding = %+v", f)
		}
	}

	fs, err = newIPVSDetector(t, "IPVSMissingVirtualServer", w.node, func(p any) {
		p.(*IPVSMissingVirtualServerParams).NodeIPs = []string{"192.168.1.10"}
	}).Detect(context.Background())
	ipvsCheckResult(t, fs, err, []string{"ipvs-vs/TCP/10.96.4.4:443", "ipvs-vs/TCP/192.168.1.10:30443", "ipvs-vs/UDP/10.96.0.10:53"}, "")
}

func TestIPVSUDPDeadBackend(t *testing.T) {
	t.Run("CoreDNS rollout: DNS clients pinned to the terminated pod", func(t *testing.T) {
		w := ipvsCoreDNSRollout(t)
		sys := filepath.Join(w.node.ProcRoot, "sys", "net", "ipv4", "vs")
		if err := os.MkdirAll(sys, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(sys, "expire_nodest_conn"), []byte("0\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		fs, err := newIPVSDetector(t, "IPVSUDPDeadBackend", w.node, nil).Detect(context.Background())
		ipvsCheckResult(t, fs, err, []string{"ipvs-conn/UDP/10.244.0.12:53"}, "")
		e := fs[0].Evidence
		want := map[string]any{
			"backendIP": "10.244.0.12", "backendPort": 53, "protocol": "UDP",
			"connections": 2, "clientCount": 2, "clients": []string{"10.0.0.5", "10.0.0.6"},
			"virtualServers": []string{"UDP/10.96.0.10:53"}, "services": []string{"kube-system/kube-dns"},
			"templates": 0, "reason": ipvs.BackendNotEndpoint, "clientCountIsLowerBound": false,
			"stillRealServerIn": []string{"UDP/10.96.0.10:53"}, "expireNodestConn": "0",
		}
		if !reflect.DeepEqual(e, want) {
			t.Errorf("evidence = %#v\nwant %#v", e, want)
		}
		if !strings.Contains(fs[0].Message, "still a real server of UDP/10.96.0.10:53") || !strings.Contains(fs[0].Message, "expire_nodest_conn=0") {
			t.Errorf("message = %q", fs[0].Message)
		}
	})
	t.Run("real server already removed, entries still pinned", func(t *testing.T) {
		w := ipvsCoreDNSRollout(t)
		if err := w.ipvs.DeleteRealServer(context.Background(), tVS("UDP", "10.96.0.10", 53), tRS("10.244.0.12", 53, 1, 0, 0)); err != nil {
			t.Fatal(err)
		}
		fs, err := newIPVSDetector(t, "IPVSUDPDeadBackend", w.node, nil).Detect(context.Background())
		ipvsCheckResult(t, fs, err, []string{"ipvs-conn/UDP/10.244.0.12:53"}, "")
		if still := fs[0].Evidence["stillRealServerIn"].([]string); len(still) != 0 {
			t.Errorf("stillRealServerIn = %v", still)
		}
		// With expire_nodest_conn=1 those entries expire on their next
		// packet (measured in the VM): nobody is pinned, no finding.
		sys := filepath.Join(w.node.ProcRoot, "sys", "net", "ipv4", "vs")
		if err := os.MkdirAll(sys, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(sys, "expire_nodest_conn"), []byte("1\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		fs, err = newIPVSDetector(t, "IPVSUDPDeadBackend", w.node, nil).Detect(context.Background())
		ipvsCheckResult(t, fs, err, []string{}, "")
	})
	t.Run("entries to a terminating pod that still serves are not dead", func(t *testing.T) {
		w := ipvsCoreDNSRollout(t)
		w.view.SetEndpoints("kube-system", "kube-dns",
			tEP("10.244.0.12", 53, "UDP", "dns", false, true, true),
			tEP("10.244.1.21", 53, "UDP", "dns", true, true, false))
		fs, err := newIPVSDetector(t, "IPVSUDPDeadBackend", w.node, nil).Detect(context.Background())
		ipvsCheckResult(t, fs, err, nil, "")
	})
	t.Run("threshold", func(t *testing.T) {
		w := ipvsCoreDNSRollout(t)
		fs, err := newIPVSDetector(t, "IPVSUDPDeadBackend", w.node, func(p any) {
			p.(*IPVSUDPDeadBackendParams).MinConnections = 3
		}).Detect(context.Background())
		ipvsCheckResult(t, fs, err, nil, "")
	})
	t.Run("client list is bounded, count is not", func(t *testing.T) {
		w := ipvsCoreDNSRollout(t)
		fs, err := newIPVSDetector(t, "IPVSUDPDeadBackend", w.node, func(p any) {
			p.(*IPVSUDPDeadBackendParams).MaxClients = 1
		}).Detect(context.Background())
		ipvsCheckResult(t, fs, err, []string{"ipvs-conn/UDP/10.244.0.12:53"}, "")
		if fs[0].Evidence["clientCount"] != 2 || len(fs[0].Evidence["clients"].([]string)) != 1 {
			t.Errorf("evidence = %v", fs[0].Evidence)
		}
	})
	t.Run("IPVS unavailable", func(t *testing.T) {
		w := ipvsCoreDNSRollout(t)
		w.ipvs.SetUnavailable("no ip_vs module")
		_, err := newIPVSDetector(t, "IPVSUDPDeadBackend", w.node, nil).Detect(context.Background())
		ipvsCheckResult(t, nil, err, nil, "IPVS unavailable")
	})
}

func TestIPVSUDPTimeoutHigh(t *testing.T) {
	w := newIPVSWorld(t)
	d := newIPVSDetector(t, "IPVSUDPTimeoutHigh", w.node, nil)
	fs, err := d.Detect(context.Background())
	ipvsCheckResult(t, fs, err, []string{ipvs.TimeoutsTarget}, "")
	if fs[0].Evidence["udpTimeoutSeconds"] != 300 || fs[0].Evidence["ceilingSeconds"] != 60 {
		t.Errorf("evidence = %v", fs[0].Evidence)
	}
	if err := w.ipvs.SetTimeouts(context.Background(), ipvs.Timeouts{UDP: 60 * time.Second}); err != nil {
		t.Fatal(err)
	}
	fs, err = d.Detect(context.Background())
	ipvsCheckResult(t, fs, err, nil, "")
	if got := d.(Judged).Judged(); got != "IPVS UDP timeout 1m0s (ceiling 1m0s)" {
		t.Errorf("judged %q", got)
	}
	// The timeout detector does not need the cluster view.
	w.node.Cluster = nil
	if _, err := d.Detect(context.Background()); err != nil {
		t.Fatal(err)
	}
	w.ipvs.SetUnavailable("no ip_vs module")
	_, err = d.Detect(context.Background())
	ipvsCheckResult(t, nil, err, nil, "IPVS unavailable")

	typ, _ := Lookup("IPVSUDPTimeoutHigh")
	p := typ.NewParams().(*IPVSUDPTimeoutHighParams)
	p.Ceiling.Duration = 500 * time.Millisecond
	if errs := p.Validate(); len(errs) != 1 || errs[0].Field != "ceiling" {
		t.Fatalf("errs = %+v", errs)
	}
}

// BenchmarkIPVSDetectorsLargeNode runs the view-comparing IPVS detectors
// over 2000 Services (4000 virtual servers, 3 real servers each, 20000 UDP
// connection entries) on the fake: the cost of the desired-state
// computation and the comparison per cycle (the fake's linear lookups of a
// virtual server are a large part of it; the real adapter asks the kernel
// by key).
func BenchmarkIPVSDetectorsLargeNode(b *testing.B) {
	w := newIPVSWorld(b)
	for i := 0; i < 2000; i++ {
		cip := netip.AddrFrom4([4]byte{10, 96, byte(i >> 8), byte(i)})
		svc := cluster.Service{Namespace: "ns", Name: fmt.Sprintf("svc-%d", i), ClusterIPs: []string{cip.String()},
			Ports: []cluster.ServicePort{{Name: "dns", Protocol: "UDP", Port: 53}, {Name: "http", Protocol: "TCP", Port: 80}}}
		var eps []cluster.Endpoint
		for j := 0; j < 3; j++ {
			pod := netip.AddrFrom4([4]byte{10, 244, byte(i >> 4), byte(i<<4 | j)}).String()
			eps = append(eps, tEP(pod, 53, "UDP", "dns", true, true, false), tEP(pod, 8080, "TCP", "http", true, true, false))
		}
		w.view.SetService(svc, eps...)
		for _, p := range []struct {
			proto     string
			port, tgt uint16
		}{{"UDP", 53, 53}, {"TCP", 80, 8080}} {
			v := ipvs.VirtualServer{Address: cip, Protocol: p.proto, Port: p.port}
			if err := w.ipvs.AddVirtualServer(v); err != nil {
				b.Fatal(err)
			}
			for _, e := range eps[:3] {
				_ = w.ipvs.AddRealServer(v, ipvs.RealServer{Address: netip.MustParseAddr(e.Address), Port: p.tgt, Weight: 1})
			}
		}
		for c := 0; c < 10; c++ {
			w.ipvs.AddConn(ipvs.Conn{Protocol: "UDP", Client: netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, 0, byte(c), byte(i)}), 40000),
				Virtual: netip.AddrPortFrom(cip, 53), Dest: netip.AddrPortFrom(netip.MustParseAddr(eps[0].Address), 53), State: "UDP"})
		}
	}
	var dets []Detector
	for _, name := range []string{"IPVSStaleRealServer", "IPVSStaleVirtualServer", "IPVSMissingVirtualServer", "IPVSUDPDeadBackend"} {
		typ, _ := Lookup(name)
		d, err := typ.New(typ.NewParams(), w.node)
		if err != nil {
			b.Fatal(err)
		}
		dets = append(dets, d)
	}
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		for _, d := range dets {
			fs, err := d.Detect(context.Background())
			if err != nil || len(fs) != 0 {
				b.Fatalf("%d findings, %v", len(fs), err)
			}
		}
	}
}

// frozenKubeProxy answers nothing until the request's context ends, like
// a kube-proxy stopped with SIGSTOP whose listener still accepts.
type frozenKubeProxy struct{ *kubeproxy.Fake }

func (frozenKubeProxy) ProxyMode(ctx context.Context) (kubeproxy.Mode, error) {
	<-ctx.Done()
	return "", ctx.Err()
}

// TestIPVSFrozenKubeProxyFallsBack: a frozen kube-proxy must not use up the
// detector's time (found by the real kube-proxy frozen in the VM lane,
// TestVMKubeProxyIPVS): /proxyMode gets at most half of what is left, then
// kube-ipvs0 decides, within the deadline.
func TestIPVSFrozenKubeProxyFallsBack(t *testing.T) {
	w := ipvsCoreDNSRollout(t)
	w.node.KubeProxy = frozenKubeProxy{kubeproxy.NewFake(nil, 30*time.Second)}
	ctx, cancel := context.WithTimeout(context.Background(), 600*time.Millisecond)
	defer cancel()
	start := time.Now()
	fs, err := newIPVSDetector(t, "IPVSStaleRealServer", w.node, nil).Detect(ctx)
	if took := time.Since(start); took > 550*time.Millisecond {
		t.Fatalf("Detect took %v of a 600ms deadline", took)
	}
	ipvsCheckResult(t, fs, err, []string{"ipvs-rs/UDP/10.96.0.10:53/10.244.0.12:53"}, "")
}
