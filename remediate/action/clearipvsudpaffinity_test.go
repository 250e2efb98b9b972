package action

import (
	"context"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/remediate-dev/remediate/detect"
	"github.com/remediate-dev/remediate/internal/cluster"
	"github.com/remediate-dev/remediate/internal/finding"
	"github.com/remediate-dev/remediate/internal/ipvs"
)

// affinityWorld is newIPVSActWorld (10.244.0.12 left kube-dns but is still
// a UDP real server) plus two DNS clients pinned to it, one to a live pod,
// and expire_nodest_conn under a fixture proc root.
func affinityWorld(t *testing.T, nodest string) *ipvsActWorld {
	w := newIPVSActWorld(t)
	w.node.ProcRoot = t.TempDir()
	dir := filepath.Join(w.node.ProcRoot, "sys", "net", "ipv4", "vs")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "expire_nodest_conn"), []byte(nodest+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	conn := func(client, dest string) ipvs.Conn {
		return ipvs.Conn{Protocol: ipvs.UDP, Client: netip.MustParseAddrPort(client), Virtual: netip.MustParseAddrPort("10.96.0.10:53"),
			Dest: netip.MustParseAddrPort(dest), State: "UDP", Expires: 290e9}
	}
	w.ipvs.AddConn(conn("10.0.0.5:54177", "10.244.0.12:53"), conn("10.0.0.6:40001", "10.244.0.12:53"), conn("10.0.0.7:40002", "10.244.1.21:53"))
	return w
}

func nodestValue(t *testing.T, w *ipvsActWorld) string {
	b, err := os.ReadFile(filepath.Join(w.node.ProcRoot, "sys", "net", "ipv4", "vs", "expire_nodest_conn"))
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(b))
}

func deadBackendFinding(ip string, port int) finding.Finding {
	return withRefs(finding.Finding{Detector: "IPVSUDPDeadBackend", Target: detect.DeadBackendTarget("UDP", netip.AddrPortFrom(netip.MustParseAddr(ip), uint16(port))),
		Evidence: map[string]any{"backendIP": ip, "backendPort": port, "protocol": "UDP"}})
}

func TestClearIPVSUDPAffinity(t *testing.T) {
	ctx := context.Background()
	f := deadBackendFinding("10.244.0.12", 53)

	w := affinityWorld(t, "0")
	a := newIPVSAction(t, ClearIPVSUDPAffinityName, w.node, nil)
	p, err := a.Plan(ctx, f)
	if err != nil {
		t.Fatal(err)
	}
	want := "delete real server 10.244.0.12:53 from UDP/10.96.0.10:53 and set net.ipv4.vs.expire_nodest_conn 0 -> 1: 2 UDP entries of kube-system/kube-dns pinned to 10.244.0.12:53 (not-an-endpoint) expire on their next packet"
	if p.Summary != want {
		t.Fatalf("plan\n%s\nwant\n%s", p.Summary, want)
	}
	if !hasRS(t, w, dnsUDPVS, "10.244.0.12") || nodestValue(t, w) != "0" {
		t.Fatal("Plan changed something")
	}
	res, err := a.Execute(ctx, f)
	if err != nil {
		t.Fatal(err)
	}
	if hasRS(t, w, dnsUDPVS, "10.244.0.12") || !hasRS(t, w, dnsTCPVS, "10.244.0.12") || nodestValue(t, w) != "1" {
		t.Fatalf("after Execute: UDP rs present %v, TCP rs present %v (must stay: TCP is not this finding's), nodest %s",
			hasRS(t, w, dnsUDPVS, "10.244.0.12"), hasRS(t, w, dnsTCPVS, "10.244.0.12"), nodestValue(t, w))
	}
	d := res.Details
	if d["previousExpireNodestConn"] != "0" || d["pinnedEntries"] != 2 ||
		strings.Join(d["restoreCommands"].([]string), "; ") != "sysctl -w net.ipv4.vs.expire_nodest_conn=0; ipvsadm -a -u 10.96.0.10:53 -r 10.244.0.12:53 -m -w 1" ||
		strings.Join(d["deletedFrom"].([]string), ",") != "UDP/10.96.0.10:53" {
		t.Errorf("details %v", d)
	}
	// Done: the real server is gone and the sysctl is 1.
	_, err = newIPVSAction(t, ClearIPVSUDPAffinityName, w.node, nil).Execute(ctx, f)
	wantSkip(t, err, "expire on their next packet")

	// Only the sysctl is missing.
	w = affinityWorld(t, "0")
	if err := w.ipvs.DeleteRealServer(ctx, dnsUDPVS, ipvsRS("10.244.0.12", 1, 0)); err != nil {
		t.Fatal(err)
	}
	res, err = newIPVSAction(t, ClearIPVSUDPAffinityName, w.node, nil).Execute(ctx, f)
	if err != nil || !strings.HasPrefix(res.Summary, "set net.ipv4.vs.expire_nodest_conn 0 -> 1: 2 UDP entries") || nodestValue(t, w) != "1" {
		t.Fatalf("sysctl only: %+v, %v", res, err)
	}
}

func TestClearIPVSUDPAffinityRefusals(t *testing.T) {
	ctx := context.Background()
	f := deadBackendFinding("10.244.0.12", 53)
	cases := []struct {
		name  string
		setup func(w *ipvsActWorld) *ipvsActWorld
		set   func(p any)
		f     finding.Finding
		want  string
	}{
		{name: "view not synced", setup: func(w *ipvsActWorld) *ipvsActWorld {
			w.view.SetFreshness(cluster.Freshness{Connected: true})
			return w
		}, want: "not synced"},
		{name: "backend is expected again", setup: func(w *ipvsActWorld) *ipvsActWorld {
			w.view.SetEndpoints("kube-system", "kube-dns", ipvsEP("10.244.0.12", "UDP", "dns", true, true, false), ipvsEP("10.244.1.21", "UDP", "dns", true, true, false))
			return w
		}, want: "not dead"},
		{name: "backend terminating but serving", setup: func(w *ipvsActWorld) *ipvsActWorld {
			w.view.SetEndpoints("kube-system", "kube-dns", ipvsEP("10.244.0.12", "UDP", "dns", false, true, true), ipvsEP("10.244.1.21", "UDP", "dns", true, true, false))
			return w
		}, want: "not dead"},
		{name: "view has no endpoints", setup: func(w *ipvsActWorld) *ipvsActWorld {
			w.view.SetEndpoints("kube-system", "kube-dns")
			return w
		}, want: "no endpoints at all"},
		{name: "no entries pinned to a live backend's finding", f: deadBackendFinding("10.244.9.9", 53), want: "any more"},
		{name: "setExpireNodestConn false", set: func(p any) { p.(*ClearIPVSUDPAffinityParams).SetExpireNodestConn = false }, want: "frees no client"},
		{name: "unexpected sysctl value", setup: func(w *ipvsActWorld) *ipvsActWorld { return affinityWorld(t, "2") }, want: `is "2"`},
		{name: "TCP finding", f: withRefs(finding.Finding{Target: "x", Evidence: map[string]any{"backendIP": "10.244.0.12", "backendPort": 53, "protocol": "TCP"}}), want: "not UDP"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			w := affinityWorld(t, "0")
			if c.setup != nil {
				w = c.setup(w)
			}
			ff := f
			if c.f.Target != "" {
				ff = c.f
			}
			a := newIPVSAction(t, ClearIPVSUDPAffinityName, w.node, c.set)
			_, err := a.Plan(ctx, ff)
			wantSkip(t, err, c.want)
			_, err = a.Execute(ctx, ff)
			wantSkip(t, err, c.want)
			if !hasRS(t, w, dnsUDPVS, "10.244.0.12") || (nodestValue(t, w) != "0" && nodestValue(t, w) != "2") {
				t.Fatal("a refusal changed something")
			}
		})
	}
	// A finding without a backend reference is an error, not a skip.
	w := affinityWorld(t, "0")
	if _, err := newIPVSAction(t, ClearIPVSUDPAffinityName, w.node, nil).Execute(ctx, finding.Finding{Target: "x", Evidence: map[string]any{}}); err == nil {
		t.Fatal("no evidence accepted")
	} else if _, skip := finding.IsSkip(err); skip {
		t.Fatalf("malformed finding must fail: %v", err)
	}
	// A backend without a port would name every port of the pod: refused
	// as an error (the detector always gives the port).
	if _, err := newIPVSAction(t, ClearIPVSUDPAffinityName, w.node, nil).Execute(ctx, withRefs(finding.Finding{Target: "x", Evidence: map[string]any{"backendIP": "10.244.0.12", "protocol": "UDP"}})); err == nil || !strings.Contains(err.Error(), "no backend port") {
		t.Fatalf("no port: %v", err)
	}
	if !hasRS(t, w, dnsUDPVS, "10.244.0.12") || nodestValue(t, w) != "0" {
		t.Fatal("a refused finding changed something")
	}
	// maxPerCycle: one real server per window across findings.
	w = affinityWorld(t, "1")
	a := newIPVSAction(t, ClearIPVSUDPAffinityName, w.node, nil)
	if _, err := a.Execute(ctx, f); err != nil {
		t.Fatal(err)
	}
	if err := w.ipvs.AddRealServer(dnsUDPVS, ipvsRS("10.244.0.12", 1, 0)); err != nil {
		t.Fatal(err)
	}
	_, err := a.Execute(ctx, f)
	wantSkip(t, err, "maxPerCycle 1")
}
