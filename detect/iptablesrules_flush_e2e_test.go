package detect

import (
	"context"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"
	"k8s.io/utils/clock"

	"github.com/remediate-dev/remediate/internal/finding"
	"github.com/remediate-dev/remediate/internal/iptables"
	"github.com/remediate-dev/remediate/internal/kubeproxy"
	"github.com/remediate-dev/remediate/internal/node"
	"github.com/remediate-dev/remediate/internal/testing/controlplane"
)

// TestE2EIPTablesFlushed: the real kube-proxy v1.34.4 in iptables mode on
// the real apiserver programs a Service; then the node's firewall is
// flushed as firewalld's reload with FlushAllOnReload does (every table of
// both backends flushed and its chains deleted, rancher/rke2#10469).
// IPTablesRules, asking kube-proxy its mode and reading its metrics, reports
// the critical kube-chains-absent finding (before: nothing, the node looked
// kube-proxy-free), with the time the chains have been absent growing; once
// kube-proxy notices through its canary and resyncs, the finding is gone.
func TestE2EIPTablesFlushed(t *testing.T) {
	cp := controlplane.Shared(t)
	ns := cp.Namespace("flush-e2e")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	const syncPeriod = 10 * time.Second
	kp := cp.StartKubeProxy(controlplane.KubeProxyOptions{SyncPeriod: syncPeriod})
	createService(ctx, t, cp, ns, "web", 2)

	save := func() string {
		cmd := cp.NetNS.Command("iptables-legacy-save", "-t", "nat")
		cmd.Env = kp.Env()
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("iptables-legacy-save: %v: %s", err, out)
		}
		return string(out)
	}
	deadline := time.Now().Add(60 * time.Second)
	for !strings.Contains(save(), ns+"/web") {
		if time.Now().After(deadline) {
			t.Fatalf("kube-proxy did not program %s/web in 60s:\n%s", ns, save())
		}
		time.Sleep(500 * time.Millisecond)
	}

	ipt := iptables.New(iptables.Config{Prefix: []string{"ip", "netns", "exec", cp.NetNS.Name}})
	client := kp.Client(kubeproxy.Options{SyncPeriod: syncPeriod, Timeout: 2 * time.Second, CacheTTL: time.Second})
	n := &node.Node{Name: kp.NodeName, Clock: clock.RealClock{}, Log: zap.NewNop(), IPTables: ipt, KubeProxy: client}
	d := newDetector(t, "IPTablesRules", n, func(p any) {
		pp := p.(*IPTablesRulesParams)
		pp.Families, pp.Backends, pp.ProxyMode, pp.MaxSaveDutyCycle = []string{"IPv4"}, []string{"legacy", "nft"}, "auto", 0
	})
	const target = "iptables/IPv4/kube-chains-absent"
	flushFinding := func() *finding.Finding {
		t.Helper()
		fs, err := d.Detect(ctx)
		if err != nil {
			t.Fatal(err)
		}
		for i := range fs {
			if fs[i].Target == target {
				return &fs[i]
			}
		}
		return nil
	}
	if f := flushFinding(); f != nil {
		t.Fatalf("kube-proxy's own rules: %s", f.Message)
	}

	// firewalld's flush, in both backends: every rule of every table, then
	// every user chain.
	for _, prog := range []string{"iptables-legacy", "iptables-nft"} {
		for _, table := range []string{"raw", "mangle", "nat", "filter"} {
			for _, op := range []string{"-F", "-X"} {
				cmd := cp.NetNS.Command(prog, "-w", "5", "-t", table, op)
				cmd.Env = kp.Env()
				if out, err := cmd.CombinedOutput(); err != nil && prog == "iptables-legacy" {
					t.Fatalf("%s -t %s %s: %v: %s", prog, table, op, err, out)
				}
			}
		}
	}
	flushed := time.Now()
	f := flushFinding()
	if f == nil {
		// kube-proxy may already have noticed (its canary is checked every
		// syncPeriod): only then is no finding right.
		if strings.Contains(save(), "KUBE-SERVICES") {
			t.Skip("kube-proxy resynced before the first detection; the flush window was missed")
		}
		t.Fatal("no finding after the flush")
	}
	if f.Severity != finding.Critical || f.Evidence["proxyModeSource"] != "from kube-proxy /proxyMode" || f.Evidence["kubeProxyLastSync"] == nil {
		t.Errorf("finding %s %v: %s", f.Severity, f.Evidence, f.Message)
	}
	t.Logf("found %v after the flush: %s", time.Since(flushed).Round(time.Millisecond), f.Message)

	// kube-proxy notices (its KUBE-PROXY-CANARY chains are gone) and
	// resyncs: the finding clears.
	for {
		f := flushFinding()
		if f == nil {
			break
		}
		if time.Since(flushed) > 6*syncPeriod {
			t.Fatalf("still %s after %v: %s", target, time.Since(flushed).Round(time.Second), f.Message)
		}
		time.Sleep(time.Second)
	}
	t.Logf("cleared %v after the flush, when kube-proxy resynced", time.Since(flushed).Round(time.Second))
	// kube-proxy recreates its chains first, then its full sync programs
	// the Service.
	for !strings.Contains(save(), ns+"/web") {
		if time.Since(flushed) > 8*syncPeriod {
			t.Fatalf("the finding cleared but %s/web is not programmed %v after the flush", ns, time.Since(flushed).Round(time.Second))
		}
		time.Sleep(500 * time.Millisecond)
	}
}
