//go:build linux

package detect

import (
	"context"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/remediate-dev/remediate/internal/kubeproxy"
	"github.com/remediate-dev/remediate/internal/nftables"
	"github.com/remediate-dev/remediate/internal/testing/vm"
)

// TestVMModeLeftoversIPVS: kube-proxy says iptables (then
// nftables) mode while the real kernel still holds IPVS mode's virtual
// servers on Service addresses and kube-ipvs0 (the shared lab's): one
// finding naming them, the real adapter read; a virtual server outside
// the Service ranges (keepalived's) is only counted.
func TestVMModeLeftoversIPVS(t *testing.T) {
	w := newVMWorld(t) // kube-dns and kubernetes virtual servers, kube-ipvs0
	vm.IPVSService(t, "TCP", netip.MustParseAddrPort("192.168.77.7:80"), netip.AddrPortFrom(w.b1.V4, 5353))
	kp := kubeproxy.NewFake(nil, 30*time.Second)
	w.node.KubeProxy = kp
	w.node.NFTables = nftables.NewFake()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	for _, mode := range []kubeproxy.Mode{kubeproxy.ModeIPTables, kubeproxy.ModeNFTables} {
		kp.SetMode(mode, nil)
		fs, err := newDetector(t, "KubeProxyModeLeftovers", w.node, func(p any) {
			p.(*KubeProxyModeLeftoversParams).Backends = []string{"legacy"}
		}).Detect(ctx)
		if err != nil && mode == kubeproxy.ModeIPTables {
			t.Fatalf("%s mode: %v", mode, err)
		}
		found := false
		for _, f := range fs {
			if f.Target != "ipvs/kube-proxy-leftovers" {
				continue
			}
			found = true
			ev := f.Evidence
			shown := strings.Join(ev["shown"].([]string), ",")
			if ev["kubeIPVS0"] != true || ev["otherVirtualServers"] != 1 ||
				!strings.Contains(shown, "TCP/10.96.0.1:443") || !strings.Contains(shown, "UDP/10.96.0.10:53") {
				t.Fatalf("%s mode: evidence %v", mode, ev)
			}
			t.Logf("%s mode: %s: %s", mode, f.Target, f.Message)
		}
		if !found {
			t.Fatalf("%s mode: no IPVS leftover finding in %+v (err %v)", mode, fs, err)
		}
	}
}
