//go:build linux

package action

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

// TestIPVSActionsOnRealKernelWithoutIPVS runs every IPVS action, with the
// real adapter, in a network namespace of this kernel, which has no ip_vs
// module: each must refuse with "IPVS unavailable" and none may report
// success. The cluster view is a fresh fake that would allow the deletes.
func TestIPVSActionsOnRealKernelWithoutIPVS(t *testing.T) {
	if _, err := os.Stat("/proc/net/ip_vs"); err == nil {
		t.Skip("ip_vs is loaded on this kernel; this test covers kernels without it")
	}
	name := netnstest.New(t)
	real := ipvs.New(ipvs.Options{ProcRoot: "/proc", NetNSPath: "/var/run/netns/" + name})
	defer real.Close(context.Background())

	w := newIPVSActWorld(t) // fresh view; its fake IPVS is replaced by the real adapter
	w.node.IPVS = real
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()

	for _, c := range []struct {
		action  string
		finding finding.Finding
	}{
		{"SetIPVSTimeouts", finding.Finding{Detector: "IPVSUDPTimeoutHigh", Target: "ipvs/timeouts"}},
		{"DeleteIPVSRealServer", rsFinding(dnsUDPVS, "10.244.0.12")},
		{"DeleteIPVSVirtualServer", vsFinding("TCP", "10.96.5.5", 80)},
	} {
		a := newIPVSAction(t, c.action, w.node, nil)
		p, err := a.Plan(ctx, c.finding)
		if reason, ok := finding.IsSkip(err); !ok || !strings.HasPrefix(reason, "IPVS unavailable: ") {
			t.Errorf("%s Plan = %+v, %v; want a skip saying IPVS unavailable", c.action, p, err)
		}
		res, err := a.Execute(ctx, c.finding)
		reason, ok := finding.IsSkip(err)
		if !ok || !strings.HasPrefix(reason, "IPVS unavailable: ") {
			t.Errorf("%s Execute = %+v, %v; want a skip saying IPVS unavailable", c.action, res, err)
		}
		if res.Summary != "" || res.Details != nil {
			t.Errorf("%s claimed a result: %+v", c.action, res)
		}
		t.Logf("%s: %s", c.action, reason)
	}
}
