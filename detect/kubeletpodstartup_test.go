package detect

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	clocktesting "k8s.io/utils/clock/testing"

	"github.com/remediate-dev/remediate/internal/causes"
	"github.com/remediate-dev/remediate/internal/finding"
	"github.com/remediate-dev/remediate/internal/kubelet"
	"github.com/remediate-dev/remediate/internal/node"
)

// podStartBuckets are kubelet_pod_start_sli_duration_seconds' bounds
// (k8s.io/kubernetes pkg/kubelet/metrics/metrics.go, v1.34).
var podStartBuckets = []float64{0.5, 1, 2, 3, 4, 5, 6, 8, 10, 20, 30, 45, 60, 120, 180, 240, 300, 360, 480, 600, 900, 1200, 1800, 2700, 3600}

// kubeletBody is the real kubelet v1.34.4 capture (no sandbox error and no
// pod start observed yet), plus the error counter when errs >= 0 and the
// pod-start SLI histogram of the starts given (seconds), as the kubelet
// exposes them once observed.
func kubeletBody(t *testing.T, errs float64, starts []float64) kubelet.Metrics {
	t.Helper()
	b, err := os.ReadFile("../internal/kubelet/testdata/kubelet-metrics-v1.34.4.txt")
	if err != nil {
		t.Fatal(err)
	}
	var s strings.Builder
	s.Write(b)
	if errs >= 0 {
		fmt.Fprintf(&s, "# HELP kubelet_run_podsandbox_errors_total [ALPHA] Cumulative number of the run_podsandbox operation errors by RuntimeClass.Handler.\n# TYPE kubelet_run_podsandbox_errors_total counter\nkubelet_run_podsandbox_errors_total{runtime_handler=\"\"} %g\n", errs)
	}
	if starts != nil {
		s.WriteString("# HELP kubelet_pod_start_sli_duration_seconds [BETA] Duration in seconds to start a pod, excluding time to pull images and run init containers, measured from pod creation timestamp to when all its containers are reported as started and observed via watch\n# TYPE kubelet_pod_start_sli_duration_seconds histogram\n")
		sum := 0.0
		for _, le := range podStartBuckets {
			n := 0
			for _, v := range starts {
				if v <= le {
					n++
				}
			}
			fmt.Fprintf(&s, "kubelet_pod_start_sli_duration_seconds_bucket{le=\"%g\"} %d\n", le, n)
		}
		for _, v := range starts {
			sum += v
		}
		fmt.Fprintf(&s, "kubelet_pod_start_sli_duration_seconds_bucket{le=\"+Inf\"} %d\nkubelet_pod_start_sli_duration_seconds_sum %g\nkubelet_pod_start_sli_duration_seconds_count %d\n", len(starts), sum, len(starts))
	}
	m, err := kubelet.ParseMetrics(strings.NewReader(s.String()))
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// TestKubeletPodStartup follows a node through the cases: a fresh kubelet
// (series absent: no verdict, no error), sandbox errors rising past the
// limit (a finding with the CNI configuration's missing plugin as the
// likely cause), a kubelet restart (counters down: the window starts
// again, no finding), and slow pod starts (p99 above 60 s).
func TestKubeletPodStartup(t *testing.T) {
	ctx := context.Background()
	confDir, binDir := t.TempDir(), t.TempDir()
	if err := os.WriteFile(filepath.Join(confDir, "10-bridge.conflist"), []byte(`{"cniVersion":"1.0.0","name":"bridge","plugins":[{"type":"bridge","ipam":{"type":"host-local","ranges":[[{"subnet":"10.244.0.0/24"}]]}},{"type":"portmap","capabilities":{"portMappings":true}}]}`), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(binDir, "portmap"), []byte("#!/bin/sh\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	clk := clocktesting.NewFakeClock(time.Date(2026, 11, 26, 0, 0, 0, 0, time.UTC))
	kl := &kubelet.Fake{Now: clk.Now}
	n := &node.Node{Name: "node1", Clock: clk, CNIConfDir: confDir, CNIBinDir: binDir, Kubelet: kl, Unavailable: map[string]string{}}
	d := newIssue3Detector(t, "KubeletPodStartup", n, nil)
	step := func(what string, errs float64, starts []float64) []finding.Finding {
		t.Helper()
		kl.Set(kubeletBody(t, errs, starts))
		clk.Step(time.Minute)
		fs, err := d.Detect(ctx)
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		return fs
	}
	if fs := step("fresh node", -1, nil); len(fs) != 0 {
		t.Fatalf("first scrape: %+v", fs)
	}
	if fs := step("still fresh", -1, nil); len(fs) != 0 {
		t.Fatalf("absent series: %+v", fs)
	}
	if j := d.(Judged).Judged(); !strings.Contains(j, "0 sandbox errors, 0 pod starts") {
		t.Errorf("judged %q", j)
	}
	if fs := step("two errors", 2, nil); len(fs) != 0 {
		t.Fatalf("2 errors (limit 2): %+v", fs)
	}
	fs := step("seven errors", 7, nil)
	if len(fs) != 1 || fs[0].Target != KubeletSandboxErrorsTarget || fs[0].Evidence["sandboxErrors"] != 7.0 {
		t.Fatalf("7 errors: %+v", fs)
	}
	likely, _ := fs[0].Evidence[causes.EvidenceLikely].([]causes.Cause)
	if len(likely) == 0 || likely[0].Kind != causes.CNIConfigBroken || !strings.Contains(fs[0].Message, "likely cause: CNI configuration 10-bridge.conflist names plugins missing from "+binDir+": bridge") {
		t.Fatalf("likely causes %+v; message %q", likely, fs[0].Message)
	}
	if fs := step("kubelet restarted", 1, nil); len(fs) != 0 {
		t.Fatalf("after a restart (counter 7 -> 1): %+v", fs)
	}
	if fs := step("one more after the restart", 2, nil); len(fs) != 0 {
		t.Fatalf("1 error since the restart: %+v", fs)
	}
	// Slow starts: three pods at 70, 75 and 200 s.
	fs = step("slow starts", 2, []float64{70, 75, 200})
	if len(fs) != 1 || fs[0].Target != KubeletPodStartTarget || !strings.Contains(fs[0].Message, "pod start p99 of the 3 pods") {
		t.Fatalf("slow starts: %+v", fs)
	}
	// The window moves on: those starts leave it, fast ones come.
	for i := 0; i < 11; i++ {
		step("quiet", 2, []float64{70, 75, 200, 1, 1, 2})
	}
	if fs := step("fast starts", 2, []float64{70, 75, 200, 1, 1, 2, 1}); len(fs) != 0 {
		t.Fatalf("the slow starts left the window: %+v", fs)
	}
}

// TestKubeletPodStartupSkips: no adapter, and a refused scrape, are skips
// with the reason (not errors: the rule's state stays as it was).
func TestKubeletPodStartupSkips(t *testing.T) {
	n := &node.Node{Name: "node1", Clock: clocktesting.NewFakeClock(time.Now()), Unavailable: map[string]string{"kubelet": "no cluster access: not running in a pod"}}
	d := newIssue3Detector(t, "KubeletPodStartup", n, nil)
	if _, err := d.Detect(context.Background()); err == nil {
		t.Fatal("no adapter: no skip")
	} else if why, ok := finding.IsSkip(err); !ok || !strings.Contains(why, "not running in a pod") {
		t.Fatalf("no adapter: %v", err)
	}
	kl := &kubelet.Fake{}
	kl.Fail(&kubelet.Error{Kind: kubelet.KindForbidden, URL: "https://10.0.0.7:10250/metrics", Err: fmt.Errorf("HTTP 403: Forbidden")})
	n.Kubelet = kl
	d = newIssue3Detector(t, "KubeletPodStartup", n, nil)
	if _, err := d.Detect(context.Background()); err == nil {
		t.Fatal("forbidden: no skip")
	} else if why, ok := finding.IsSkip(err); !ok || !strings.Contains(why, "nodes/metrics") {
		t.Fatalf("forbidden: %v", err)
	}
}

// TestKubeletDelta: the decision's arithmetic on counter resets and
// absent histograms.
func TestKubeletDelta(t *testing.T) {
	if _, ok := kubeletDelta(kubeletSample{errors: 5}, kubeletSample{errors: 1}); ok {
		t.Error("a counter that went down is a restart")
	}
	h := kubeletBody(t, -1, []float64{3}).PodStartSLI
	if inc, ok := kubeletDelta(kubeletSample{}, kubeletSample{start: *h}); !ok || inc.start.Count != 1 {
		t.Errorf("absent then present: %+v %v", inc, ok)
	}
	if _, ok := kubeletDelta(kubeletSample{start: *h}, kubeletSample{}); ok {
		t.Error("present then absent is a restart")
	}
}
