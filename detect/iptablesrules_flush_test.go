package detect

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/remediate-dev/remediate/internal/finding"
	"github.com/remediate-dev/remediate/internal/iptables"
	"github.com/remediate-dev/remediate/internal/kubeproxy"
)

// syncedMetrics is kube-proxy v1.34's /metrics with IPv4 programmed at t.
func syncedMetrics(t time.Time) string {
	return "# TYPE kubeproxy_sync_proxy_rules_last_timestamp_seconds gauge\n" +
		`kubeproxy_sync_proxy_rules_last_timestamp_seconds{ip_family="IPv4"} ` + formatUnix(t) + "\n"
}

func formatUnix(t time.Time) string { return strconv.FormatInt(t.Unix(), 10) }

// TestIPTablesRulesFlushed: a firewall flush (every KUBE-* chain gone from
// both backends) while kube-proxy says it runs in iptables mode and its
// metrics say it programmed IPv4 is one critical finding with how long the
// chains have been absent; it is gone once they are back. A node without
// kube-proxy (mode from the policy, never seen), kube-proxy that has not
// synced yet, kube-proxy unreachable (its mode unknown: it may have been
// removed, cleaning up after itself), a mode only from the policy, or a
// save that failed is never reported.
func TestIPTablesRulesFlushed(t *testing.T) {
	healthy := healthyRules(t)
	flushed := "*nat\n:PREROUTING ACCEPT [0:0]\n:OUTPUT ACCEPT [0:0]\n:POSTROUTING ACCEPT [0:0]\nCOMMIT\n*filter\n:INPUT ACCEPT [0:0]\n:FORWARD ACCEPT [0:0]\n:OUTPUT ACCEPT [0:0]\nCOMMIT\n"
	type step struct {
		legacy, nft string
		mode        kubeproxy.Mode
		modeErr     bool
		synced      bool
		nftErr      bool
		advance     time.Duration
		want        bool
		wantAbsent  float64
	}
	cases := []struct {
		name       string
		policyMode string
		steps      []step
	}{
		{name: "flushed after kube-proxy programmed: critical, then cleared", policyMode: "auto", steps: []step{
			{legacy: flushed, nft: flushed, mode: kubeproxy.ModeIPTables, synced: true, want: true, wantAbsent: 0},
			{legacy: flushed, nft: flushed, mode: kubeproxy.ModeIPTables, synced: true, advance: 30 * time.Second, want: true, wantAbsent: 30},
			{legacy: healthy, nft: emptyNFT, mode: kubeproxy.ModeIPTables, synced: true, advance: 30 * time.Second},
		}},
		{name: "ipvs mode too", policyMode: "auto", steps: []step{
			{legacy: flushed, nft: "", mode: kubeproxy.ModeIPVS, synced: true, want: true},
		}},
		{name: "kube-proxy not synced yet: not reported", policyMode: "auto", steps: []step{
			{legacy: flushed, nft: "", mode: kubeproxy.ModeIPTables},
		}},
		{name: "no kube-proxy, mode from the policy: never reported", policyMode: "iptables", steps: []step{
			{legacy: "", nft: ""},
			{legacy: "", nft: "", advance: time.Minute},
		}},
		{name: "seen, then flushed while kube-proxy is unreachable", policyMode: "auto", steps: []step{
			{legacy: healthy, nft: "", modeErr: true},
			{legacy: flushed, nft: flushed, modeErr: true, advance: 30 * time.Second},
		}},
		{name: "seen, then emptied, mode from the policy: kube-proxy may be gone, not reported", policyMode: "iptables", steps: []step{
			{legacy: healthy, nft: ""},
			{legacy: flushed, nft: flushed, advance: 30 * time.Second},
		}},
		{name: "a failed save judges nothing", policyMode: "auto", steps: []step{
			{legacy: flushed, nft: flushed, nftErr: true, mode: kubeproxy.ModeIPTables, synced: true},
		}},
		{name: "nftables mode skips the detector", policyMode: "auto", steps: []step{
			{legacy: flushed, nft: flushed, mode: kubeproxy.ModeNFTables, synced: true},
		}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			f := iptables.NewFake()
			n, clk := newIssue3Node(nil)
			n.IPTables = f
			kp := kubeproxy.NewFake(n.Clock, 30*time.Second)
			n.KubeProxy = kp
			d := newIssue3Detector(t, "IPTablesRules", n, func(p any) {
				pp := p.(*IPTablesRulesParams)
				pp.Families, pp.ProxyMode, pp.MaxSaveDutyCycle = []string{"IPv4"}, c.policyMode, 0
			})
			for i, s := range c.steps {
				clk.Step(s.advance)
				f.SetRules(iptables.IPv4, iptables.Legacy, s.legacy)
				f.SetRules(iptables.IPv4, iptables.NFT, s.nft)
				if s.nftErr {
					f.SetError(iptables.IPv4, iptables.NFT, context.Canceled)
				} else {
					f.SetError(iptables.IPv4, iptables.NFT, nil)
				}
				if s.modeErr {
					kp.SetMode("", context.DeadlineExceeded)
				} else {
					kp.SetMode(s.mode, nil)
				}
				if s.synced {
					kp.SetMetrics(syncedMetrics(clk.Now().Add(-time.Hour)))
				} else {
					kp.SetMetrics("")
				}
				got, err := d.Detect(context.Background())
				if _, skip := finding.IsSkip(err); err != nil && !skip && !s.nftErr {
					t.Fatalf("step %d: %v", i, err)
				}
				var flush *finding.Finding
				for j := range got {
					if got[j].Target == "iptables/IPv4/kube-chains-absent" {
						flush = &got[j]
					}
				}
				if (flush != nil) != s.want {
					t.Fatalf("step %d: flush finding %v, want %v (all: %v)", i, flush, s.want, findingTargets(got))
				}
				if flush == nil {
					continue
				}
				if flush.Severity != finding.Critical || !strings.Contains(flush.Message, "no backend has its nat KUBE-SERVICES chain") || !strings.Contains(flush.Message, "hostPort") {
					t.Errorf("step %d: %s %s", i, flush.Severity, flush.Message)
				}
				if flush.Evidence["absentSeconds"] != s.wantAbsent && !(c.policyMode == "iptables") {
					t.Errorf("step %d: absentSeconds %v, want %v", i, flush.Evidence["absentSeconds"], s.wantAbsent)
				}
			}
		})
	}
}
