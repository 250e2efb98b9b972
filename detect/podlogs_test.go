package detect

import (
	"bytes"
	"compress/gzip"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/remediate-dev/remediate/internal/causes"
	"github.com/remediate-dev/remediate/internal/cluster"
	"github.com/remediate-dev/remediate/internal/cluster/clustertest"
	"github.com/remediate-dev/remediate/internal/finding"
	"github.com/remediate-dev/remediate/internal/kubeproxy"
	"github.com/remediate-dev/remediate/internal/node"
	"github.com/remediate-dev/remediate/internal/podlogs"
)

// kpLogSource is the kube-proxy pod's container of podLogsNode.
var kpLogSource = podlogs.Source{Namespace: "kube-system", Pod: "kube-proxy-7xk2p", UID: "5d1c-kp", Container: "kube-proxy"}

// podLogsNode adds to n a pod view with kube-proxy's DaemonSet pod, a fake
// pod log reader, and a /proc whose kernel was built without xt_nfacct
// (config.gz) and lists no nfacct match.
func podLogsNode(t *testing.T, n *node.Node) *podlogs.Fake {
	t.Helper()
	pods := clustertest.NewPods(n.Clock.Now())
	pods.Set(cluster.Pod{Namespace: "kube-system", Name: "kube-proxy-7xk2p", UID: "5d1c-kp", Labels: map[string]string{"k8s-app": "kube-proxy"},
		ControllerKind: "DaemonSet", ControllerName: "kube-proxy", Containers: []cluster.ContainerStatus{{Name: "kube-proxy"}}})
	n.Pods = pods
	proc := t.TempDir()
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(os.MkdirAll(filepath.Join(proc, "net"), 0o755))
	must(os.WriteFile(filepath.Join(proc, "net", "ip_tables_matches"), []byte("comment\nmark\nconntrack\n"), 0o644))
	must(os.WriteFile(filepath.Join(proc, "modules"), []byte("x_tables 1 0 - Live 0x0\n"), 0o644))
	var gz bytes.Buffer
	w := gzip.NewWriter(&gz)
	w.Write([]byte("CONFIG_NETFILTER_NETLINK_ACCT=y\n# CONFIG_NETFILTER_XT_MATCH_NFACCT is not set\n"))
	w.Close()
	must(os.WriteFile(filepath.Join(proc, "config.gz"), gz.Bytes(), 0o644))
	n.ProcRoot = proc
	n.Unavailable = map[string]string{node.SubsystemHostRoot: "test"}
	f := &podlogs.Fake{}
	n.PodLogs = f
	return f
}

// TestRestoreFailuresCauseFromLog: a restore failure's top likely cause is
// the line kube-proxy logged (kubernetes/kubernetes#142068), quoted, with
// the kernel's answer: built without xt_nfacct.
func TestRestoreFailuresCauseFromLog(t *testing.T) {
	n, s, clk := newKPNode(t, 10*time.Second, time.Unix(1_800_000_000, 0))
	logs := podLogsNode(t, n)
	logs.Append(kpLogSource,
		podlogs.Line{Time: clk.Now().Add(-time.Minute), Stream: "stderr", Text: `E0115 08:00:00.000000       1 proxier.go:1544] "Failed to execute iptables-restore" err=<`},
		podlogs.Line{Time: clk.Now().Add(-time.Minute), Stream: "stderr", Text: "\tiptables-restore v1.8.9 (nf_tables): Couldn't load match `nfacct':No such file or directory"},
		podlogs.Line{Time: clk.Now().Add(-time.Hour), Stream: "stderr", Text: "\tAnother app is currently holding the xtables lock. Stopped waiting after 5s."}, // out of the window
	)
	d := newDetector(t, "KubeProxyRestoreFailures", n, nil)
	var fs []finding.Finding
	for _, failures := range []float64{0, 2} {
		s.set(func(s *kpServer) {
			s.metrics = metricsText(true, 0, map[kubeproxy.Family]famSample{"IPv4": {lastSync: 1, lastQueued: 1, failures: failures}})
		})
		var err error
		if fs, err = d.Detect(context.Background()); err != nil {
			t.Fatal(err)
		}
		clk.Step(10 * time.Second)
	}
	if len(fs) != 1 {
		t.Fatalf("findings %+v", fs)
	}
	top, _ := fs[0].Evidence[causes.EvidenceTop].(string)
	for _, want := range []string{"Couldn't load match `nfacct'", "xt_nfacct missing", "CONFIG_NETFILTER_XT_MATCH_NFACCT", "lacks it", "kube-proxy pod kube-system/kube-proxy-7xk2p"} {
		if !strings.Contains(top, want) {
			t.Errorf("top cause %q lacks %q", top, want)
		}
	}
	likely, _ := fs[0].Evidence[causes.EvidenceLikely].([]causes.Cause)
	if len(likely) != 1 {
		t.Errorf("likely %+v: the lock line of an hour ago is outside the window", likely)
	}
}

// TestXtablesLockMessagesRate: lock messages past field guide 3's one a
// minute are a warning quoting the newest; under it, none.
func TestXtablesLockMessagesRate(t *testing.T) {
	n, _, clk := newKPNode(t, 10*time.Second, time.Unix(1_800_000_000, 0))
	logs := podLogsNode(t, n)
	d := newDetector(t, "XtablesLockMessages", n, nil)
	add := func(k int) {
		for i := 0; i < k; i++ {
			logs.Append(kpLogSource, podlogs.Line{Time: clk.Now().Add(-time.Duration(i) * 10 * time.Second), Stream: "stderr",
				Text: "\tAnother app is currently holding the xtables lock; still 4s 900000us time ahead to have a chance to grab the lock... --token=s3cr3tvalue0123456789"})
		}
	}
	add(4) // 0.8 a minute over 5 minutes
	fs, err := d.Detect(context.Background())
	if err != nil || len(fs) != 0 {
		t.Fatalf("4 lines: %+v %v", fs, err)
	}
	add(4) // 1.6 a minute
	fs, err = d.Detect(context.Background())
	if err != nil || len(fs) != 1 {
		t.Fatalf("8 lines: %+v %v", fs, err)
	}
	f := fs[0]
	if f.Target != "kube-proxy" || !strings.Contains(f.Message, "holding the xtables lock") || strings.Contains(f.Message, "s3cr3tvalue") || f.Evidence["lines"] != 8 {
		t.Errorf("finding %+v", f)
	}
	// A CNI agent's log is read too; its finding targets the agent.
	calico := podlogs.Source{Namespace: "calico-system", Pod: "calico-node-q8z", UID: "c4-uid", Container: "calico-node"}
	n.Pods.(*clustertest.Pods).Set(cluster.Pod{Namespace: "calico-system", Name: "calico-node-q8z", UID: "c4-uid", Labels: map[string]string{"k8s-app": "calico-node"},
		ControllerKind: "DaemonSet", ControllerName: "calico-node", Containers: []cluster.ContainerStatus{{Name: "install-cni", Init: true}, {Name: "calico-node"}}})
	for i := 0; i < 20; i++ {
		logs.Append(calico, podlogs.Line{Time: clk.Now().Add(-time.Duration(i) * 5 * time.Second), Stream: "stdout",
			Text: "2026-11-29 06:30:00.000 [WARNING][77] felix/table.go 1200: iptables-legacy-restore failed: Another app is currently holding the xtables lock. Stopped waiting after 5s."})
	}
	fs, err = d.Detect(context.Background())
	if err != nil || len(fs) != 2 {
		t.Fatalf("with calico-node: %+v %v", fs, err)
	}
	var targets []string
	for _, f := range fs {
		targets = append(targets, f.Target)
	}
	if !strings.Contains(strings.Join(targets, " "), "node-agent/calico-system/calico-node") {
		t.Errorf("targets %v: want calico-node's", targets)
	}
	n.PodLogs = nil
	if _, err := d.Detect(context.Background()); err == nil {
		t.Error("no pod logs: want a skip")
	}
}
