//go:build linux

package detect

import (
	"context"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/remediate-dev/remediate/internal/finding"
	"github.com/remediate-dev/remediate/internal/ipvs"
	"github.com/remediate-dev/remediate/internal/netnstest"
)

// TestIPVSDetectorsOnRealKernelWithoutIPVS runs every IPVS detector with the
// real adapter in a network namespace of this kernel (no ip_vs): each skips
// with "IPVS unavailable", none reports a finding or "healthy".
func TestIPVSDetectorsOnRealKernelWithoutIPVS(t *testing.T) {
	if _, err := os.Stat("/proc/net/ip_vs"); err == nil {
		t.Skip("ip_vs is loaded on this kernel; this test covers kernels without it")
	}
	name := netnstest.New(t)
	real := ipvs.New(ipvs.Options{ProcRoot: "/proc", NetNSPath: "/var/run/netns/" + name})
	defer real.Close(context.Background())
	w := ipvsCoreDNSRollout(t)
	w.node.IPVS = real
	w.node.ProcRoot = "/proc" // the real one: no kube-ipvs0 here either
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	for _, typ := range []string{"IPVSStaleRealServer", "IPVSStaleVirtualServer", "IPVSMissingVirtualServer", "IPVSUDPDeadBackend", "IPVSUDPTimeoutHigh"} {
		// With and without the kube-proxy mode check, the adapter's
		// availability check answers first: it is the root cause.
		for _, require := range []bool{true, false} {
			fs, err := newIPVSDetector(t, typ, w.node, func(p any) { setRequireIPVSMode(p, require) }).Detect(ctx)
			reason, ok := finding.IsSkip(err)
			if !ok || !strings.HasPrefix(reason, "IPVS unavailable: ") || len(fs) != 0 {
				t.Errorf("%s (requireIPVSMode %v): %v, %v; want a skip saying IPVS unavailable", typ, require, fs, err)
			}
		}
	}
}

func setRequireIPVSMode(p any, v bool) {
	switch x := p.(type) {
	case *IPVSStaleRealServerParams:
		x.RequireIPVSMode = v
	case *IPVSStaleVirtualServerParams:
		x.RequireIPVSMode = v
	case *IPVSMissingVirtualServerParams:
		x.RequireIPVSMode = v
	case *IPVSUDPDeadBackendParams:
		x.RequireIPVSMode = v
	case *IPVSUDPTimeoutHighParams:
		x.RequireIPVSMode = v
	}
}
